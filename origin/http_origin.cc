// The HTTP origin: a static server with a JSON directory index (nginx `autoindex_format json`)
// for the walk, ranged GETs checked against Last-Modified for reads.
#include <time.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "origin/http_client.h"
#include "origin/internal.h"

namespace ember::origin {
namespace {

int64_t ParseHttpDateNs(const std::string& s) {  // Mon, 30 Nov 2026 07:05:05 GMT
  struct tm tm {};
  if (strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S", &tm) == nullptr) return 0;
  return static_cast<int64_t>(timegm(&tm)) * 1'000'000'000;
}

class HttpOrigin final : public RemoteOrigin {
 public:
  explicit HttpOrigin(std::string base) : base_(std::move(base)), http_(ClientOptions()) {}

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
  absl::Status ListObjects(const EntryFn& fn) override { return ListDir("", fn, 0); }

  absl::Status ListDir(const std::string& rel, const EntryFn& fn, int depth) {
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
        OriginEntry o;
        o.path = path;
        o.type = OriginEntry::Type::kFile;
        o.mode = kObjectMode;
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

}  // namespace

std::unique_ptr<Origin> NewHttpOrigin(std::string base) {
  return std::make_unique<HttpOrigin>(std::move(base));
}

}  // namespace ember::origin
