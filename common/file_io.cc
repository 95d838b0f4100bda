#include "common/file_io.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ember {

bool PreadFull(int fd, uint64_t offset, size_t len, char* buf) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool PreadDirectFull(int fd, uint64_t offset, size_t len, char* buf) {
  const size_t padded = (len + 4095) / 4096 * 4096;
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, buf + done, padded - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = 0;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool PwriteFull(int fd, uint64_t offset, const char* buf, size_t len) {
  while (len > 0) {
    ssize_t n = pwrite(fd, buf, len, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf += n;
    len -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

absl::Status SyncPath(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  int err = 0;
  if (fsync(fd) != 0) err = errno;
  close(fd);
  if (err != 0)
    return absl::UnavailableError(absl::StrCat("cannot sync ", path, ": ", strerror(err)));
  return absl::OkStatus();
}

std::optional<bool> PagesCached(int fd, uint64_t offset, size_t len) {
  // linux/mman.h of 6.5+; Debian bookworm's headers predate it. 451 on every architecture.
  struct Range {
    uint64_t off, len;
  } range{offset, len};
  struct Stat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
  } st{};
  constexpr long kCachestat = 451;
  if (len == 0) return true;
  if (syscall(kCachestat, fd, &range, &st, 0) != 0) return std::nullopt;
  const uint64_t first = offset / 4096, last = (offset + len + 4095) / 4096;
  return st.nr_cache >= last - first;
}

}  // namespace ember
