// Origin: where a dataset's bytes come from on a miss: a POSIX directory, an S3-compatible
// bucket prefix (`s3://bucket/prefix`) or a static HTTP server (`http(s)://host/path/`, nginx
// with `autoindex_format json`). Meta lists remote origins to build manifests (`List`); nodes
// read byte ranges (`Read`). Implementations are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ember::cachefs {

// What the manifest says about the file being read: a fill must match it exactly.
struct OriginFile {
  std::string root;  // the dataset's origin
  std::string path;  // relative to root
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string etag;  // remote origins: the object's ETag in the manifest ("" = not checked)
};

// An object below a remote origin's root.
struct OriginObject {
  std::string path;  // relative, "/"-separated
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string etag;  // S3 ETag ("" when the server has none in its listing)
};

class Origin {
 public:
  virtual ~Origin() = default;
  // Every object below the root (remote origins). Returns: Ok; PermissionDenied (credentials);
  // NotFound (no such bucket or path); Unavailable / DeadlineExceeded (server down or stalled).
  virtual absl::Status List(const std::function<absl::Status(const OriginObject&)>& fn) {
    return absl::UnimplementedError("this origin is scanned as a directory tree");
  }
  // Reads exactly `len` bytes at `offset` into buf.
  // Returns: Ok; NotFound (file or object gone); FailedPrecondition (changed since the manifest:
  // size, mtime or ETag differ, or it became short); Unavailable (I/O error, server down).
  virtual absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) = 0;
};

// Reads files under a local or mounted directory.
std::unique_ptr<Origin> NewPosixOrigin();

bool IsRemoteOrigin(std::string_view uri);
// An S3 or HTTP origin for `uri`. S3 settings come from the environment: AWS_ACCESS_KEY_ID /
// AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else the AWS_PROFILE (or default) profile of
// ~/.aws/credentials; AWS_REGION / AWS_DEFAULT_REGION (us-east-1); EMBER_S3_ENDPOINT or
// AWS_ENDPOINT_URL for S3-compatible stores (path-style addressing). Returns InvalidArgument for
// a malformed URI, FailedPrecondition for missing credentials.
absl::StatusOr<std::unique_ptr<Origin>> OpenRemoteOrigin(const std::string& uri);

// What nodes use: POSIX reads for directory origins, and one remote origin per URI root,
// opened on first use.
std::unique_ptr<Origin> NewOriginRouter();

}  // namespace ember::cachefs
