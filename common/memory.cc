#include "common/memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

// gperftools' C API (gperftools/malloc_extension_c.h), weak: absent unless tcmalloc is linked.
extern "C" void MallocExtension_ReleaseFreeMemory() __attribute__((weak));

namespace ember {

void ReleaseFreeMemory() {
  if (MallocExtension_ReleaseFreeMemory != nullptr) MallocExtension_ReleaseFreeMemory();
}

std::shared_ptr<char[]> NewBulkBuffer(size_t size) {
  constexpr size_t kHuge = 2u << 20;
  if (size == 0 || size % kHuge != 0) return std::shared_ptr<char[]>(new char[size]);
  void* m = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  // Aligned to a huge page: the slop before and after goes back.
  const uintptr_t at = (reinterpret_cast<uintptr_t>(m) + kHuge - 1) & ~(kHuge - 1);
  const size_t head = at - reinterpret_cast<uintptr_t>(m);
  if (head > 0) munmap(m, head);
  if (kHuge - head > 0) munmap(reinterpret_cast<char*>(at) + size, kHuge - head);
  char* p = reinterpret_cast<char*>(at);
  (void)madvise(p, size, MADV_HUGEPAGE);
  return std::shared_ptr<char[]>(p, [size](char* q) { munmap(q, size); });
}

namespace {

constexpr size_t kKeptDirectBuffers = 8;
absl::Mutex direct_mu(absl::kConstInit);
std::vector<std::shared_ptr<char[]>>& KeptDirectBuffers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(direct_mu) {
  static auto* kept = new std::vector<std::shared_ptr<char[]>>();  // never destroyed
  return *kept;
}

}  // namespace

std::shared_ptr<char[]> TakeDirectBuffer() {
  {
    absl::MutexLock lock(&direct_mu);
    if (!KeptDirectBuffers().empty()) {
      std::shared_ptr<char[]> buf = std::move(KeptDirectBuffers().back());
      KeptDirectBuffers().pop_back();
      return buf;
    }
  }
  return NewBulkBuffer(kDirectBufferBytes);
}

void GiveDirectBuffer(std::shared_ptr<char[]> buf) {
  absl::MutexLock lock(&direct_mu);
  if (KeptDirectBuffers().size() < kKeptDirectBuffers) {
    KeptDirectBuffers().push_back(std::move(buf));
  }
}

}  // namespace ember
