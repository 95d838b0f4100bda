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
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/batch_read.h"
#include "common/file_io.h"
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

// Opens root/rel for reading without following any symlink below root and without leaving it
// (`rel` has no ".." components: the caller refuses those): a directory swapped for a symlink
// after the scan cannot make a fill read bytes from outside the origin. One openat2 of the whole
// path with RESOLVE_NO_SYMLINKS (a small file's read is a handful of syscalls; this is one of
// them); when that meets a symlink, which may be in the root's own path (allowed), the root is
// opened and rel resolved beneath it (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS). Kernels without
// openat2 (< 5.6) fall back to O_NOFOLLOW on the last component. The path is resolved for each
// read, no directory fd is kept: an origin is a path, and one moved away or replaced must not
// go on being read through a directory fd that followed it. Returns an fd or -1 with errno.
int OpenBeneath(const std::string& root, const std::string& rel) {
  static std::atomic<bool> have_openat2{true};
  if (have_openat2.load(std::memory_order_relaxed)) {
    struct open_how how {};
    how.flags = O_RDONLY | O_CLOEXEC;
    how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    const std::string full = absl::StrCat(root, "/", rel);
    int fd = static_cast<int>(syscall(SYS_openat2, AT_FDCWD, full.c_str(), &how, sizeof(how)));
    if (fd >= 0 || (errno != ELOOP && errno != ENOSYS)) return fd;
    if (errno == ELOOP) {
      int dir = open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (dir < 0) return -1;
      how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
      fd = static_cast<int>(syscall(SYS_openat2, dir, rel.c_str(), &how, sizeof(how)));
      int err = errno;
      close(dir);
      errno = err;
      return fd;
    }
    have_openat2 = false;
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
    const std::string full = absl::StrCat(file.root, "/", file.path);
    absl::StatusOr<int> fd = OpenChecked(file, full);
    if (!fd.ok()) return fd.status();
    absl::Status st = ReadFd(*fd, full, offset, len, buf);
    close(*fd);
    return st;
  }

  // Every file opened and checked, then all their reads issued at once (BatchPread: one
  // submission, one notify of the disk, one wait), then closed.
  bool ReadsManyAtOnce(const std::string&) override { return true; }

  std::vector<absl::Status> ReadMany(std::span<const ReadRequest> reqs) override {
    std::vector<absl::Status> out(reqs.size());
    std::vector<PreadOp> ops;
    std::vector<size_t> op_of;  // request index of each op
    std::vector<bool> direct;   // per op: read with O_DIRECT
    ops.reserve(reqs.size());
    op_of.reserve(reqs.size());
    // Every file opened in one submission (BatchOpen), then each checked; a file the batch could
    // not open as asked (a symlink on the way, a kernel without openat2) is opened alone.
    std::vector<std::string> fulls(reqs.size());
    std::vector<OpenOp> opens;
    std::vector<size_t> open_of;  // request index of each open
    for (size_t i = 0; i < reqs.size(); i++) {
      const OriginFile& file = *reqs[i].file;
      if (HasDotDot(file.path)) continue;  // refused by OpenChecked below
      fulls[i] = absl::StrCat(file.root, "/", file.path);
      opens.push_back({.path = fulls[i].c_str(),
                       .flags = O_RDONLY | O_CLOEXEC,
                       .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS});
      open_of.push_back(i);
    }
    BatchOpen(opens);
    std::vector<int> opened(reqs.size(), -1);
    for (size_t k = 0; k < opens.size(); k++) opened[open_of[k]] = opens[k].result;
    std::vector<int> to_close;
    to_close.reserve(reqs.size());
    for (size_t i = 0; i < reqs.size(); i++) {
      const ReadRequest& r = reqs[i];
      const OriginFile& file = *r.file;
      const int got = opened[i];
      absl::StatusOr<int> fd = got >= 0 ? CheckOpened(got, file, fulls[i])
                               : got == -ELOOP || got == -ENOSYS || fulls[i].empty()
                                   ? OpenChecked(file, absl::StrCat(file.root, "/", file.path))
                                   : OpenFailed(-got, fulls[i]);
      if (!fd.ok()) {
        out[i] = fd.status();
        continue;
      }
      ops.push_back({.fd = *fd, .offset = r.offset, .len = r.len, .buf = r.buf});
      op_of.push_back(i);
      direct.push_back(TryDirect(r, *fd));
      if (direct.back()) {
        ops.back().len = DirectReadRoom(r.len);
        ops.back().enough = r.len;
      }
    }
    BatchPread(ops);
    for (size_t k = 0; k < ops.size(); k++) {
      const ReadRequest& r = reqs[op_of[k]];
      const OriginFile& file = *r.file;
      if (direct[k]) {
        // Whatever went wrong with the direct read (a file system that takes O_DIRECT but not
        // these reads, say), the bytes are read again through the page cache.
        if (ops[k].result != static_cast<int64_t>(r.len)) {
          const int flags = fcntl(ops[k].fd, F_GETFL);
          const std::string full = absl::StrCat(file.root, "/", file.path);
          out[op_of[k]] = flags >= 0 && fcntl(ops[k].fd, F_SETFL, flags & ~O_DIRECT) == 0
                              ? ReadFd(ops[k].fd, full, r.offset, r.len, r.buf)
                              : absl::UnavailableError(
                                    absl::StrCat("origin file ", full, ": ", strerror(errno)));
        }
        to_close.push_back(ops[k].fd);
        continue;
      }
      if (ops[k].result < 0) {
        out[op_of[k]] =
            absl::UnavailableError(absl::StrCat("origin file ", file.root, "/", file.path, ": ",
                                                strerror(static_cast<int>(-ops[k].result))));
      } else if (static_cast<size_t>(ops[k].result) < ops[k].len) {
        out[op_of[k]] = Shorter(absl::StrCat(file.root, "/", file.path));
      }
      to_close.push_back(ops[k].fd);
    }
    BatchClose(to_close);
    return out;
  }

 private:
  static constexpr size_t kPage = 4096;

  // Whether r is read with O_DIRECT (then set on fd): a read to the file's end, page-aligned,
  // into a buffer with room for whole pages, of a file not all in the page cache (a warm origin
  // is read from memory), on a file system that takes O_DIRECT.
  static bool TryDirect(const ReadRequest& r, int fd) {
    if (r.len < kDirectReadMin || r.offset % kPage != 0 || r.offset + r.len != r.file->size ||
        reinterpret_cast<uintptr_t>(r.buf) % kPage != 0 || r.room < DirectReadRoom(r.len)) {
      return false;
    }
    if (PagesCached(fd, r.offset, r.len).value_or(true)) return false;
    const int flags = fcntl(fd, F_GETFL);
    return flags >= 0 && fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
  }

  static absl::Status Shorter(const std::string& full) {
    return absl::FailedPreconditionError(
        absl::StrCat("origin file ", full, " is shorter than its manifest says"));
  }

  // Opens the file beneath its root and checks it is the manifest's (size, mtime). Returns: the
  // fd; InvalidArgument (a path escaping the root), FailedPrecondition (a symlink on the way,
  // changed), NotFound, Unavailable.
  static absl::StatusOr<int> OpenChecked(const OriginFile& file, const std::string& full) {
    if (HasDotDot(file.path)) {
      return absl::InvalidArgumentError(absl::StrCat("path escapes the origin: ", file.path));
    }
    int fd = OpenBeneath(file.root, file.path);
    if (fd < 0) return OpenFailed(errno, full);
    return CheckOpened(fd, file, full);
  }

  // An open of `full` that failed with errno `err`, as OpenChecked says it.
  static absl::Status OpenFailed(int err, const std::string& full) {
    std::string msg = absl::StrCat("origin file ", full, ": ",
                                   err == ELOOP || err == EXDEV
                                       ? "a symlink on the way (not followed out of the origin)"
                                       : strerror(err));
    if (err == ELOOP || err == EXDEV) return absl::FailedPreconditionError(msg);
    return err == ENOENT ? absl::NotFoundError(msg) : absl::UnavailableError(msg);
  }

  // Checks an opened fd is the manifest's file (size, mtime); closes it if not. Returns: the fd;
  // FailedPrecondition (changed), Unavailable.
  static absl::StatusOr<int> CheckOpened(int fd, const OriginFile& file, const std::string& full) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat("origin file ", full, ": ", strerror(err)));
    }
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != file.size ||
        MtimeNs(st) != file.mtime_ns) {
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("origin file ", full, " changed since this dataset version was taken"));
    }
    return fd;
  }

  static absl::Status ReadFd(int fd, const std::string& full, uint64_t offset, size_t len,
                             char* buf) {
    size_t done = 0;
    while (done < len) {
      ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(absl::StrCat("origin file ", full, ": ", strerror(errno)));
      }
      if (n == 0) return Shorter(full);
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
