#include "cachefs/origin.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ember::cachefs {
namespace {

bool HasDotDot(const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (path.compare(start, end - start, "..") == 0) return true;
    start = end + 1;
  }
  return false;
}

class PosixOrigin final : public Origin {
 public:
  absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) override {
    std::string full = absl::StrCat(file.root, "/", file.path);
    if (HasDotDot(file.path)) {
      return absl::InvalidArgumentError(absl::StrCat("path escapes the origin: ", file.path));
    }
    int fd = open(full.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      std::string msg = absl::StrCat("origin file ", full, ": ", strerror(err));
      return err == ENOENT ? absl::NotFoundError(msg) : absl::UnavailableError(msg);
    }
    absl::Status st = ReadFd(fd, full, file, offset, len, buf);
    close(fd);
    return st;
  }

 private:
  static absl::Status ReadFd(int fd, const std::string& full, const OriginFile& file,
                             uint64_t offset, size_t len, char* buf) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
      return absl::UnavailableError(absl::StrCat("origin file ", full, ": ", strerror(errno)));
    }
    int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != file.size ||
        mtime != file.mtime_ns) {
      return absl::FailedPreconditionError(
          absl::StrCat("origin file ", full, " changed since this dataset version was taken"));
    }
    size_t done = 0;
    while (done < len) {
      ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(absl::StrCat("origin file ", full, ": ", strerror(errno)));
      }
      if (n == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("origin file ", full, " is shorter than its manifest says"));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Origin> NewPosixOrigin() { return std::make_unique<PosixOrigin>(); }

}  // namespace ember::cachefs
