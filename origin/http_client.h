// HttpClient: requests to remote origins (S3, HTTP) over libcurl: GETs for reads, and the PUT /
// POST / DELETE / HEAD a volume's write-back to S3 sends; with what a cache needs from them: ranged
// reads into the caller's buffer, AWS Signature V4, a per-origin concurrency limit, retries with
// backoff on 5xx / timeouts / connection errors (never on 4xx), and a stall timeout so a server
// that stops sending costs seconds, not a hung reader. Thread-safe; each thread keeps its own
// connection (keep-alive) per client.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <semaphore>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::origin {

struct AwsCredentials {
  std::string access_key, secret_key, session_token, region;
};

struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::string> headers;                    // "Name: value"
  std::optional<std::pair<uint64_t, uint64_t>> range;  // [first, last] bytes
  const AwsCredentials* sigv4 = nullptr;               // sign for service "s3"
  char* into = nullptr;    // body goes here (exactly into_len bytes) ...
  size_t into_len = 0;     // ... else into HttpResponse::body
  std::string_view body;   // PUT, POST: what is sent (must outlive the call)
  bool idempotent = true;  // false: sent once (a retry could do it twice: S3's multipart POSTs)
};

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  size_t received = 0;  // body bytes
};

class HttpClient {
 public:
  struct Options {
    int max_concurrency = 16;
    std::chrono::milliseconds connect_timeout{5000};
    std::chrono::milliseconds stall_timeout{10000};  // no byte for this long: give up (retry)
    int retries = 3;                                 // after the first attempt
    std::chrono::milliseconds backoff{100};          // doubled per retry
  };
  explicit HttpClient(const Options& options);
  ~HttpClient();

  // Sends `req` (any method; retried as a GET is unless `idempotent` is false).
  // Returns the response for any HTTP status (callers judge 4xx); Unavailable /
  // DeadlineExceeded when every attempt failed to get one (naming the URL).
  absl::StatusOr<HttpResponse> Get(const HttpRequest& req);

 private:
  absl::StatusOr<HttpResponse> Once(const HttpRequest& req);
  Options options_;
  std::counting_semaphore<1024> slots_;
  uint64_t id_;  // this client's key in each thread's handle cache
};

// RFC 3986 percent-encoding; '/' kept when keep_slash.
std::string UrlEncode(std::string_view s, bool keep_slash);

}  // namespace ember::origin
