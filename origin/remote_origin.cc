// What S3 and HTTP origins share: the walk of a flat listing, ranged reads checked against the
// manifest, HTTP errors as statuses, client options and credentials; and OpenRemoteOrigin.
#include <algorithm>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "origin/http_client.h"
#include "origin/internal.h"
#include "origin/origin.h"

namespace ember::origin {
namespace {

constexpr uint64_t kListProgressEvery = 1000;

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

}  // namespace

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
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

namespace {

// One ranged GET into buf; checks that the object still is what the manifest says.
absl::Status RangedPart(HttpClient& http, HttpRequest req, const OriginFile& file, uint64_t offset,
                        size_t len, char* buf, const std::string& what,
                        const std::function<absl::Status(const HttpResponse&)>& check) {
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

// Threads for the parts of ranged reads beyond the first (which the caller runs). Long-lived, so
// each keeps its HTTP connections (HttpClient caches a handle per thread). Never destroyed:
// reads may be in flight at exit.
class PartPool {
 public:
  static PartPool& Get() {
    static PartPool* pool = new PartPool(16);
    return *pool;
  }
  void Run(std::function<void()> task) {
    {
      absl::MutexLock lock(&mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.Signal();
  }

 private:
  explicit PartPool(int threads) {
    for (int i = 0; i < threads; i++) std::thread([this] { Work(); }).detach();
  }
  void Work() {
    while (true) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        while (tasks_.empty()) cv_.Wait(&mu_);
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status RangedRead(HttpClient& http, HttpRequest req, const OriginFile& file, uint64_t offset,
                        size_t len, char* buf, const std::string& what,
                        const std::function<absl::Status(const HttpResponse&)>& check) {
  if (len == 0) return absl::OkStatus();
  if (offset + len > file.size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": read beyond the manifest's size"));
  }
  // A large read is kRangedParts GETs at once: one object store connection moves far less than
  // a node's NIC, and a block's parts arrive together.
  const size_t parts = std::min<size_t>(kRangedParts, len / kRangedPartMin);
  if (parts <= 1) return RangedPart(http, req, file, offset, len, buf, what, check);
  const size_t part = (len + parts - 1) / parts;
  std::vector<absl::Status> status(parts);
  absl::BlockingCounter others(static_cast<int>(parts - 1));
  for (size_t i = 1; i < parts; i++) {
    const size_t at = i * part;
    PartPool::Get().Run([&, i, at] {
      status[i] =
          RangedPart(http, req, file, offset + at, std::min(part, len - at), buf + at, what, check);
      others.DecrementCount();
    });
  }
  status[0] = RangedPart(http, req, file, offset, part, buf, what, check);
  others.Wait();
  // The later parts' errors first: a server that ignores ranges says so only there.
  for (size_t i = 1; i <= parts; i++) {
    if (!status[i % parts].ok()) return status[i % parts];
  }
  return absl::OkStatus();
}

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

HttpClient::Options ClientOptions() {
  HttpClient::Options o;
  int seconds = 0;
  if (absl::SimpleAtoi(Env("EMBER_ORIGIN_STALL_TIMEOUT"), &seconds) && seconds > 0) {
    o.stall_timeout = std::chrono::seconds(seconds);
    o.connect_timeout = std::min(o.connect_timeout, o.stall_timeout);
  }
  return o;
}

absl::StatusOr<WalkStats> RemoteOrigin::Walk(const std::string& root, const EntryFn& fn,
                                             const ListProgress& progress) {
  std::vector<OriginEntry> objects;
  uint64_t bytes = 0;
  RETURN_IF_ERROR(ListObjects([&](const OriginEntry& o) {
    objects.push_back(o);
    bytes += o.size;
    if (progress && objects.size() % kListProgressEvery == 0) progress(objects.size(), bytes);
    return absl::OkStatus();
  }));
  return WalkObjects(std::move(objects), fn);
}

absl::StatusOr<WalkStats> WalkObjects(std::vector<OriginEntry> objects, const EntryFn& fn) {
  // Folders are the key prefixes; children sorted by name, pre-order.
  struct Dir {
    std::map<std::string, Dir> dirs;
    std::map<std::string, const OriginEntry*> files;
  };
  Dir root;
  for (const OriginEntry& o : objects) {
    Dir* d = &root;
    std::vector<std::string> parts = absl::StrSplit(o.path, '/');
    for (size_t i = 0; i + 1 < parts.size(); i++) d = &d->dirs[parts[i]];
    const std::string& name = parts.back();
    if (d->dirs.count(name)) {
      return absl::FailedPreconditionError(
          absl::StrCat("origin has both an object and a folder named '", o.path, "'"));
    }
    d->files[name] = &o;
  }
  std::function<absl::Status(const Dir&, const std::string&)> walk =
      [&](const Dir& d, const std::string& path) -> absl::Status {
    // Merge folders and files in name order (a name is one or the other: checked above).
    auto di = d.dirs.begin();
    auto fi = d.files.begin();
    while (di != d.dirs.end() || fi != d.files.end()) {
      bool dir = fi == d.files.end() || (di != d.dirs.end() && di->first < fi->first);
      const std::string& name = dir ? di->first : fi->first;
      if (!dir && d.dirs.count(name)) {
        return absl::FailedPreconditionError(
            absl::StrCat("origin has both an object and a folder named '", path, name, "'"));
      }
      std::string child = path.empty() ? name : absl::StrCat(path, "/", name);
      if (dir) {
        OriginEntry e;
        e.path = child;
        e.type = OriginEntry::Type::kDir;
        e.mode = kFolderMode;
        RETURN_IF_ERROR(fn(e));
        RETURN_IF_ERROR(walk(di->second, child));
        ++di;
      } else {
        OriginEntry e = *fi->second;
        e.path = std::move(child);
        RETURN_IF_ERROR(fn(e));
        ++fi;
      }
    }
    return absl::OkStatus();
  };
  OriginEntry top;
  top.type = OriginEntry::Type::kDir;
  top.mode = kFolderMode;
  RETURN_IF_ERROR(fn(top));
  RETURN_IF_ERROR(walk(root, ""));
  return WalkStats{};
}

absl::StatusOr<S3Location> ParseS3Uri(const std::string& uri) {
  if (!absl::StartsWith(uri, "s3://")) {
    return absl::InvalidArgumentError(absl::StrCat("'", uri, "' is not an s3:// URI"));
  }
  S3Location at;
  std::string rest = uri.substr(5);
  size_t slash = rest.find('/');
  at.bucket = rest.substr(0, slash);
  at.prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (at.bucket.empty())
    return absl::InvalidArgumentError(absl::StrCat("'", uri, "' names no bucket"));
  while (!at.prefix.empty() && at.prefix.back() == '/') at.prefix.pop_back();
  if (!at.prefix.empty()) at.prefix += '/';
  at.endpoint = Env("EMBER_S3_ENDPOINT");
  if (at.endpoint.empty()) at.endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (at.endpoint.empty()) at.endpoint = Env("AWS_ENDPOINT_URL");
  while (!at.endpoint.empty() && at.endpoint.back() == '/') at.endpoint.pop_back();
  return at;
}

absl::StatusOr<std::unique_ptr<Origin>> OpenRemoteOrigin(const std::string& uri) {
  if (absl::StartsWith(uri, "s3://")) {
    ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(uri));
    auto creds = LoadAwsCredentials();
    if (!creds.ok()) return creds.status();
    return NewS3Origin(at.bucket, at.prefix, at.endpoint, *creds);
  }
  if (absl::StartsWith(uri, "http://") || absl::StartsWith(uri, "https://")) {
    std::string base = uri;
    while (base.back() == '/') base.pop_back();
    return NewHttpOrigin(base);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", uri, "' is not an s3:// or http(s):// origin"));
}

}  // namespace ember::origin
