#include "common/file_io.h"

#include <unistd.h>

#include <cerrno>

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

}  // namespace ember
