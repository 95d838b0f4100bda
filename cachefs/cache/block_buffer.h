// The bytes of one block in memory, as a fill receives them: 4 KiB-aligned when at least 4 KiB
// long (the cache writes them with O_DIRECT straight from here; shorter ones go through the page
// cache and come from malloc's free lists) and not zero-filled first (a fill overwrites every
// byte).
// Large buffers are recycled through a small pool: a fresh 16 MiB allocation is 4,096 page
// faults, which cost a cold read as much as receiving the bytes.
//
// Thread-safety: a buffer has one writer (its fill), then is shared read-only (const) by the
// readers, the recent blocks and the cache write. The pool is thread-safe.
#pragma once

#include <cstddef>
#include <string_view>

namespace ember::cachefs {

class BlockBuffer {
 public:
  static constexpr size_t kAlign = 4096;

  explicit BlockBuffer(size_t size) : BlockBuffer(size, size) {}
  // Room for `room` bytes (at least `size`): an O_DIRECT read into it may write whole pages.
  BlockBuffer(size_t size, size_t room);
  ~BlockBuffer();
  BlockBuffer(const BlockBuffer&) = delete;
  BlockBuffer& operator=(const BlockBuffer&) = delete;

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  size_t room() const { return capacity_; }
  std::string_view view() const { return {data_, size_}; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace ember::cachefs
