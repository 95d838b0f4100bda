#include "meta/manifest.h"

#include <xxhash.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "origin/origin.h"

namespace ember::meta {
namespace {

constexpr uint64_t kProgressEvery = 4096;

rpc::FileEntry::Type TypeOf(origin::OriginEntry::Type t) {
  switch (t) {
    case origin::OriginEntry::Type::kFile:
      return rpc::FileEntry::FILE;
    case origin::OriginEntry::Type::kDir:
      return rpc::FileEntry::DIR;
    case origin::OriginEntry::Type::kSymlink:
      return rpc::FileEntry::SYMLINK;
  }
  return rpc::FileEntry::UNKNOWN;
}

// Numbers the entries of an origin's walk (ids in walk order, root = 1), links each to its
// parent, counts them, fingerprints them and hands them to the sink. Holds the ids of the
// directories from the root to the current entry, never the tree.
class Numberer {
 public:
  Numberer(const EntrySink& sink, const ScanProgress& progress)
      : sink_(sink), progress_(progress) {}

  // Returns: Ok; Internal if the walk is not in pre-order (an entry outside the open
  // directories); the sink's error.
  absl::Status Add(const origin::OriginEntry& o) {
    rpc::FileEntry e;
    e.set_file_id(next_id_++);
    if (!o.path.empty() || !open_dirs_.empty()) {
      size_t slash = o.path.rfind('/');
      std::string_view parent = slash == std::string::npos
                                    ? std::string_view()
                                    : std::string_view(o.path).substr(0, slash);
      while (!open_dirs_.empty() && open_dirs_.back().first != parent) open_dirs_.pop_back();
      if (open_dirs_.empty()) {
        return absl::InternalError(
            absl::StrCat("origin walk out of order: '", o.path, "' after its folder's entries"));
      }
      e.set_parent_id(open_dirs_.back().second);
      e.set_name(slash == std::string::npos ? o.path : o.path.substr(slash + 1));
    }
    e.set_type(TypeOf(o.type));
    e.set_mode(o.mode);
    e.set_uid(o.uid);
    e.set_gid(o.gid);
    e.set_mtime_ns(o.mtime_ns);
    e.set_size(o.size);
    e.set_link_target(o.link_target);
    e.set_etag(o.etag);
    if (e.type() == rpc::FileEntry::DIR) open_dirs_.emplace_back(o.path, e.file_id());

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
    fingerprint_.Add(e, o.path);
    RETURN_IF_ERROR(sink_(e, o.path));
    if (progress_ && stats_.entries % kProgressEvery == 0) progress_(stats_);
    return absl::OkStatus();
  }

  ScanStats Finish(const origin::WalkStats& walked) {
    stats_.skipped = walked.skipped;
    stats_.fingerprint = fingerprint_.Value();
    stats_.max_file_id = next_id_ - 1;
    return stats_;
  }

 private:
  const EntrySink& sink_;
  const ScanProgress& progress_;
  uint64_t next_id_ = 1;
  std::vector<std::pair<std::string, uint64_t>> open_dirs_;  // (path, file id), root first
  ScanStats stats_;
  Fingerprint fingerprint_;
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

absl::StatusOr<ScanStats> ScanOrigin(const std::string& origin_uri, const EntrySink& sink,
                                     const ScanProgress& progress) {
  std::unique_ptr<origin::Origin> source = origin::NewOriginRouter();
  return ScanOrigin(*source, origin_uri, sink, progress);
}

absl::StatusOr<ScanStats> ScanOrigin(origin::Origin& source, const std::string& origin_uri,
                                     const EntrySink& sink, const ScanProgress& progress) {
  Numberer numberer(sink, progress);
  absl::Status numbered;  // the first error of the numbering or the sink: returned as it is
  absl::StatusOr<origin::WalkStats> walked = source.Walk(
      origin_uri,
      [&](const origin::OriginEntry& e) {
        numbered = numberer.Add(e);
        return numbered;
      },
      [&](uint64_t objects, uint64_t bytes) {
        if (!progress) return;
        ScanStats listed;
        listed.entries = objects;
        listed.bytes = bytes;
        progress(listed);
      });
  if (!numbered.ok()) return numbered;
  // The origin's server being down or silent is not meta being down: say which.
  if (absl::IsUnavailable(walked.status()) || absl::IsDeadlineExceeded(walked.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("origin unreachable: ", walked.status().message()));
  }
  if (!walked.ok()) return walked.status();
  return numberer.Finish(*walked);
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
