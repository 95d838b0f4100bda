// The two writable origins (writable.h): a directory (temp file, sync, rename, sync the
// directory) and an S3 bucket prefix (one PUT, or a multipart upload for large files; moves are a
// server-side copy and a delete).
#include "origin/writable.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/file_io.h"
#include "common/status.h"
#include "origin/http_client.h"
#include "origin/internal.h"

namespace ember::origin {
namespace {

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " '", path, "': ", strerror(errno)));
}

class DirOrigin final : public WritableOrigin {
 public:
  explicit DirOrigin(std::string root) : root_(std::move(root)) {}

  absl::Status Reachable() override {
    struct stat st;
    if (stat(root_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::UnavailableError(absl::StrCat("origin '", root_, "' is unreachable"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<OriginCopy> Put(const std::string& rel, uint64_t size, uint64_t piece,
                                 const PieceFn& fill) override {
    RETURN_IF_ERROR(MakeParents(rel));
    const std::string to = Path(rel);
    const std::string dir = Parent(to);
    static std::atomic<uint64_t> serial{0};
    const std::string tmp = absl::StrCat(dir, "/.", to.substr(dir.size() + 1), ".ember-", getpid(),
                                         "-", serial.fetch_add(1), ".tmp");
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("cannot create", tmp);
    absl::Cleanup drop = [&] {
      if (fd >= 0) close(fd);
      unlink(tmp.c_str());
    };
    piece = std::max<uint64_t>(piece, 1);
    std::unique_ptr<char[]> buf(new char[std::min(piece, std::max<uint64_t>(size, 1))]);
    for (uint64_t off = 0; off < size; off += piece) {
      const size_t len = static_cast<size_t>(std::min(piece, size - off));
      RETURN_IF_ERROR(fill(off, len, buf.get()));
      if (!PwriteFull(fd, off, buf.get(), len)) return Errno("cannot write", tmp);
    }
    if (fdatasync(fd) != 0) return Errno("cannot sync", tmp);
    struct stat st;
    if (fstat(fd, &st) != 0) return Errno("cannot stat", tmp);
    close(fd);
    fd = -1;
    if (rename(tmp.c_str(), to.c_str()) != 0) return Errno("cannot rename", tmp);
    std::move(drop).Cancel();
    RETURN_IF_ERROR(SyncPath(dir));
    return Of(st);  // a rename keeps the inode and the mtime
  }

  absl::StatusOr<OriginCopy> Stat(const std::string& rel) override {
    struct stat st;
    if (lstat(Path(rel).c_str(), &st) != 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("'", Path(rel), "' is gone"));
      return Errno("cannot stat", Path(rel));
    }
    return Of(st);
  }

  absl::StatusOr<OriginCopy> Move(const std::string& from_rel, const std::string& to_rel) override {
    RETURN_IF_ERROR(MakeParents(to_rel));
    const std::string from = Path(from_rel), to = Path(to_rel);
    if (rename(from.c_str(), to.c_str()) != 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("'", from, "' is gone"));
      return Errno("cannot rename", from);
    }
    // The old directory, now empty (a step.tmp/ renamed whole): best effort.
    (void)rmdir(Parent(from).c_str());
    RETURN_IF_ERROR(SyncPath(Parent(to)));
    return Stat(to_rel);
  }

  absl::Status DeleteIf(const std::string& rel, const OriginCopy& copy) override {
    const std::string path = Path(rel);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) {
      return errno == ENOENT ? absl::OkStatus() : Errno("cannot stat", path);
    }
    const OriginCopy there = Of(st);
    if (!S_ISREG(st.st_mode) || there.id != copy.id || there.size != copy.size) {
      return absl::OkStatus();  // another file was put there since: not ours
    }
    if (unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("cannot delete", path);
    std::string dir = Parent(rel);
    RETURN_IF_ERROR(SyncPath(dir.empty() ? root_ : Path(dir)));
    // Directories left empty (a whole step/ removed), up to the origin's own: best effort.
    for (; !dir.empty(); dir = Parent(dir)) {
      if (rmdir(Path(dir).c_str()) != 0) break;
    }
    return absl::OkStatus();
  }

  absl::Status Read(const std::string& rel, uint64_t offset, size_t len, char* buf) override {
    const std::string path = Path(rel);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("'", path, "' is gone"));
      return Errno("cannot open", path);
    }
    absl::Cleanup closer = [fd] { close(fd); };
    if (!PreadFull(fd, offset, len, buf)) {
      return absl::UnavailableError(
          absl::StrCat("cannot read '", path, "': ", errno == 0 ? "short file" : strerror(errno)));
    }
    return absl::OkStatus();
  }

 private:
  std::string Path(const std::string& rel) const { return absl::StrCat(root_, "/", rel); }

  static OriginCopy Of(const struct stat& st) {
    return {absl::StrCat(st.st_ino, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec),
            static_cast<uint64_t>(st.st_size)};
  }

  // Directories under the origin leading to `rel` (never the origin's own).
  absl::Status MakeParents(const std::string& rel) {
    const std::string parent = Parent(rel);
    if (parent.empty()) return absl::OkStatus();
    std::error_code ec;
    std::filesystem::create_directories(Path(parent), ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot make '", Path(parent), "': ", ec.message()));
    }
    return absl::OkStatus();
  }

  const std::string root_;
};

// S3 keeps a part's ETag; a multipart upload needs parts of at least 5 MiB (but the last), at
// most 10,000 of them; a server-side copy in one request is at most 5 GiB.
constexpr uint64_t kPartMin = 16ull << 20;
constexpr uint64_t kMaxParts = 10'000;
constexpr uint64_t kCopyMax = 5ull << 30;
constexpr char kCopyHeader[] = "x-amz-meta-ember-copy";

// A name no other put has: time, process, a counter and randomness.
std::string NewCopyId() {
  static std::atomic<uint64_t> serial{0};
  static const uint64_t seed = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  return absl::StrCat(absl::Hex(absl::GetCurrentTimeNanos()), "-", getpid(), "-",
                      serial.fetch_add(1), "-", absl::Hex(seed));
}

class S3WritableOrigin final : public WritableOrigin {
 public:
  S3WritableOrigin(S3Location at, AwsCredentials creds)
      : at_(std::move(at)), creds_(std::move(creds)), http_(ClientOptions()) {}

  absl::Status Reachable() override {
    HttpRequest req = Request("GET", "");
    req.url =
        absl::StrCat(BucketUrl(), "?list-type=2&max-keys=1&prefix=", UrlEncode(at_.prefix, false));
    auto r = http_.Get(req);
    if (!r.ok()) return absl::UnavailableError(r.status().message());
    if (r->status != 200) return absl::UnavailableError(HttpError(*r, Name("")).message());
    return absl::OkStatus();
  }

  absl::StatusOr<OriginCopy> Put(const std::string& rel, uint64_t size, uint64_t piece,
                                 const PieceFn& fill) override {
    piece = std::max<uint64_t>(piece, 1);
    uint64_t part = std::max(kPartMin, (size + kMaxParts - 1) / kMaxParts);
    part = (part + piece - 1) / piece * piece;
    std::string buf;
    auto gather = [&](uint64_t from, uint64_t len) -> absl::Status {
      buf.resize(len);
      for (uint64_t off = 0; off < len; off += piece) {
        RETURN_IF_ERROR(fill(from + off, std::min(piece, len - off), buf.data() + off));
      }
      return absl::OkStatus();
    };
    // The copy's identity: an ETag is the contents' MD5 (the same bytes saved again would look
    // like the old copy), so each put names itself in metadata, which a copy keeps.
    const std::string id = NewCopyId();
    const std::string id_header = absl::StrCat(kCopyHeader, ": ", id);
    if (size <= part) {
      RETURN_IF_ERROR(gather(0, size));
      HttpRequest req = Request("PUT", rel);
      req.headers.push_back(id_header);
      req.body = buf;
      RETURN_IF_ERROR(Send(req, rel).status());
      return OriginCopy{id, size};
    }
    // Multipart: create, parts in order, complete; abandoned uploads are aborted. Create and
    // complete are sent once (a retry could start a second upload, or complete one twice).
    HttpRequest create = Request("POST", rel);
    create.url += "?uploads=";  // with '=': curl before 8.5 signs a bare "?uploads" wrongly
    create.headers.push_back(id_header);
    create.idempotent = false;
    ASSIGN_OR_RETURN(HttpResponse created, Send(create, rel));
    std::string upload;
    size_t pos = 0;
    if (!XmlNext(created.body, "UploadId", &pos, &upload) || upload.empty()) {
      return absl::UnavailableError(absl::StrCat(Name(rel), ": no UploadId in the answer"));
    }
    const std::string query = absl::StrCat("uploadId=", UrlEncode(upload, false));
    absl::Cleanup abort = [&] {
      HttpRequest del = Request("DELETE", rel);
      del.url += "?" + query;
      (void)http_.Get(del);
    };
    std::string complete = "<CompleteMultipartUpload>";
    for (uint64_t off = 0, n = 1; off < size; off += part, ++n) {
      RETURN_IF_ERROR(gather(off, std::min(part, size - off)));
      HttpRequest put = Request("PUT", rel);
      put.url += absl::StrCat("?partNumber=", n, "&", query);
      put.body = buf;
      ASSIGN_OR_RETURN(HttpResponse r, Send(put, rel));
      absl::StrAppend(&complete, "<Part><PartNumber>", n, "</PartNumber><ETag>", Header(r, "etag"),
                      "</ETag></Part>");
    }
    complete += "</CompleteMultipartUpload>";
    HttpRequest done = Request("POST", rel);
    done.url += "?" + query;
    done.body = complete;
    done.idempotent = false;
    ASSIGN_OR_RETURN(HttpResponse r, Send(done, rel));
    std::string etag;
    pos = 0;
    if (!XmlNext(r.body, "ETag", &pos, &etag)) {  // S3 may answer 200 with an <Error> body
      return HttpError(HttpResponse{500, {}, r.body, 0}, Name(rel));
    }
    std::move(abort).Cancel();
    return OriginCopy{id, size};
  }

  absl::StatusOr<OriginCopy> Stat(const std::string& rel) override {
    ASSIGN_OR_RETURN(HttpResponse r, Send(Request("HEAD", rel), rel));
    uint64_t size = 0;
    if (!absl::SimpleAtoi(Header(r, "content-length"), &size)) {
      return absl::UnavailableError(absl::StrCat(Name(rel), ": no Content-Length"));
    }
    // Objects put by something else carry no identity of ours: their ETag stands in.
    const std::string id = Header(r, kCopyHeader);
    return OriginCopy{id.empty() ? Header(r, "etag") : id, size};
  }

  absl::StatusOr<OriginCopy> Move(const std::string& from, const std::string& to) override {
    ASSIGN_OR_RETURN(OriginCopy was, Stat(from));
    if (was.size > kCopyMax) {
      return absl::UnimplementedError(absl::StrCat(Name(from), " is too large to copy in S3"));
    }
    HttpRequest copy = Request("PUT", to);
    copy.headers.push_back(
        absl::StrCat("x-amz-copy-source: /", at_.bucket, "/", UrlEncode(at_.prefix + from, true)));
    ASSIGN_OR_RETURN(HttpResponse r, Send(copy, to));  // the metadata (identity) comes along
    std::string etag;
    size_t pos = 0;
    if (!XmlNext(r.body, "ETag", &pos, &etag)) {
      return HttpError(HttpResponse{500, {}, r.body, 0}, Name(to));
    }
    ASSIGN_OR_RETURN(OriginCopy moved, Stat(to));
    if (moved.id != was.id || moved.size != was.size) {  // replaced at `from` meanwhile
      return absl::UnavailableError(absl::StrCat(Name(from), " changed while it was moved"));
    }
    RETURN_IF_ERROR(DeleteIf(from, was));
    return moved;
  }

  absl::Status DeleteIf(const std::string& rel, const OriginCopy& copy) override {
    absl::StatusOr<OriginCopy> there = Stat(rel);
    if (absl::IsNotFound(there.status())) return absl::OkStatus();
    if (!there.ok()) return there.status();
    if (there->id != copy.id || there->size != copy.size) return absl::OkStatus();
    HttpRequest del = Request("DELETE", rel);
    auto r = http_.Get(del);
    if (!r.ok()) return r.status();
    if (r->status != 204 && r->status != 200 && r->status != 404) {
      return HttpError(*r, Name(rel));
    }
    return absl::OkStatus();
  }

  absl::Status Read(const std::string& rel, uint64_t offset, size_t len, char* buf) override {
    if (len == 0) return absl::OkStatus();
    HttpRequest req = Request("GET", rel);
    req.range = std::make_pair(offset, offset + len - 1);
    req.into = buf;
    req.into_len = len;
    ASSIGN_OR_RETURN(HttpResponse r, Send(req, rel));
    if (r.received != len || (r.status == 200 && offset != 0)) {
      return absl::UnavailableError(
          absl::StrCat(Name(rel), ": ", r.received, " bytes at ", offset, ", not ", len));
    }
    return absl::OkStatus();
  }

 private:
  std::string BucketUrl() const {
    if (!at_.endpoint.empty()) return absl::StrCat(at_.endpoint, "/", at_.bucket);
    return absl::StrCat("https://", at_.bucket, ".s3.", creds_.region, ".amazonaws.com");
  }
  std::string Name(const std::string& rel) const {
    return absl::StrCat("s3://", at_.bucket, "/", at_.prefix, rel);
  }
  HttpRequest Request(std::string method, const std::string& rel) const {
    HttpRequest req;
    req.method = std::move(method);
    req.url = absl::StrCat(BucketUrl(), "/", UrlEncode(at_.prefix + rel, true));
    req.sigv4 = &creds_;
    return req;
  }
  // Any 2xx is an answer; others are errors naming the object.
  absl::StatusOr<HttpResponse> Send(const HttpRequest& req, const std::string& rel) {
    ASSIGN_OR_RETURN(HttpResponse r, http_.Get(req));
    if (r.status < 200 || r.status > 299) return HttpError(r, Name(rel));
    return r;
  }
  static std::string Header(const HttpResponse& r, const std::string& name) {
    auto it = r.headers.find(name);
    return it == r.headers.end() ? "" : it->second;
  }

  const S3Location at_;
  const AwsCredentials creds_;
  HttpClient http_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WritableOrigin>> OpenWritableOrigin(const std::string& uri) {
  if (absl::StartsWith(uri, "s3://")) {
    ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(uri));
    ASSIGN_OR_RETURN(AwsCredentials creds, LoadAwsCredentials());
    return std::make_unique<S3WritableOrigin>(std::move(at), std::move(creds));
  }
  if (uri.empty() || uri[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("origin '", uri, "' is neither an absolute directory path nor s3://"));
  }
  return std::make_unique<DirOrigin>(uri);
}

absl::StatusOr<std::shared_ptr<WritableOrigin>> SharedWritableOrigin(const std::string& uri) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* opened = new std::map<std::string, std::shared_ptr<WritableOrigin>>();
  absl::MutexLock lock(&mu);
  if (auto it = opened->find(uri); it != opened->end()) return it->second;
  ASSIGN_OR_RETURN(std::unique_ptr<WritableOrigin> o, OpenWritableOrigin(uri));
  std::shared_ptr<WritableOrigin> shared = std::move(o);
  (*opened)[uri] = shared;
  return shared;
}

}  // namespace ember::origin
