// Handing freed memory back to the system, and buffers for bulk bytes and O_DIRECT I/O. The `ember`
// binary allocates with tcmalloc, which keeps freed pages for reuse; after a burst that frees much
// at once (a manifest loaded, a prefetch finished, a dataset added) the process's RSS would
// otherwise stay at the burst's peak. Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>

namespace ember {

// `size` bytes of new memory for blocks in flight (received, then handed on): in huge pages when
// `size` is a multiple of 2 MiB (a first write into each 4 KiB page costs a fault, on a VM an
// exit: 15% of a restoring node's CPU went to them), else from the allocator. Freed when the
// last owner lets go. Throws std::bad_alloc.
std::shared_ptr<char[]> NewBulkBuffer(size_t size);

// 2 MiB buffers for O_DIRECT I/O (huge-page aligned, so aligned for O_DIRECT), shared by the
// whole process: one per transfer under way, up to 8 kept between transfers. Memory touched
// before is what a copy into them costs least (see NewBulkBuffer), and one per connection or
// per thread would hold 2 MiB each of hundreds. Thread-safe. Throws std::bad_alloc.
inline constexpr size_t kDirectBufferBytes = 2u << 20;
std::shared_ptr<char[]> TakeDirectBuffer();
// Hands a buffer of TakeDirectBuffer back (kept for the next transfer, or freed).
void GiveDirectBuffer(std::shared_ptr<char[]> buf);

// Returns tcmalloc's free pages to the system now; nothing when tcmalloc is not linked in (tests,
// sanitizer builds). With a warm reserve (below): nothing while the free memory is at most the
// reserve and kReleaseSlack more; else all of it, the reserve too (WarmReserveLost).
void ReleaseFreeMemory();
inline constexpr size_t kReleaseSlack = 256u << 20;

// Faults `bytes` of the allocator's memory in now (1 MiB allocations, each page written, then
// freed: tcmalloc keeps the pages and carves later allocations of every size from them) and keeps
// that much free memory from then on (see ReleaseFreeMemory; tcmalloc's own gradual release must
// be off: the `ember` binary sets its release rate to 0, tools/ember_main.cc). A fill
// receives its bytes into buffers that a burst of fills takes from the allocator; on a VM a first
// write into a 4 KiB page is a fault and an exit (12 us a page on the test machine, against 21
// GB/s for a page written before), and a prefetch's first seconds grew each agent by ~400 MiB of
// them: ~10% of an ImageNet-shaped and ~30% of a tiny-file prefetch's wall (docs/benchmarks.md,
// "eighth session"). Blocks for the time it takes (about a second per 300 MiB on that VM); call
// it from a thread of its own. Stops early once `*stop` is true. Nothing without tcmalloc.
// Returns: the bytes now kept (0 without tcmalloc).
size_t WarmAllocator(size_t bytes, const std::atomic<bool>* stop = nullptr);
// Whether a release since the last WarmAllocator took the reserve (call WarmAllocator again).
bool WarmReserveLost();

}  // namespace ember
