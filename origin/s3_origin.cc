// The S3 origin: ListObjectsV2 (XML) for the walk, ranged GETs signed with SigV4 for reads,
// against AWS or an S3-compatible store (path-style addressing with a custom endpoint).
#include <spdlog/spdlog.h>
#include <time.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "origin/http_client.h"
#include "origin/internal.h"

namespace ember::origin {
namespace {

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

class S3Origin final : public RemoteOrigin {
 public:
  S3Origin(std::string bucket, std::string prefix, std::string endpoint, AwsCredentials creds)
      : bucket_(std::move(bucket)),
        prefix_(std::move(prefix)),
        endpoint_(std::move(endpoint)),
        creds_(std::move(creds)),
        http_(ClientOptions()) {}

  absl::Status ListObjects(const EntryFn& fn) override {
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
        OriginEntry o;
        o.path = rel;
        o.type = OriginEntry::Type::kFile;
        o.mode = kObjectMode;
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

}  // namespace

bool XmlNext(std::string_view xml, std::string_view tag, size_t* pos, std::string* out,
             size_t end) {
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

std::unique_ptr<Origin> NewS3Origin(std::string bucket, std::string prefix, std::string endpoint,
                                    AwsCredentials creds) {
  return std::make_unique<S3Origin>(std::move(bucket), std::move(prefix), std::move(endpoint),
                                    std::move(creds));
}

}  // namespace ember::origin
