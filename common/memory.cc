#include "common/memory.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

// gperftools' C API (gperftools/malloc_extension_c.h), weak: absent unless tcmalloc is linked.
extern "C" void MallocExtension_ReleaseFreeMemory() __attribute__((weak));
extern "C" int MallocExtension_GetNumericProperty(const char* property, size_t* value)
    __attribute__((weak));

namespace ember {
namespace {

std::atomic<size_t> warm_reserve{0};  // free bytes ReleaseFreeMemory leaves (WarmAllocator)
std::atomic<bool> reserve_lost{false};

bool HaveTcmalloc() {
  return MallocExtension_ReleaseFreeMemory != nullptr &&
         MallocExtension_GetNumericProperty != nullptr;
}

}  // namespace

void ReleaseFreeMemory() {
  if (!HaveTcmalloc()) return;
  const size_t keep = warm_reserve.load(std::memory_order_relaxed);
  if (keep > 0) {
    // tcmalloc hands back whole spans, and the reserve's pages coalesce into one: a release of
    // any part (MallocExtension_ReleaseToSystem) may take all of it. So free memory up to the
    // reserve and kReleaseSlack more stays; beyond that all goes, and the reserve is lost.
    size_t free_bytes = 0;
    if (MallocExtension_GetNumericProperty("tcmalloc.pageheap_free_bytes", &free_bytes) == 0 ||
        free_bytes <= keep + kReleaseSlack) {
      return;
    }
    reserve_lost.store(true, std::memory_order_relaxed);
  }
  MallocExtension_ReleaseFreeMemory();
}

bool WarmReserveLost() { return reserve_lost.load(std::memory_order_relaxed); }

size_t WarmAllocator(size_t bytes, const std::atomic<bool>* stop) {
  if (!HaveTcmalloc()) return 0;
  constexpr size_t kChunk = 1u << 20;  // above tcmalloc's largest size class: whole pages
  constexpr size_t kPage = 4096;
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  reserve_lost.store(false, std::memory_order_relaxed);
  // Kept before the pages are touched: a release meanwhile (a namespace just built) keeps them.
  warm_reserve.store(chunks * kChunk, std::memory_order_relaxed);
  std::vector<char*> held;
  held.reserve(chunks);
  for (size_t i = 0; i < chunks; i++) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) break;
    char* c = static_cast<char*>(malloc(kChunk));
    if (c == nullptr) break;
    // One write per page faults it in; volatile so the writes are not dropped with the free.
    for (size_t off = 0; off < kChunk; off += kPage) static_cast<volatile char*>(c)[off] = 0;
    held.push_back(c);
  }
  for (char* c : held) free(c);
  warm_reserve.store(held.size() * kChunk, std::memory_order_relaxed);  // fewer if stopped
  return held.size() * kChunk;
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
