#include "meta/manifest.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/ids.h"
#include "common/status.h"

namespace ember::meta {
namespace {

constexpr int kMaxDepth = 512;
constexpr uint64_t kProgressEvery = 4096;

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

// Numbers entries in walk order, counts them, fingerprints them and hands them to the sink.
class Emitter {
 public:
  Emitter(const EntrySink& sink, const ScanProgress& progress) : sink_(sink), progress_(progress) {}

  absl::Status Emit(const rpc::FileEntry& e, std::string_view path) {
    stats_.entries++;
    switch (e.type()) {
      case rpc::FileEntry::FILE:
        stats_.files++;
        stats_.bytes += e.size();
        break;
      case rpc::FileEntry::DIR:
        stats_.dirs++;
        break;
      case rpc::FileEntry::SYMLINK:
        stats_.symlinks++;
        break;
      default:
        break;
    }
    fingerprint_.Add(e, path);
    RETURN_IF_ERROR(sink_(e, path));
    if (progress_ && stats_.entries % kProgressEvery == 0) progress_(stats_);
    return absl::OkStatus();
  }

  uint64_t NextId() { return next_id_++; }
  ScanStats Finish() {
    stats_.fingerprint = fingerprint_.Value();
    stats_.max_file_id = next_id_ - 1;
    return stats_;
  }

 protected:
  const EntrySink& sink_;
  const ScanProgress& progress_;
  uint64_t next_id_ = 1;
  ScanStats stats_;
  Fingerprint fingerprint_;
};

class Walker : public Emitter {
 public:
  Walker(const std::string& root, const EntrySink& sink, const ScanProgress& progress)
      : Emitter(sink, progress), root_(root) {}

  absl::StatusOr<ScanStats> Run() {
    int fd = open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "cannot open origin", root_);
    struct stat st;
    if (fstat(fd, &st) != 0) {
      int err = errno;
      close(fd);
      return ErrnoStatus(err, "cannot stat origin", root_);
    }
    rpc::FileEntry root;
    root.set_file_id(NextId());
    root.set_parent_id(0);
    root.set_type(rpc::FileEntry::DIR);
    Fill(st, &root);
    absl::Status s = Emit(root, "");
    if (s.ok())
      s = WalkDir(fd, root.file_id(), "", 0);  // takes ownership of fd
    else
      close(fd);
    RETURN_IF_ERROR(s);
    return Finish();
  }

 private:
  static void Fill(const struct stat& st, rpc::FileEntry* e) {
    e->set_mode(st.st_mode);
    e->set_uid(st.st_uid);
    e->set_gid(st.st_gid);
    e->set_mtime_ns(static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec);
    if (S_ISREG(st.st_mode)) e->set_size(st.st_size);
  }

  // Walks the directory open at `dirfd` (closed on return) whose entry id is `dir_id`.
  absl::Status WalkDir(int dirfd, uint64_t dir_id, const std::string& dir_path, int depth) {
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
      std::string path = dir_path.empty() ? name : absl::StrCat(dir_path, "/", name);
      struct stat st;
      if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        result = ErrnoStatus(errno, "cannot stat", absl::StrCat(root_, "/", path));
        break;
      }
      rpc::FileEntry e;
      e.set_parent_id(dir_id);
      e.set_name(name);
      Fill(st, &e);
      if (S_ISREG(st.st_mode)) {
        e.set_type(rpc::FileEntry::FILE);
      } else if (S_ISDIR(st.st_mode)) {
        e.set_type(rpc::FileEntry::DIR);
      } else if (S_ISLNK(st.st_mode)) {
        e.set_type(rpc::FileEntry::SYMLINK);
        std::string target(st.st_size > 0 ? st.st_size + 1 : 4096, '\0');
        ssize_t n = readlinkat(dirfd, name.c_str(), target.data(), target.size());
        if (n < 0) {
          result = ErrnoStatus(errno, "cannot read link", absl::StrCat(root_, "/", path));
          break;
        }
        target.resize(n);
        e.set_link_target(target);
        e.set_size(n);
      } else {
        stats_.skipped++;
        continue;
      }
      e.set_file_id(NextId());
      result = Emit(e, path);
      if (!result.ok()) break;
      if (e.type() == rpc::FileEntry::DIR) {
        int child = openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (child < 0) {
          result = ErrnoStatus(errno, "cannot open directory", absl::StrCat(root_, "/", path));
          break;
        }
        result = WalkDir(child, e.file_id(), path, depth + 1);
        if (!result.ok()) break;
      }
    }
    closedir(dir);
    return result;
  }

  const std::string& root_;
};

bool SameContent(const rpc::FileEntry& a, const rpc::FileEntry& b) {
  return a.type() == b.type() && a.size() == b.size() && a.mode() == b.mode() &&
         a.mtime_ns() == b.mtime_ns() && a.link_target() == b.link_target() && a.uid() == b.uid() &&
         a.gid() == b.gid() && a.etag() == b.etag();
}

}  // namespace

Fingerprint::Fingerprint() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Fingerprint::~Fingerprint() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Fingerprint::Add(const rpc::FileEntry& e, std::string_view path) {
  auto* st = static_cast<XXH3_state_t*>(state_);
  struct {
    uint64_t type, size, mode, owner;
    int64_t mtime;
    uint64_t path_len, target_len;
  } fixed{static_cast<uint64_t>(e.type()),
          e.size(),
          e.mode(),
          (static_cast<uint64_t>(e.uid()) << 32) | e.gid(),
          e.mtime_ns(),
          path.size(),
          e.link_target().size()};
  XXH3_64bits_update(st, &fixed, sizeof(fixed));
  XXH3_64bits_update(st, path.data(), path.size());
  XXH3_64bits_update(st, e.link_target().data(), e.link_target().size());
  // Remote objects: a new ETag is new content even at the same size and time.
  if (!e.etag().empty()) XXH3_64bits_update(st, e.etag().data(), e.etag().size());
}

uint64_t Fingerprint::Value() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

absl::StatusOr<ScanStats> ScanTree(const std::string& root, const EntrySink& sink,
                                   const ScanProgress& progress) {
  Walker w(root, sink, progress);
  return w.Run();
}

absl::StatusOr<ScanStats> ScanObjects(std::vector<RemoteObject> objects, const EntrySink& sink,
                                      const ScanProgress& progress) {
  // A flat listing becomes the same walk as a directory tree: directories are the key prefixes,
  // children sorted by name, pre-order. Objects are files (mode 0444, owner root).
  struct Dir {
    std::map<std::string, Dir> dirs;
    std::map<std::string, const RemoteObject*> files;
  };
  Dir root;
  for (const RemoteObject& o : objects) {
    Dir* d = &root;
    std::vector<std::string> parts = absl::StrSplit(o.path, '/');
    for (size_t i = 0; i + 1 < parts.size(); i++) d = &d->dirs[parts[i]];
    const std::string& name = parts.back();
    if (d->dirs.count(name)) {
      return absl::FailedPreconditionError(
          absl::StrCat("origin has both an object and a folder named '", o.path, "'"));
    }
    d->files[name] = &o;
  }
  Emitter em(sink, progress);
  std::function<absl::Status(const Dir&, uint64_t, const std::string&)> walk =
      [&](const Dir& d, uint64_t id, const std::string& path) -> absl::Status {
    // Merge folders and files in name order (a name is one or the other: checked above).
    auto di = d.dirs.begin();
    auto fi = d.files.begin();
    while (di != d.dirs.end() || fi != d.files.end()) {
      bool dir = fi == d.files.end() || (di != d.dirs.end() && di->first < fi->first);
      const std::string& name = dir ? di->first : fi->first;
      if (!dir && d.dirs.count(name)) {
        return absl::FailedPreconditionError(
            absl::StrCat("origin has both an object and a folder named '", path, name, "'"));
      }
      std::string child = path.empty() ? name : absl::StrCat(path, "/", name);
      rpc::FileEntry e;
      e.set_file_id(em.NextId());
      e.set_parent_id(id);
      e.set_name(name);
      if (dir) {
        e.set_type(rpc::FileEntry::DIR);
        e.set_mode(S_IFDIR | 0555);
        RETURN_IF_ERROR(em.Emit(e, child));
        RETURN_IF_ERROR(walk(di->second, e.file_id(), child));
        ++di;
      } else {
        const RemoteObject& o = *fi->second;
        e.set_type(rpc::FileEntry::FILE);
        e.set_mode(S_IFREG | 0444);
        e.set_size(o.size);
        e.set_mtime_ns(o.mtime_ns);
        e.set_etag(o.etag);
        RETURN_IF_ERROR(em.Emit(e, child));
        ++fi;
      }
    }
    return absl::OkStatus();
  };
  rpc::FileEntry top;
  top.set_file_id(em.NextId());
  top.set_type(rpc::FileEntry::DIR);
  top.set_mode(S_IFDIR | 0555);
  RETURN_IF_ERROR(em.Emit(top, ""));
  RETURN_IF_ERROR(walk(root, top.file_id(), ""));
  return em.Finish();
}

absl::StatusOr<std::string> NormalizeOrigin(std::string_view origin) {
  std::string path(origin);
  if (absl::StartsWith(path, "s3://") || absl::StartsWith(path, "http://") ||
      absl::StartsWith(path, "https://")) {
    // Remote: checked by listing it (meta) and by every read (nodes).
    while (path.size() > 1 && path.back() == '/' && path.find("://") + 3 < path.size() - 1) {
      path.pop_back();
    }
    if (path.find("://") + 3 >= path.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("origin '", path, "' names no bucket or host"));
    }
    return path;
  }
  if (absl::StartsWith(path, "file://")) path = path.substr(7);
  if (path.find("://") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "origin '", std::string(origin),
        "' has an unsupported scheme; use an absolute path, file:///path, s3://bucket/prefix or "
        "http(s)://host/path/"));
  }
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("origin '", std::string(origin), "' must be an absolute directory path"));
  }
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "origin", path);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("origin '", path, "' is not a directory"));
  }
  return path;
}

DiffCounts DiffManifests(const EntryStream& old_stream, const EntryStream& new_stream) {
  DiffCounts d;
  std::string op, np;
  rpc::FileEntry oe, ne;
  bool has_old = old_stream(&op, &oe);
  bool has_new = new_stream(&np, &ne);
  while (has_old || has_new) {
    int c = !has_old ? 1 : !has_new ? -1 : ComparePaths(op, np);
    if (c < 0) {
      d.removed++;
      has_old = old_stream(&op, &oe);
    } else if (c > 0) {
      d.added++;
      has_new = new_stream(&np, &ne);
    } else {
      if (!SameContent(oe, ne)) d.modified++;
      has_old = old_stream(&op, &oe);
      has_new = new_stream(&np, &ne);
    }
  }
  return d;
}

}  // namespace ember::meta
