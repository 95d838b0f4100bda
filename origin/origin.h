// origin/: where a dataset's bytes and listings come from. The front door of the folder.
//
// Owns: the kinds of origin a dataset can live in (a POSIX directory, an S3-compatible bucket
// prefix `s3://bucket/prefix`, a static HTTP server `http(s)://host/path/` serving nginx's JSON
// directory index); for each, the walk of its tree (what meta builds manifests from) and ranged
// reads (what nodes fill their caches from); the router that picks the origin of a dataset root;
// the HTTP client remote origins speak through (origin/http_client.h); and the origins a
// writable volume is written back to, a directory or an S3 prefix (origin/writable.h).
// Must not touch: meta (file ids, manifests, fingerprints: meta numbers what a walk yields),
// cachefs (caching, FUSE), protobuf messages. Depends on common/ only.
//
// Implementations are thread-safe: one Origin serves every reader of a node at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::origin {

// What the manifest says about the file being read: a fill must match it exactly.
struct OriginFile {
  std::string root;  // the dataset's origin
  std::string path;  // relative to root
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string etag;  // remote origins: the object's ETag in the manifest ("" = not checked)
};

// One entry of an origin's tree: what a walk yields, and what a remote origin's flat listing
// yields for each object (a file).
struct OriginEntry {
  enum class Type { kFile, kDir, kSymlink };
  std::string path;  // relative to the root, "/"-separated; "" is the root itself
  Type type = Type::kFile;
  uint64_t size = 0;  // files: bytes; symlinks: the target's length; directories: 0
  uint32_t mode = 0;  // st_mode, type bits included (objects 0444, synthesized folders 0555)
  uint32_t uid = 0;
  uint32_t gid = 0;
  int64_t mtime_ns = 0;
  std::string etag;         // remote objects: the ETag ("" when the listing has none)
  std::string link_target;  // symlinks
};

// Receives each entry of a walk; a non-ok status stops the walk and is returned by it.
using EntryFn = std::function<absl::Status(const OriginEntry& entry)>;
// Origins that list everything before they can walk (the remote ones) call it every 1000
// objects listed with the objects and bytes so far; a POSIX walk never calls it.
using ListProgress = std::function<void(uint64_t objects, uint64_t bytes)>;

struct WalkStats {
  uint64_t skipped = 0;  // POSIX: sockets, fifos and devices, left out of the walk
};

class Origin {
 public:
  virtual ~Origin() = default;

  // Hands every entry of the tree at `root` (the dataset's origin, as in OriginFile::root; a
  // remote origin is bound to the URI it was opened for) to `fn`, in the order manifests number
  // them: the root first (path ""), then pre-order, the children of each directory sorted by
  // name (bytewise). POSIX: symlinks are entries, never followed; sockets, fifos and devices are
  // skipped and counted; memory is bounded by the widest directory. Remote origins list every
  // object first (`progress`), then walk it as WalkObjects does.
  // Returns: the stats; NotFound (no such directory, bucket or path); PermissionDenied
  // (permissions, credentials); FailedPrecondition (an entry that cannot be read, a tree too
  // deep, a name both an object and a folder, not a JSON index); Unavailable / DeadlineExceeded
  // (server down or stalled); or the first non-ok status of `fn`.
  virtual absl::StatusOr<WalkStats> Walk(const std::string& root, const EntryFn& fn,
                                         const ListProgress& progress) = 0;

  // Reads exactly `len` bytes at `offset` into buf.
  // Returns: Ok; NotFound (file or object gone); FailedPrecondition (changed since the manifest:
  // size, mtime or ETag differ, or it became short); Unavailable (I/O error, server down).
  virtual absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) = 0;

  // One read of ReadMany.
  struct ReadRequest {
    const OriginFile* file = nullptr;
    uint64_t offset = 0;
    size_t len = 0;
    char* buf = nullptr;
    // Bytes buf can take (0: len). A read of a file's end of kDirectReadMin bytes or more into
    // a 4 KiB-aligned buf with room for len rounded up to 4 KiB may be an O_DIRECT read of whole
    // pages (the POSIX origin, for a file not in the page cache: a cache fill reads the origin
    // once, so its pages would be one more copy of the bytes to make, and memory taken from the
    // page cache's other files).
    size_t room = 0;
  };
  // Below this the copy saved is worth less than the disk request of its own each O_DIRECT read
  // makes (and a tiny buffer would be page-aligned for it).
  static constexpr size_t kDirectReadMin = 32u << 10;
  // The room a buffer for a read of `len` bytes needs for it to be read that way: len rounded up
  // to 4 KiB from kDirectReadMin on, else len.
  static constexpr size_t DirectReadRoom(size_t len) {
    return len >= kDirectReadMin ? (len + 4095) / 4096 * 4096 : len;
  }
  // Many reads at once, each as Read (a cold folder of small files: the POSIX origin issues
  // them together, docs/architecture.md; others read one after another, so the first waits for
  // all: ask ReadsManyAtOnce first). Returns: per request, what Read would.
  virtual std::vector<absl::Status> ReadMany(std::span<const ReadRequest> reqs) {
    std::vector<absl::Status> out;
    out.reserve(reqs.size());
    for (const ReadRequest& r : reqs) out.push_back(Read(*r.file, r.offset, r.len, r.buf));
    return out;
  }
  // Whether ReadMany of files under `root` takes about as long as one Read (the reads overlap).
  virtual bool ReadsManyAtOnce(const std::string& root) { return false; }
};

// The walk of a flat listing of objects (files: path, size, mode, mtime, etag as given), as a
// directory tree walks: folders are the key prefixes (mode 0555, owner root, mtime 0), and the
// order is Origin::Walk's. What remote origins walk; tests use it to stand in for one.
// Returns: FailedPrecondition if a name is both an object and a folder; else fn's first error.
absl::StatusOr<WalkStats> WalkObjects(std::vector<OriginEntry> objects, const EntryFn& fn);

// Reads and walks directories (local or mounted); any root.
std::unique_ptr<Origin> NewPosixOrigin();

// s3://, http:// or https://.
bool IsRemoteOrigin(std::string_view uri);

// An S3 or HTTP origin for `uri`. S3 settings come from the environment: AWS_ACCESS_KEY_ID /
// AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else the AWS_PROFILE (or default) profile of
// ~/.aws/credentials; AWS_REGION / AWS_DEFAULT_REGION (us-east-1); EMBER_S3_ENDPOINT or
// AWS_ENDPOINT_URL for S3-compatible stores (path-style addressing).
// Returns: InvalidArgument (malformed URI); FailedPrecondition (no credentials).
absl::StatusOr<std::unique_ptr<Origin>> OpenRemoteOrigin(const std::string& uri);

// One origin for every root: POSIX for directories, and one remote origin per URI root, opened
// on first use and kept. What nodes read through and meta walks through.
std::unique_ptr<Origin> NewOriginRouter();

// Accepts "/abs/dir" or "file:///abs/dir" (checked here: it must be a directory), or a remote
// origin "s3://bucket/prefix", "http(s)://host/path" (returned without a trailing slash; checked
// by walking it). Returns the absolute directory path without a trailing slash, or the URI.
// Returns: InvalidArgument (relative, other scheme, no bucket or host); NotFound;
// PermissionDenied; FailedPrecondition (not a directory).
absl::StatusOr<std::string> NormalizeOrigin(std::string_view origin);

}  // namespace ember::origin
