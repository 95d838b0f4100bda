// Manifest building and diffing.
//
// A manifest is every directory, regular file and symlink under a dataset's origin, with size,
// mode, owner, mtime (ns), link target and ETag. The origin walks its tree (origin::Origin::Walk:
// sorted pre-order, root first); ScanOrigin numbers the entries in walk order (root = 1), links
// each to its parent, counts and fingerprints them and hands each to a sink as it goes, so memory
// stays bounded by the origin's walk, not the tree: a 1M-file dataset is never held in memory
// here. File ids are stable for a version and usable as inode numbers. Thread-compatible: no
// shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "meta/meta.pb.h"
#include "origin/origin.h"

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
// stops the scan and is returned by ScanOrigin.
using EntrySink = std::function<absl::Status(const rpc::FileEntry& entry, std::string_view path)>;
// Called every few thousand entries, and while a remote origin is listed (every 1000 objects:
// entries and bytes listed so far).
using ScanProgress = std::function<void(const ScanStats&)>;

// Scans the origin at `origin_uri` (a directory, s3:// or http(s)://; see origin::NormalizeOrigin)
// into the sink. Returns: the totals, or NotFound / PermissionDenied / FailedPrecondition naming
// what could not be read (a manifest is never partial); FailedPrecondition "origin unreachable"
// when a remote origin's server is down or stalled; InvalidArgument for a malformed URI; or the
// sink's first error, unchanged.
absl::StatusOr<ScanStats> ScanOrigin(const std::string& origin_uri, const EntrySink& sink,
                                     const ScanProgress& progress = {});
// The same through an origin the caller holds (tests: a fake one).
absl::StatusOr<ScanStats> ScanOrigin(origin::Origin& source, const std::string& origin_uri,
                                     const EntrySink& sink, const ScanProgress& progress = {});

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
