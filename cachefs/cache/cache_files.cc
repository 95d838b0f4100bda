#include "cachefs/cache/cache_files.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/memory.h"

namespace ember::cachefs {
namespace {

constexpr size_t kDirectAlign = 4096;  // offset, length and memory alignment for O_DIRECT

uint64_t AlignUp(uint64_t n) { return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

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

bool PreadCached(int fd, uint64_t offset, size_t len, char* buf) {
  size_t done = 0;
  while (done < len) {
    iovec iov{buf + done, len - done};
    ssize_t n = preadv2(fd, &iov, 1, static_cast<off_t>(offset + done), RWF_NOWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // EAGAIN: some page is not in the page cache
    done += static_cast<size_t>(n);
  }
  return true;
}

uint64_t ChangeStamp(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ctim.tv_sec) * 1'000'000'000u +
         static_cast<uint64_t>(st.st_ctim.tv_nsec);
}

CacheFiles::CacheFiles(std::string dir, bool direct_writes)
    : dir_(std::move(dir)), direct_writes_(direct_writes) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/segments", ec)) {
    uint32_t n = 0;
    if (absl::SimpleAtoi(e.path().filename().string(), &n)) {
      absl::MutexLock lock(&seg_mu_);
      last_segment_ = std::max(last_segment_, n);
    }
  }
}

std::string CacheFiles::FilePath(const BlockAddr& a, uint32_t segment) const {
  if (segment != 0) return SegmentPath(segment);
  return absl::StrCat(dir_, "/blocks/", a.dataset_id, "/", a.version, "/", a.file_id);
}

std::string CacheFiles::SegmentPath(uint32_t segment) const {
  return absl::StrCat(dir_, "/segments/", segment);
}

int CacheFiles::NextSegmentLocked() {
  std::error_code ec;
  std::filesystem::create_directories(dir_ + "/segments", ec);
  const uint32_t next = last_segment_ + 1;
  const std::string path = SegmentPath(next);
  int f = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f < 0) return errno;
  auto closer = [](const int* p) {
    close(*p);
    delete p;
  };
  last_segment_ = active_ = next;
  active_end_ = 0;
  active_fd_ = std::shared_ptr<const int>(new int(f), closer);
  active_direct_fd_ = nullptr;
  if (direct_writes_.load(std::memory_order_relaxed)) {
    int d = open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (d >= 0) {
      active_direct_fd_ = std::shared_ptr<const int>(new int(d), closer);
    } else if (errno == EINVAL) {
      direct_writes_ = false;
      spdlog::info("cache: {} refuses O_DIRECT; segments are written through the page cache", dir_);
    }
  }
  return 0;
}

int CacheFiles::ClaimSmall(const std::vector<size_t>& lens, std::vector<SmallSlot>* slots) {
  uint64_t total = 0;
  for (size_t len : lens) total += len;
  slots->assign(lens.size(), SmallSlot{});
  absl::MutexLock lock(&seg_mu_);
  const bool direct = total >= kDirectRunMin && direct_writes_.load(std::memory_order_relaxed);
  if (direct) active_end_ = AlignUp(active_end_);
  for (size_t i = 0; i < lens.size(); i++) {
    if (active_fd_ == nullptr || active_end_ + lens[i] > kSegmentBytes) {
      if (int err = NextSegmentLocked(); err != 0) return err;
    }
    SmallSlot& slot = (*slots)[i];
    slot.segment = active_;
    slot.offset = active_end_;
    slot.fd = active_fd_;
    if (direct) slot.direct_fd = active_direct_fd_;
    active_end_ += lens[i];
  }
  if (direct) active_end_ = AlignUp(active_end_);
  return 0;
}

int CacheFiles::WriteDirectRun(int fd, uint64_t start, const std::vector<std::string_view>& data) {
  std::shared_ptr<char[]> buf = TakeDirectBuffer();
  size_t filled = 0;
  uint64_t at = start;
  int err = 0;
  for (std::string_view d : data) {
    for (size_t off = 0; off < d.size() && err == 0;) {
      const size_t n = std::min(d.size() - off, kDirectBufferBytes - filled);
      memcpy(buf.get() + filled, d.data() + off, n);
      filled += n;
      off += n;
      if (filled == kDirectBufferBytes) {
        err = PwriteFull(fd, buf.get(), filled, at);
        at += filled;
        filled = 0;
      }
    }
  }
  if (err == 0 && filled > 0) {  // the last piece padded to its 4 KiB boundary (claimed too)
    const size_t padded = AlignUp(filled);
    memset(buf.get() + filled, 0, padded - filled);
    err = PwriteFull(fd, buf.get(), padded, at);
  }
  GiveDirectBuffer(std::move(buf));
  return err;
}

int CacheFiles::WriteSmallRun(const std::vector<const SmallSlot*>& slots,
                              const std::vector<std::string_view>& data, uint64_t* stamp) {
  const int fd = *slots.front()->fd;
  const uint64_t start = slots.front()->offset;
  uint64_t len = 0;
  for (std::string_view d : data) len += d.size();
  if (const auto& direct = slots.front()->direct_fd; direct != nullptr) {
    int err = WriteDirectRun(*direct, start, data);
    if (err != EINVAL) {
      if (err != 0) {
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(start),
                  static_cast<off_t>(AlignUp(len)));
      }
      *stamp = ChangeStamp(fd);
      return err;
    }
    // Opened with O_DIRECT but refused the write: this run and the ones after go buffered.
    if (direct_writes_.exchange(false)) {
      spdlog::info("cache: {} refuses O_DIRECT writes; segments go through the page cache", dir_);
    }
  }
  std::vector<struct iovec> iov;
  iov.reserve(data.size());
  for (std::string_view d : data) iov.push_back({const_cast<char*>(d.data()), d.size()});
  int err = 0;
  // pwritev of up to IOV_MAX pieces at a time, resumed after a short write.
  size_t first = 0;
  uint64_t at = start;
  while (first < iov.size()) {
    const int n = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    ssize_t w = pwritev(fd, iov.data() + first, n, static_cast<off_t>(at));
    if (w < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (w == 0) {
      err = EIO;
      break;
    }
    at += static_cast<uint64_t>(w);
    while (first < iov.size() && static_cast<uint64_t>(w) >= iov[first].iov_len) {
      w -= static_cast<ssize_t>(iov[first].iov_len);
      first++;
    }
    if (first < iov.size() && w > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + w;
      iov[first].iov_len -= static_cast<size_t>(w);
    }
  }
  if (err != 0) {
    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(start),
              static_cast<off_t>(len));
  }
  // Start the writeback of each 8 MiB the appends complete (as RocksDB's bytes_per_sync): the
  // disk writes while the fill goes on, instead of the whole fill becoming dirty pages written
  // later (in the way of the reads that follow).
  constexpr uint64_t kWriteBehind = 8u << 20;
  const uint64_t end = start + len;
  if (err == 0 && end / kWriteBehind != start / kWriteBehind) {
    const uint64_t from = start / kWriteBehind * kWriteBehind;
    const uint64_t upto = end / kWriteBehind * kWriteBehind;
    sync_file_range(fd, static_cast<off_t>(from), static_cast<off_t>(upto - from),
                    SYNC_FILE_RANGE_WRITE);
  }
  *stamp = ChangeStamp(fd);
  return err;
}

uint32_t CacheFiles::ActiveSegment() {
  absl::MutexLock lock(&seg_mu_);
  return active_;
}

bool CacheFiles::RemoveSegment(uint32_t segment) {
  {
    absl::MutexLock lock(&seg_mu_);
    if (segment == active_) return false;
  }
  if (unlink(SegmentPath(segment).c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("cache: cannot delete empty segment {}: {}", SegmentPath(segment),
                 strerror(errno));
  }
  return true;
}

int CacheFiles::WriteBlock(const BlockAddr& addr, uint64_t file_size, uint64_t offset,
                           std::string_view data, uint64_t* stamp) {
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
  *stamp = ChangeStamp(fd);
  close(fd);
  return err;
}

uint64_t CacheFiles::PunchHole(const BlockAddr& addr, uint32_t segment, uint64_t offset,
                               uint32_t length) {
  int fd = open(FilePath(addr, segment).c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                length) != 0) {
    spdlog::warn("cache: cannot punch hole in {}: {}", FilePath(addr, segment), strerror(errno));
  }
  const uint64_t stamp = ChangeStamp(fd);
  close(fd);
  return stamp;
}

bool CacheFiles::ReadFromDisk(const BlockAddr& addr, uint32_t segment, uint64_t offset, size_t len,
                              char* buf) {
  const std::string path = FilePath(addr, segment);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  const bool direct = fd >= 0;
  if (fd < 0) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);  // no O_DIRECT here
  if (fd < 0) return false;
  bool ok;
  if (direct && offset % kDirectAlign == 0) {
    ok = PreadDirectFull(fd, offset, len, buf);  // the last block of a file reads short past it
  } else if (direct) {
    // An object packed into a segment: read its pages whole into an aligned buffer.
    const uint64_t start = offset / kDirectAlign * kDirectAlign;
    const size_t span = AlignUp(offset + len - start);
    void* tmp = nullptr;
    ok = posix_memalign(&tmp, kDirectAlign, span) == 0;
    size_t done = 0;
    while (ok && done < offset + len - start) {
      ssize_t n =
          pread(fd, static_cast<char*>(tmp) + done, span - done, static_cast<off_t>(start + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ok = false;
      if (n > 0) done += static_cast<size_t>(n);
    }
    if (ok) std::memcpy(buf, static_cast<char*>(tmp) + (offset - start), len);
    free(tmp);
  } else {
    ok = PreadFull(fd, offset, len, buf);
  }
  close(fd);
  return ok;
}

}  // namespace ember::cachefs
