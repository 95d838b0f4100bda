// Which origin a URI names (IsRemoteOrigin, NormalizeOrigin), and the router that serves every
// dataset root through one Origin.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "origin/internal.h"
#include "origin/origin.h"

namespace ember::origin {
namespace {

// POSIX roots go to one POSIX origin; each remote root to its own origin, opened on first use.
// One mutex guards the table of remote origins; it is held while one is opened (no network),
// never during a walk or a read.
class OriginRouter final : public Origin {
 public:
  absl::StatusOr<WalkStats> Walk(const std::string& root, const EntryFn& fn,
                                 const ListProgress& progress) override {
    ASSIGN_OR_RETURN(Origin * o, For(root));
    return o->Walk(root, fn, progress);
  }

  absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) override {
    ASSIGN_OR_RETURN(Origin * o, For(file.root));
    return o->Read(file, offset, len, buf);
  }

  bool ReadsManyAtOnce(const std::string& root) override {
    absl::StatusOr<Origin*> o = For(root);
    return o.ok() && (*o)->ReadsManyAtOnce(root);
  }

  std::vector<absl::Status> ReadMany(std::span<const ReadRequest> reqs) override {
    // One origin's reads together (a batch comes from one dataset); mixed roots one by one.
    const bool one_root = std::all_of(reqs.begin(), reqs.end(), [&](const ReadRequest& r) {
      return r.file->root == reqs.front().file->root;
    });
    if (reqs.empty() || !one_root) return Origin::ReadMany(reqs);
    absl::StatusOr<Origin*> o = For(reqs.front().file->root);
    if (!o.ok()) return std::vector<absl::Status>(reqs.size(), o.status());
    return (*o)->ReadMany(reqs);
  }

 private:
  // Returns: the origin of `root`; OpenRemoteOrigin's errors (not kept: the next call retries).
  absl::StatusOr<Origin*> For(const std::string& root) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!IsRemoteOrigin(root)) return posix_.get();
    absl::MutexLock lock(&mu_);
    auto& slot = remote_[root];
    if (slot == nullptr) {
      auto opened = OpenRemoteOrigin(root);
      if (!opened.ok()) return opened.status();
      slot = std::move(*opened);
    }
    return slot.get();
  }

  const std::unique_ptr<Origin> posix_ = NewPosixOrigin();
  absl::Mutex mu_;
  // Origins are never removed: a pointer handed out stays valid for the router's life.
  std::map<std::string, std::unique_ptr<Origin>> remote_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

bool IsRemoteOrigin(std::string_view uri) {
  return uri.starts_with("s3://") || uri.starts_with("http://") || uri.starts_with("https://");
}

std::unique_ptr<Origin> NewOriginRouter() { return std::make_unique<OriginRouter>(); }

absl::StatusOr<std::string> NormalizeOrigin(std::string_view origin) {
  std::string path(origin);
  if (IsRemoteOrigin(path)) {
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

}  // namespace ember::origin
