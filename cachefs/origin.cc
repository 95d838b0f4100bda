#include "cachefs/origin.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
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

// Opens root/rel for reading without following any symlink below root and without leaving it
// (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS): a directory swapped for a symlink after the
// scan cannot make a fill read bytes from outside the origin. Kernels without openat2 (< 5.6)
// fall back to O_NOFOLLOW on the last component. Returns an fd or -1 with errno.
int OpenBeneath(const std::string& root, const std::string& rel) {
  static std::atomic<bool> have_openat2{true};
  if (have_openat2.load(std::memory_order_relaxed)) {
    int dir = open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return -1;
    struct open_how how {};
    how.flags = O_RDONLY | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    int fd = static_cast<int>(syscall(SYS_openat2, dir, rel.c_str(), &how, sizeof(how)));
    int err = errno;
    close(dir);
    if (fd >= 0 || err != ENOSYS) {
      errno = err;
      return fd;
    }
    have_openat2 = false;
  }
  return open(absl::StrCat(root, "/", rel).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
}

class PosixOrigin final : public Origin {
 public:
  absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) override {
    std::string full = absl::StrCat(file.root, "/", file.path);
    if (HasDotDot(file.path)) {
      return absl::InvalidArgumentError(absl::StrCat("path escapes the origin: ", file.path));
    }
    int fd = OpenBeneath(file.root, file.path);
    if (fd < 0) {
      int err = errno;
      std::string msg = absl::StrCat("origin file ", full, ": ",
                                     err == ELOOP || err == EXDEV
                                         ? "a symlink on the way (not followed out of the origin)"
                                         : strerror(err));
      if (err == ELOOP || err == EXDEV) return absl::FailedPreconditionError(msg);
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
