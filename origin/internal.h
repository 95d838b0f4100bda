// What the origin/*.cc files share; other folders include origin/origin.h only.
//
// RemoteOrigin is the half S3 and HTTP origins have in common: a flat listing of objects, walked
// as WalkObjects walks it, and ranged reads checked against the manifest. The helpers are pure or
// thread-safe as noted.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "origin/http_client.h"
#include "origin/origin.h"

namespace ember::origin {

// What a remote object looks like in a manifest: a read-only file owned by root.
inline constexpr uint32_t kObjectMode = S_IFREG | 0444;
inline constexpr uint32_t kFolderMode = S_IFDIR | 0555;

// NotFound (ENOENT), PermissionDenied (EACCES, EPERM) or FailedPrecondition, saying
// "<what> '<path>': <strerror>".
absl::Status ErrnoStatus(int err, const std::string& what, const std::string& path);

// The environment variable, or "".
std::string Env(const char* name);

// The text of the first <tag>...</tag> at or after *pos (before `end`) in xml, unescaped; false
// if there is none. Advances *pos past it.
bool XmlNext(std::string_view xml, std::string_view tag, size_t* pos, std::string* out,
             size_t end = std::string_view::npos);

// A non-2xx response as a status naming `what` (and S3's error code, if the body has one):
// NotFound (404), PermissionDenied (401, 403), FailedPrecondition (416), InvalidArgument (other
// 4xx), Unavailable (5xx).
absl::Status HttpError(const HttpResponse& r, const std::string& what);

// A ranged GET of [offset, offset + len) of `file` into buf, through `req` (URL and signing set);
// a read of 2 MiB or more is split into up to kRangedParts GETs of at least kRangedPartMin that
// run at once (`check` is then called from several threads). The object must still have the
// manifest's size and pass `check` (ETag, Last-Modified).
// Returns: Ok; InvalidArgument (beyond the manifest's size); FailedPrecondition (changed);
// Unavailable (server ignored the range); HttpError's codes; the client's errors.
constexpr size_t kRangedParts = 4;
constexpr size_t kRangedPartMin = 1 << 20;
absl::Status RangedRead(HttpClient& http, HttpRequest req, const OriginFile& file, uint64_t offset,
                        size_t len, char* buf, const std::string& what,
                        const std::function<absl::Status(const HttpResponse&)>& check);

// HttpClient options for origins (EMBER_ORIGIN_STALL_TIMEOUT, seconds: a server silent this long
// is given up on, and retried).
HttpClient::Options ClientOptions();

// S3 credentials and region from the environment or ~/.aws/credentials (see OpenRemoteOrigin).
// Returns: FailedPrecondition when there are none.
absl::StatusOr<AwsCredentials> LoadAwsCredentials();

// An origin whose tree is a flat listing of objects (S3 keys, files of an HTTP index).
class RemoteOrigin : public Origin {
 public:
  // Lists every object (kFile entries, kObjectMode), then walks them as WalkObjects does.
  absl::StatusOr<WalkStats> Walk(const std::string& root, const EntryFn& fn,
                                 const ListProgress& progress) final;

 protected:
  // Hands every object below the root to fn, in any order.
  // Returns: Ok; PermissionDenied (credentials); NotFound (no such bucket or path);
  // FailedPrecondition (not an index, tree too deep); Unavailable / DeadlineExceeded.
  virtual absl::Status ListObjects(const EntryFn& fn) = 0;
};

// Where an s3:// URI points: `prefix` is "" or ends in '/'; `endpoint` (from EMBER_S3_ENDPOINT,
// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, no trailing slash) "" means AWS.
struct S3Location {
  std::string bucket, prefix, endpoint;
};
// Returns: the location; InvalidArgument (not s3://, no bucket).
absl::StatusOr<S3Location> ParseS3Uri(const std::string& uri);

// `prefix` is "" or ends in '/'; `endpoint` "" means AWS (virtual-hosted addressing).
std::unique_ptr<Origin> NewS3Origin(std::string bucket, std::string prefix, std::string endpoint,
                                    AwsCredentials creds);
// `base`: the URL of the root, without a trailing slash.
std::unique_ptr<Origin> NewHttpOrigin(std::string base);

}  // namespace ember::origin
