#include "origin/http_client.h"

#include <curl/curl.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ember::origin {
namespace {

std::atomic<uint64_t> next_client_id{1};

struct Handle {
  CURL* curl = nullptr;
  ~Handle() {
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

// One easy handle per (thread, client): reused so connections stay alive between reads.
CURL* ThreadHandle(uint64_t client) {
  thread_local std::unordered_map<uint64_t, Handle> handles;
  Handle& h = handles[client];
  if (h.curl == nullptr) h.curl = curl_easy_init();
  return h.curl;
}

struct Sink {
  HttpResponse* resp;
  char* into;
  size_t into_len;
  bool overflow = false;
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* s = static_cast<Sink*>(user);
  size_t len = size * n;
  if (s->into != nullptr) {
    if (s->resp->received + len > s->into_len) {
      s->overflow = true;
      return 0;  // abort: more than asked for
    }
    std::memcpy(s->into + s->resp->received, data, len);
  } else {
    s->resp->body.append(data, len);
  }
  s->resp->received += len;
  return len;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<HttpResponse*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) r->headers.clear();  // a new response (after a redirect/100)
  size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    r->headers[name] = value;
  }
  return size * n;
}

struct GlobalInit {
  GlobalInit() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

}  // namespace

std::string UrlEncode(std::string_view s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

HttpClient::HttpClient(const Options& options)
    : options_(options), slots_(std::max(1, options.max_concurrency)), id_(next_client_id++) {
  static GlobalInit init;
}

HttpClient::~HttpClient() = default;

absl::StatusOr<HttpResponse> HttpClient::Get(const HttpRequest& req) {
  slots_.acquire();
  absl::StatusOr<HttpResponse> r;
  auto backoff = options_.backoff;
  for (int attempt = 0; attempt <= options_.retries; attempt++) {
    r = Once(req);
    bool retry = req.idempotent && (!r.ok() || r->status >= 500);
    if (!retry || attempt == options_.retries) break;
    std::this_thread::sleep_for(backoff);
    backoff *= 2;
  }
  slots_.release();
  return r;
}

absl::StatusOr<HttpResponse> HttpClient::Once(const HttpRequest& req) {
  CURL* c = ThreadHandle(id_);
  if (c == nullptr) return absl::InternalError("curl_easy_init failed");
  curl_easy_reset(c);
  HttpResponse resp;
  Sink sink{&resp, req.into, req.into_len};
  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.connect_timeout.count()));
  // A stall: under 1 byte/s for the stall timeout.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                   std::max(1L, static_cast<long>(options_.stall_timeout.count() / 1000)));
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);  // fewer recv calls per block
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &resp);
  std::string range;
  if (req.range) {
    range = absl::StrCat(req.range->first, "-", req.range->second);
    curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  }
  curl_slist* headers = nullptr;
  for (const auto& h : req.headers) headers = curl_slist_append(headers, h.c_str());
  if (req.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (req.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    if (req.method == "PUT" || req.method == "POST") {
      // Never NULL: that would make curl read the body from stdin.
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, req.body.empty() ? "" : req.body.data());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
      // (No "Expect:" to skip 100-continue: curl before 8.3 would sign a header it never sends.)
      headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
    }
  }
  std::string userpwd, sigv4;
  if (req.sigv4 != nullptr) {
    sigv4 = absl::StrCat("aws:amz:", req.sigv4->region, ":s3");
    userpwd = absl::StrCat(req.sigv4->access_key, ":", req.sigv4->secret_key);
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!req.sigv4->session_token.empty()) {
      headers = curl_slist_append(
          headers, absl::StrCat("x-amz-security-token: ", req.sigv4->session_token).c_str());
    }
  }
  if (headers != nullptr) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    if (sink.overflow) {
      return absl::DataLossError(absl::StrCat(req.url, ": server sent more than asked for"));
    }
    std::string what = absl::StrCat(req.url, ": ", curl_easy_strerror(rc));
    return rc == CURLE_OPERATION_TIMEDOUT ? absl::DeadlineExceededError(what)
                                          : absl::UnavailableError(what);
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp.status);
  return resp;
}

}  // namespace ember::origin
