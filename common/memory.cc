#include "common/memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

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

}  // namespace ember
