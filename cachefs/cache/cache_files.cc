#include "cachefs/cache/cache_files.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ember::cachefs {
namespace {

constexpr size_t kDirectAlign = 4096;  // offset, length and memory alignment for O_DIRECT

// Writes all of data at offset; returns 0 or an errno.
int PwriteFull(int fd, const char* data, size_t len, uint64_t offset) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pwrite(fd, data + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno != EINTR) return errno;
    } else if (n == 0) {
      return EIO;
    } else {
      done += static_cast<size_t>(n);
    }
  }
  return 0;
}

// Writes data at offset through fd (opened with O_DIRECT, data 4 KiB-aligned in memory): the
// aligned part straight from data, then the unaligned tail with O_DIRECT cleared. 0 or an errno.
int DirectWrite(int fd, std::string_view data, uint64_t offset) {
  const size_t aligned = data.size() / kDirectAlign * kDirectAlign;
  if (int err = PwriteFull(fd, data.data(), aligned, offset); err != 0) return err;
  if (aligned == data.size()) return 0;
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) return errno;
  return PwriteFull(fd, data.data() + aligned, data.size() - aligned, offset + aligned);
}

}  // namespace

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

CacheFiles::CacheFiles(std::string dir, bool direct_writes)
    : dir_(std::move(dir)), direct_writes_(direct_writes) {}

std::string CacheFiles::FilePath(const BlockAddr& a) const {
  return absl::StrCat(dir_, "/blocks/", a.dataset_id, "/", a.version, "/", a.file_id);
}

int CacheFiles::WriteBlock(const BlockAddr& addr, uint64_t file_size, uint64_t offset,
                           std::string_view data) {
  const size_t len = data.size();
  std::string path = FilePath(addr);
  int err = 0;
  // O_DIRECT needs aligned memory: fills use BlockBuffers; other callers' bytes go buffered.
  bool direct = direct_writes_.load(std::memory_order_relaxed) && offset % kDirectAlign == 0 &&
                reinterpret_cast<uintptr_t>(data.data()) % kDirectAlign == 0;
  int flags = O_RDWR | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0);
  int fd = open(path.c_str(), flags, 0644);
  if (fd < 0 && errno == ENOENT) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    fd = open(path.c_str(), flags, 0644);
  }
  if (fd < 0 && direct && errno == EINVAL) {
    spdlog::info("cache: {} does not take O_DIRECT; writing blocks through the page cache", dir_);
    direct_writes_ = false;
    direct = false;
    fd = open(path.c_str(), flags & ~O_DIRECT, 0644);
  }
  if (fd < 0) return errno;
  struct stat st;
  if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < file_size &&
      ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
    err = errno;
  }
  if (err == 0) {
    err = direct ? DirectWrite(fd, data, offset) : PwriteFull(fd, data.data(), len, offset);
  }
  if (err == EINVAL && direct) {  // the file system takes O_DIRECT opens but not the writes
    spdlog::info("cache: O_DIRECT writes refused under {}; writing through the page cache", dir_);
    direct_writes_ = false;
    int fl = fcntl(fd, F_GETFL);
    err = fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0
              ? PwriteFull(fd, data.data(), len, offset)
              : errno;
  }
  if (err != 0) {
    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
              static_cast<off_t>(len));
  }
  close(fd);
  return err;
}

void CacheFiles::PunchHole(const BlockAddr& addr, uint64_t offset, uint32_t length) {
  int fd = open(FilePath(addr).c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                length) != 0) {
    spdlog::warn("cache: cannot punch hole in {}: {}", FilePath(addr), strerror(errno));
  }
  close(fd);
}

}  // namespace ember::cachefs
