// S3 and HTTP origins (see origin.h), and the router nodes read through.
#include <spdlog/spdlog.h>
#include <time.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cachefs/http_client.h"
#include "cachefs/origin.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string XmlUnescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      out += s[i];
      continue;
    }
    std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp")
      out += '&';
    else if (ent == "lt")
      out += '<';
    else if (ent == "gt")
      out += '>';
    else if (ent == "quot")
      out += '"';
    else if (ent == "apos")
      out += '\'';
    else if (!ent.empty() && ent[0] == '#') {
      uint32_t cp = 0;
      bool ok = ent.size() > 1 && ent[1] == 'x'
                    ? absl::SimpleHexAtoi(std::string(ent.substr(2)), &cp)
                    : absl::SimpleAtoi(std::string(ent.substr(1)), &cp);
      if (!ok) cp = '?';
      if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      }
    } else {
      out.append(s.substr(i, semi - i + 1));
    }
    i = semi;
  }
  return out;
}

// The text of the first <tag>...</tag> in [from, end) of xml; npos-safe. Advances *pos past it.
bool XmlNext(std::string_view xml, std::string_view tag, size_t* pos, std::string* out,
             size_t end = std::string_view::npos) {
  std::string open = absl::StrCat("<", std::string(tag), ">");
  std::string close_tag = absl::StrCat("</", std::string(tag), ">");
  size_t a = xml.find(open, *pos);
  if (a == std::string_view::npos || a >= end) return false;
  a += open.size();
  size_t b = xml.find(close_tag, a);
  if (b == std::string_view::npos) return false;
  *out = XmlUnescape(xml.substr(a, b - a));
  *pos = b + close_tag.size();
  return true;
}

int64_t ParseIso8601Ns(const std::string& s) {  // 2026-11-30T07:05:05.000Z
  struct tm tm {};
  const char* rest = strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (rest == nullptr) return 0;
  int64_t ns = static_cast<int64_t>(timegm(&tm)) * 1'000'000'000;
  if (*rest == '.') {
    int64_t frac = 0, scale = 100'000'000;
    for (rest++; *rest >= '0' && *rest <= '9'; rest++, scale /= 10) frac += (*rest - '0') * scale;
    ns += frac;
  }
  return ns;
}

int64_t ParseHttpDateNs(const std::string& s) {  // Mon, 30 Nov 2026 07:05:05 GMT
  struct tm tm {};
  if (strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S", &tm) == nullptr) return 0;
  return static_cast<int64_t>(timegm(&tm)) * 1'000'000'000;
}

// "bytes a-b/TOTAL" -> TOTAL, or -1.
int64_t RangeTotal(const HttpResponse& r) {
  auto it = r.headers.find("content-range");
  if (it == r.headers.end()) return -1;
  size_t slash = it->second.rfind('/');
  int64_t total;
  if (slash == std::string::npos || !absl::SimpleAtoi(it->second.substr(slash + 1), &total)) {
    return -1;
  }
  return total;
}

absl::Status HttpError(const HttpResponse& r, const std::string& what) {
  std::string detail;
  size_t pos = 0;
  std::string code, message;
  if (XmlNext(r.body, "Code", &pos, &code)) {
    pos = 0;
    XmlNext(r.body, "Message", &pos, &message);
    detail = absl::StrCat(": ", code, message.empty() ? "" : ": ", message);
  }
  std::string msg = absl::StrCat(what, ": HTTP ", r.status, detail);
  if (r.status == 404) return absl::NotFoundError(msg);
  if (r.status == 401 || r.status == 403) return absl::PermissionDeniedError(msg);
  if (r.status == 416) return absl::FailedPreconditionError(msg);
  if (r.status >= 400 && r.status < 500) return absl::InvalidArgumentError(msg);
  return absl::UnavailableError(msg);
}

// A ranged GET into buf; checks that the object still is what the manifest says.
absl::Status RangedRead(HttpClient& http, HttpRequest req, const OriginFile& file, uint64_t offset,
                        size_t len, char* buf, const std::string& what,
                        const std::function<absl::Status(const HttpResponse&)>& check) {
  if (len == 0) return absl::OkStatus();
  if (offset + len > file.size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": read beyond the manifest's size"));
  }
  req.range = std::make_pair(offset, offset + len - 1);
  req.into = buf;
  req.into_len = len;
  auto r = http.Get(req);
  if (!r.ok()) return r.status();
  if (r->status != 206 && r->status != 200) return HttpError(*r, what);
  int64_t total = r->status == 206 ? RangeTotal(*r) : static_cast<int64_t>(r->received);
  if (r->status == 200 && offset != 0) {
    return absl::UnavailableError(absl::StrCat(what, ": server ignored the range request"));
  }
  if (total != static_cast<int64_t>(file.size)) {
    return absl::FailedPreconditionError(absl::StrCat(what, " changed since the manifest: size ",
                                                      total, ", manifest says ", file.size));
  }
  if (auto st = check(*r); !st.ok()) return st;
  if (r->received != len) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": got ", r->received, " bytes of ", len, " (object changed?)"));
  }
  return absl::OkStatus();
}

HttpClient::Options ClientOptions();

// ---- S3 ----

class S3Origin final : public Origin {
 public:
  S3Origin(std::string bucket, std::string prefix, std::string endpoint, AwsCredentials creds)
      : bucket_(std::move(bucket)),
        prefix_(std::move(prefix)),
        endpoint_(std::move(endpoint)),
        creds_(std::move(creds)),
        http_(ClientOptions()) {}

  absl::Status List(const std::function<absl::Status(const OriginObject&)>& fn) override {
    std::string token;
    uint64_t skipped = 0;
    while (true) {
      HttpRequest req;
      req.url = absl::StrCat(BucketUrl(), "?list-type=2&prefix=", UrlEncode(prefix_, false),
                             token.empty() ? "" : "&continuation-token=", UrlEncode(token, false));
      req.sigv4 = &creds_;
      auto r = http_.Get(req);
      if (!r.ok()) return r.status();
      if (r->status != 200) return HttpError(*r, absl::StrCat("s3://", bucket_, "/", prefix_));
      std::string_view xml = r->body;
      size_t pos = 0;
      while (true) {
        size_t at = xml.find("<Contents>", pos);
        if (at == std::string_view::npos) break;
        size_t end = xml.find("</Contents>", at);
        if (end == std::string_view::npos) break;
        std::string key, size, etag, modified;
        size_t p = at;
        XmlNext(xml, "Key", &p, &key, end);
        p = at;
        XmlNext(xml, "Size", &p, &size, end);
        p = at;
        XmlNext(xml, "ETag", &p, &etag, end);
        p = at;
        XmlNext(xml, "LastModified", &p, &modified, end);
        pos = end;
        std::string rel = key.substr(std::min(key.size(), prefix_.size()));
        OriginObject o;
        o.path = rel;
        o.mtime_ns = ParseIso8601Ns(modified);
        o.etag = etag;
        if (!ValidRelativePath(rel) || !absl::SimpleAtoi(size, &o.size)) {
          skipped++;  // folder markers ("a/"), "a//b", "." or ".." parts: not files
          continue;
        }
        RETURN_IF_ERROR(fn(o));
      }
      std::string truncated, next;
      size_t p = 0;
      XmlNext(xml, "IsTruncated", &p, &truncated);
      p = 0;
      if (truncated != "true" || !XmlNext(xml, "NextContinuationToken", &p, &next)) break;
      token = next;
    }
    if (skipped > 0) {
      spdlog::warn(
          "s3://{}/{}: skipped {} keys that are not files (folder markers, empty or "
          "'.'/'..' path parts)",
          bucket_, prefix_, skipped);
    }
    return absl::OkStatus();
  }

  absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) override {
    std::string key = prefix_ + file.path;
    HttpRequest req;
    req.url = absl::StrCat(BucketUrl(), "/", UrlEncode(key, true));
    req.sigv4 = &creds_;
    std::string what = absl::StrCat("s3://", bucket_, "/", key);
    return RangedRead(http_, req, file, offset, len, buf, what, [&](const HttpResponse& r) {
      auto it = r.headers.find("etag");
      if (!file.etag.empty() && (it == r.headers.end() || it->second != file.etag)) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, " changed since the manifest: ETag ",
            it == r.headers.end() ? "missing" : it->second, ", manifest says ", file.etag));
      }
      return absl::OkStatus();
    });
  }

  static bool ValidRelativePath(const std::string& p) {
    if (p.empty() || p.back() == '/' || p.front() == '/') return false;
    size_t start = 0;
    while (start <= p.size()) {
      size_t end = p.find('/', start);
      if (end == std::string::npos) end = p.size();
      std::string_view part(p.data() + start, end - start);
      if (part.empty() || part == "." || part == "..") return false;
      start = end + 1;
    }
    return true;
  }

 private:
  // Path-style with a custom endpoint (S3-compatible stores), virtual-hosted on AWS.
  std::string BucketUrl() const {
    if (!endpoint_.empty()) return absl::StrCat(endpoint_, "/", bucket_);
    return absl::StrCat("https://", bucket_, ".s3.", creds_.region, ".amazonaws.com");
  }

  std::string bucket_, prefix_, endpoint_;
  AwsCredentials creds_;
  HttpClient http_;
};

// ---- HTTP (nginx autoindex_format json) ----

class HttpOrigin final : public Origin {
 public:
  explicit HttpOrigin(std::string base) : base_(std::move(base)), http_(ClientOptions()) {}

  absl::Status List(const std::function<absl::Status(const OriginObject&)>& fn) override {
    return ListDir("", fn, 0);
  }

  absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) override {
    HttpRequest req;
    req.url = absl::StrCat(base_, "/", UrlEncode(file.path, true));
    std::string what = req.url;
    return RangedRead(http_, req, file, offset, len, buf, what, [&](const HttpResponse& r) {
      auto it = r.headers.find("last-modified");
      int64_t mtime = it == r.headers.end() ? 0 : ParseHttpDateNs(it->second);
      if (file.mtime_ns != 0 && mtime != file.mtime_ns) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, " changed since the manifest (Last-Modified differs)"));
      }
      return absl::OkStatus();
    });
  }

 private:
  absl::Status ListDir(const std::string& rel,
                       const std::function<absl::Status(const OriginObject&)>& fn, int depth) {
    if (depth > 64) return absl::FailedPreconditionError(base_ + ": tree too deep");
    HttpRequest req;
    req.url = absl::StrCat(base_, "/", UrlEncode(rel, true));
    if (req.url.back() != '/') req.url += '/';
    auto r = http_.Get(req);
    if (!r.ok()) return r.status();
    if (r->status != 200) return HttpError(*r, req.url);
    auto j = nlohmann::json::parse(r->body, nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      return absl::FailedPreconditionError(
          absl::StrCat(req.url,
                       ": not a JSON directory index (serve it with nginx `autoindex on; "
                       "autoindex_format json;`)"));
    }
    for (const auto& e : j) {
      if (!e.contains("name") || !e.contains("type")) continue;
      std::string name = e["name"].get<std::string>();
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
        continue;
      }
      std::string path = rel.empty() ? name : absl::StrCat(rel, "/", name);
      std::string type = e["type"].get<std::string>();
      if (type == "directory") {
        RETURN_IF_ERROR(ListDir(path, fn, depth + 1));
      } else if (type == "file") {
        OriginObject o;
        o.path = path;
        o.size = e.value("size", uint64_t{0});
        o.mtime_ns = ParseHttpDateNs(e.value("mtime", std::string()));
        RETURN_IF_ERROR(fn(o));
      }
    }
    return absl::OkStatus();
  }

  std::string base_;
  HttpClient http_;
};

// ---- router ----

class OriginRouter final : public Origin {
 public:
  absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) override {
    if (!IsRemoteOrigin(file.root)) return posix_->Read(file, offset, len, buf);
    Origin* o;
    {
      std::lock_guard lock(mu_);
      auto& slot = remote_[file.root];
      if (slot == nullptr) {
        auto opened = OpenRemoteOrigin(file.root);
        if (!opened.ok()) return opened.status();
        slot = std::move(*opened);
      }
      o = slot.get();
    }
    return o->Read(file, offset, len, buf);
  }

 private:
  std::unique_ptr<Origin> posix_ = NewPosixOrigin();
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Origin>> remote_;
};

absl::StatusOr<AwsCredentials> LoadAwsCredentials() {
  AwsCredentials c;
  c.region = Env("AWS_REGION");
  if (c.region.empty()) c.region = Env("AWS_DEFAULT_REGION");
  if (c.region.empty()) c.region = "us-east-1";
  c.access_key = Env("AWS_ACCESS_KEY_ID");
  c.secret_key = Env("AWS_SECRET_ACCESS_KEY");
  c.session_token = Env("AWS_SESSION_TOKEN");
  if (!c.access_key.empty() && !c.secret_key.empty()) return c;
  std::string file = Env("AWS_SHARED_CREDENTIALS_FILE");
  if (file.empty()) file = Env("HOME") + "/.aws/credentials";
  std::string profile = Env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  std::ifstream in(file);
  std::string line, section;
  while (std::getline(in, line)) {
    std::string l(absl::StripAsciiWhitespace(line));
    if (l.empty() || l[0] == '#' || l[0] == ';') continue;
    if (l.front() == '[' && l.back() == ']') {
      section = std::string(absl::StripAsciiWhitespace(l.substr(1, l.size() - 2)));
      continue;
    }
    if (section != profile) continue;
    size_t eq = l.find('=');
    if (eq == std::string::npos) continue;
    std::string key(absl::StripAsciiWhitespace(l.substr(0, eq)));
    std::string value(absl::StripAsciiWhitespace(l.substr(eq + 1)));
    if (key == "aws_access_key_id") c.access_key = value;
    if (key == "aws_secret_access_key") c.secret_key = value;
    if (key == "aws_session_token") c.session_token = value;
  }
  if (c.access_key.empty() || c.secret_key.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a [",
                     profile, "] profile in ", file));
  }
  return c;
}

// EMBER_ORIGIN_STALL_TIMEOUT (seconds, default 10): a server silent this long is given up on
// (and retried 3 times with backoff).
HttpClient::Options ClientOptions() {
  HttpClient::Options o;
  int seconds = 0;
  if (absl::SimpleAtoi(Env("EMBER_ORIGIN_STALL_TIMEOUT"), &seconds) && seconds > 0) {
    o.stall_timeout = std::chrono::seconds(seconds);
    o.connect_timeout = std::min(o.connect_timeout, o.stall_timeout);
  }
  return o;
}

}  // namespace

bool IsRemoteOrigin(std::string_view uri) {
  return uri.starts_with("s3://") || uri.starts_with("http://") || uri.starts_with("https://");
}

absl::StatusOr<std::unique_ptr<Origin>> OpenRemoteOrigin(const std::string& uri) {
  if (absl::StartsWith(uri, "s3://")) {
    std::string rest = uri.substr(5);
    size_t slash = rest.find('/');
    std::string bucket = rest.substr(0, slash);
    std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (bucket.empty())
      return absl::InvalidArgumentError(absl::StrCat("'", uri, "' names no bucket"));
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    if (!prefix.empty()) prefix += '/';
    auto creds = LoadAwsCredentials();
    if (!creds.ok()) return creds.status();
    std::string endpoint = Env("EMBER_S3_ENDPOINT");
    if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL_S3");
    if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    return std::unique_ptr<Origin>(new S3Origin(bucket, prefix, endpoint, *creds));
  }
  if (absl::StartsWith(uri, "http://") || absl::StartsWith(uri, "https://")) {
    std::string base = uri;
    while (base.back() == '/') base.pop_back();
    return std::unique_ptr<Origin>(new HttpOrigin(base));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", uri, "' is not an s3:// or http(s):// origin"));
}

std::unique_ptr<Origin> NewOriginRouter() { return std::make_unique<OriginRouter>(); }

}  // namespace ember::cachefs
