#include "cachefs/cache/block_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ember::cachefs {
namespace {

constexpr size_t kPoolMin = 1u << 20;        // smaller buffers come from malloc's own free lists
constexpr size_t kPoolMaxBytes = 64u << 20;  // idle bytes the pool may hold

struct Pool {
  absl::Mutex mu;
  std::vector<std::pair<char*, size_t>> idle
      ABSL_GUARDED_BY(mu);  // (buffer, capacity), newest last
  size_t idle_bytes ABSL_GUARDED_BY(mu) = 0;
};

Pool& GetPool() {
  static Pool* pool = new Pool;  // never destroyed: buffers may be freed during exit
  return *pool;
}

size_t Capacity(size_t size) {
  // Round large buffers up to 1 MiB so blocks of one size class share buffers.
  if (size < kPoolMin) return size == 0 ? BlockBuffer::kAlign : size;
  return (size + kPoolMin - 1) / kPoolMin * kPoolMin;
}

}  // namespace

BlockBuffer::BlockBuffer(size_t size, size_t room)
    : size_(size), capacity_(Capacity(std::max(size, room))) {
  if (capacity_ >= kPoolMin) {
    Pool& pool = GetPool();
    absl::MutexLock lock(&pool.mu);
    for (size_t i = pool.idle.size(); i-- > 0;) {
      if (pool.idle[i].second == capacity_) {
        data_ = pool.idle[i].first;
        pool.idle_bytes -= capacity_;
        pool.idle.erase(pool.idle.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
    }
  }
  void* p = nullptr;
  if (capacity_ < kAlign) {
    // Shorter than one O_DIRECT unit: it is written through the page cache anyway, and an
    // aligned allocation would take a page of its own (a tiny-file prefetch's 2.5 KB blocks
    // spent ~10% of an agent's CPU carving page-aligned spans in tcmalloc).
    p = malloc(capacity_);
    if (p == nullptr) throw std::bad_alloc();
  } else if (posix_memalign(&p, kAlign, capacity_) != 0) {
    throw std::bad_alloc();
  }
  data_ = static_cast<char*>(p);
}

BlockBuffer::~BlockBuffer() {
  if (capacity_ >= kPoolMin) {
    Pool& pool = GetPool();
    absl::MutexLock lock(&pool.mu);
    if (pool.idle_bytes + capacity_ <= kPoolMaxBytes) {
      pool.idle.emplace_back(data_, capacity_);
      pool.idle_bytes += capacity_;
      return;
    }
  }
  free(data_);
}

}  // namespace ember::cachefs
