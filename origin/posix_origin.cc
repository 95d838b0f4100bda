// The POSIX origin: reads files below a directory, and walks the directory tree.
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "origin/internal.h"
#include "origin/origin.h"

namespace ember::origin {
namespace {

constexpr int kMaxDepth = 512;

bool HasDotDot(const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (path.compare(start, end - start, "..") == 0) return true;
    start = end + 1;
  }
  return false;
}

// The origin roots, kept open (O_PATH) between reads: a small file's read costs no open and
// close of its root. A root replaced since it was opened (a directory renamed over it) is
// opened again when a file is not found beneath the one held; files still found beneath the
// old one are checked against the manifest (size, mtime) and their checksums like any other.
class RootDirs {
 public:
  // Returns: root's fd (held while the pointer lives; `fresh`: opened anew), or null with errno.
  std::shared_ptr<const int> Get(const std::string& root, bool fresh) {
    if (!fresh) {
      absl::MutexLock lock(&mu_);
      if (auto it = fds_.find(root); it != fds_.end()) return it->second;
    }
    int dir = open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return nullptr;
    std::shared_ptr<const int> fd(new int(dir), [](const int* p) {
      close(*p);
      delete p;
    });
    absl::MutexLock lock(&mu_);
    if (fds_.size() >= kMaxRoots) fds_.clear();  // many datasets: held by their readers only
    fds_[root] = fd;
    return fd;
  }

 private:
  static constexpr size_t kMaxRoots = 1024;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const int>> fds_ ABSL_GUARDED_BY(mu_);
};

// Opens root/rel for reading without following any symlink below root and without leaving it
// (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS): a directory swapped for a symlink after the
// scan cannot make a fill read bytes from outside the origin. Kernels without openat2 (< 5.6)
// fall back to O_NOFOLLOW on the last component. Returns an fd or -1 with errno.
int OpenBeneath(const std::string& root, const std::string& rel) {
  static std::atomic<bool> have_openat2{true};
  static RootDirs* const roots = new RootDirs;
  if (have_openat2.load(std::memory_order_relaxed)) {
    struct open_how how {};
    how.flags = O_RDONLY | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    for (int attempt = 0; attempt < 2; attempt++) {
      std::shared_ptr<const int> dir = roots->Get(root, attempt > 0);
      if (dir == nullptr) return -1;
      int fd = static_cast<int>(syscall(SYS_openat2, *dir, rel.c_str(), &how, sizeof(how)));
      if (fd >= 0) return fd;
      const int err = errno;
      if (err == ENOSYS) break;
      if (err != ENOENT || attempt > 0) {
        errno = err;
        return -1;
      }
    }
    have_openat2 = false;  // only ENOSYS leaves the loop
  }
  return open(absl::StrCat(root, "/", rel).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// The sorted pre-order walk of a directory tree, streamed: it holds the names of one directory
// per level, never the tree.
class Walker {
 public:
  Walker(const std::string& root, const EntryFn& fn) : root_(root), fn_(fn) {}

  absl::StatusOr<WalkStats> Run() {
    int fd = open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "cannot open origin", root_);
    struct stat st;
    if (fstat(fd, &st) != 0) {
      int err = errno;
      close(fd);
      return ErrnoStatus(err, "cannot stat origin", root_);
    }
    OriginEntry root;
    root.type = OriginEntry::Type::kDir;
    Fill(st, &root);
    absl::Status s = fn_(root);
    if (s.ok())
      s = WalkDir(fd, "", 0);  // takes ownership of fd
    else
      close(fd);
    if (!s.ok()) return s;
    return stats_;
  }

 private:
  static void Fill(const struct stat& st, OriginEntry* e) {
    e->mode = st.st_mode;
    e->uid = st.st_uid;
    e->gid = st.st_gid;
    e->mtime_ns = MtimeNs(st);
    if (S_ISREG(st.st_mode)) e->size = st.st_size;
  }

  // Walks the directory open at `dirfd` (closed on return) at `dir_path`.
  absl::Status WalkDir(int dirfd, const std::string& dir_path, int depth) {
    std::string shown = dir_path.empty() ? root_ : absl::StrCat(root_, "/", dir_path);
    if (depth > kMaxDepth) {
      close(dirfd);
      return absl::FailedPreconditionError(
          absl::StrCat("directory tree too deep at '", shown, "'"));
    }
    DIR* dir = fdopendir(dirfd);
    if (dir == nullptr) {
      int err = errno;
      close(dirfd);
      return ErrnoStatus(err, "cannot read directory", shown);
    }
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* de = readdir(dir)) {
      if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
      names.emplace_back(de->d_name);
    }
    if (errno != 0) {
      int err = errno;
      closedir(dir);
      return ErrnoStatus(err, "cannot read directory", shown);
    }
    std::sort(names.begin(), names.end());
    absl::Status result = absl::OkStatus();
    for (const std::string& name : names) {
      OriginEntry e;
      e.path = dir_path.empty() ? name : absl::StrCat(dir_path, "/", name);
      struct stat st;
      if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        result = ErrnoStatus(errno, "cannot stat", absl::StrCat(root_, "/", e.path));
        break;
      }
      Fill(st, &e);
      if (S_ISREG(st.st_mode)) {
        e.type = OriginEntry::Type::kFile;
      } else if (S_ISDIR(st.st_mode)) {
        e.type = OriginEntry::Type::kDir;
      } else if (S_ISLNK(st.st_mode)) {
        e.type = OriginEntry::Type::kSymlink;
        std::string target(st.st_size > 0 ? st.st_size + 1 : 4096, '\0');
        ssize_t n = readlinkat(dirfd, name.c_str(), target.data(), target.size());
        if (n < 0) {
          result = ErrnoStatus(errno, "cannot read link", absl::StrCat(root_, "/", e.path));
          break;
        }
        target.resize(n);
        e.link_target = std::move(target);
        e.size = n;
      } else {
        stats_.skipped++;
        continue;
      }
      result = fn_(e);
      if (!result.ok()) break;
      if (e.type == OriginEntry::Type::kDir) {
        int child = openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (child < 0) {
          result = ErrnoStatus(errno, "cannot open directory", absl::StrCat(root_, "/", e.path));
          break;
        }
        result = WalkDir(child, e.path, depth + 1);
        if (!result.ok()) break;
      }
    }
    closedir(dir);
    return result;
  }

  const std::string& root_;
  const EntryFn& fn_;
  WalkStats stats_;
};

class PosixOrigin final : public Origin {
 public:
  absl::StatusOr<WalkStats> Walk(const std::string& root, const EntryFn& fn,
                                 const ListProgress& progress) override {
    return Walker(root, fn).Run();
  }

  absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) override {
    std::string full = absl::StrCat(file.root, "/", file.path);
    if (HasDotDot(file.path)) {
      return absl::InvalidArgumentError(absl::StrCat("path escapes the origin: ", file.path));
    }
    int fd = OpenBeneath(file.root, file.path);
    if (fd < 0) {
      int err = errno;
      std::string msg = absl::StrCat("origin file ", full, ": ",
                                     err == ELOOP || err == EXDEV
                                         ? "a symlink on the way (not followed out of the origin)"
                                         : strerror(err));
      if (err == ELOOP || err == EXDEV) return absl::FailedPreconditionError(msg);
      return err == ENOENT ? absl::NotFoundError(msg) : absl::UnavailableError(msg);
    }
    absl::Status st = ReadFd(fd, full, file, offset, len, buf);
    close(fd);
    return st;
  }

 private:
  static absl::Status ReadFd(int fd, const std::string& full, const OriginFile& file,
                             uint64_t offset, size_t len, char* buf) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
      return absl::UnavailableError(absl::StrCat("origin file ", full, ": ", strerror(errno)));
    }
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != file.size ||
        MtimeNs(st) != file.mtime_ns) {
      return absl::FailedPreconditionError(
          absl::StrCat("origin file ", full, " changed since this dataset version was taken"));
    }
    size_t done = 0;
    while (done < len) {
      ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(absl::StrCat("origin file ", full, ": ", strerror(errno)));
      }
      if (n == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("origin file ", full, " is shorter than its manifest says"));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
};

}  // namespace

absl::Status ErrnoStatus(int err, const std::string& what, const std::string& path) {
  std::string msg = absl::StrCat(what, " '", path, "': ", strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::FailedPreconditionError(msg);
  }
}

std::unique_ptr<Origin> NewPosixOrigin() { return std::make_unique<PosixOrigin>(); }

}  // namespace ember::origin
