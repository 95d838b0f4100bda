// Manifest scanning and diffing.
//
// A manifest is every directory, regular file and symlink under a dataset's origin, with size,
// mode, mtime (ns) and link target. ScanTree walks the origin in sorted pre-order and hands each
// entry to a sink as it goes, so memory stays bounded by the widest directory, not the tree: a
// 1M-file dataset is never held in memory. File ids follow the walk (root = 1), which makes them
// stable for a version and usable as inode numbers. Thread-compatible: no shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "meta/meta.pb.h"

namespace ember::meta {

struct ScanStats {
  uint64_t entries = 0;  // files + dirs + symlinks, root included
  uint64_t files = 0;
  uint64_t dirs = 0;
  uint64_t symlinks = 0;
  uint64_t bytes = 0;
  uint64_t skipped = 0;  // sockets, fifos, devices
  uint64_t fingerprint = 0;
  uint64_t max_file_id = 0;
};

// Receives each entry with its path relative to the root ("" for the root). A non-ok status
// stops the scan and is returned by ScanTree.
using EntrySink = std::function<absl::Status(const rpc::FileEntry& entry, std::string_view path)>;
using ScanProgress = std::function<void(const ScanStats&)>;

// Returns: the totals, or NotFound / PermissionDenied / FailedPrecondition naming the path that
// could not be read (a manifest is never partial). `progress` is called every few thousand
// entries.
absl::StatusOr<ScanStats> ScanTree(const std::string& root, const EntrySink& sink,
                                   const ScanProgress& progress = {});

// An object of a remote origin (S3 key or HTTP file) relative to the dataset root.
struct RemoteObject {
  std::string path;  // "a/b/c.jpg"
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string etag;
};

// The walk ScanTree makes, from a flat listing: directories from the key prefixes, sorted
// pre-order, file ids in walk order. Returns FailedPrecondition if a name is both an object and
// a folder.
absl::StatusOr<ScanStats> ScanObjects(std::vector<RemoteObject> objects, const EntrySink& sink,
                                      const ScanProgress& progress = {});

// Accepts "/abs/dir" or "file:///abs/dir" (checked here), or a remote origin "s3://bucket/prefix",
// "http(s)://host/path" (returned without a trailing slash, checked by listing it); returns the
// absolute directory path without a trailing slash. Returns: InvalidArgument (relative, other
// scheme), NotFound, FailedPrecondition (not a directory).
absl::StatusOr<std::string> NormalizeOrigin(std::string_view origin);

// Incremental XXH3 fingerprint of a manifest in walk order.
class Fingerprint {
 public:
  Fingerprint();
  ~Fingerprint();
  Fingerprint(const Fingerprint&) = delete;
  Fingerprint& operator=(const Fingerprint&) = delete;
  void Add(const rpc::FileEntry& entry, std::string_view path);
  uint64_t Value() const;

 private:
  void* state_;  // XXH3_state_t
};

struct DiffCounts {
  uint64_t added = 0;
  uint64_t removed = 0;
  uint64_t modified = 0;
  bool operator==(const DiffCounts&) const = default;
};

// Pulls the next (path, entry) of a manifest in ComparePaths order; false at the end.
using EntryStream = std::function<bool(std::string* path, rpc::FileEntry* entry)>;

// One merge pass over two manifests (old, new). Modified: same path, other type, size, mode,
// mtime or link target.
DiffCounts DiffManifests(const EntryStream& old_stream, const EntryStream& new_stream);

}  // namespace ember::meta
