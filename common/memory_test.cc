// Built only where the binary has tcmalloc (common/CMakeLists.txt): the warm reserve is
// tcmalloc's free pages.
#include "common/memory.h"

#include <gperftools/malloc_extension.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace ember {
namespace {

constexpr size_t kMiB = 1u << 20;

size_t RssBytes() {
  long pages = 0, resident = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// At least `bytes` in allocations of len_of(i) bytes, each page written.
template <typename LenOf>
std::vector<char*> Touched(size_t bytes, LenOf len_of) {
  std::vector<char*> out;
  for (size_t i = 0, got = 0; got < bytes; i++) {
    const size_t len = len_of(i);
    char* b = static_cast<char*>(malloc(len));
    if (b == nullptr) break;
    for (size_t off = 0; off < len; off += 4096) static_cast<volatile char*>(b)[off] = 1;
    out.push_back(b);
    got += len;
  }
  return out;
}

void Burst(size_t bytes) {  // allocated, each page written, freed
  for (char* c : Touched(bytes, [](size_t) { return kMiB; })) free(c);
}

TEST(WarmAllocatorTest, KeptPagesServeLaterAllocationsWithoutFaultsUntilTheReserveIsDropped) {
  MallocExtension::instance()->SetMemoryReleaseRate(0);  // as the `ember` binary does
  ReleaseFreeMemory();
  const size_t before = RssBytes();
  ASSERT_EQ(WarmAllocator(96 * kMiB), 96 * kMiB);
  EXPECT_GE(RssBytes(), before + 90 * kMiB);
  ReleaseFreeMemory();  // what a finished prefetch does: the reserve stays
  EXPECT_GE(RssBytes(), before + 90 * kMiB);
  // A burst beyond the reserve, within the slack: kept too (tcmalloc would hand back the
  // reserve's span with any part of it).
  Burst(160 * kMiB);
  ReleaseFreeMemory();
  EXPECT_GE(RssBytes(), before + 90 * kMiB);
  EXPECT_FALSE(WarmReserveLost());

  // Blocks of many sizes, as fills take them, come from the warm pages: writing them faults
  // (almost) nothing in. Without the warm pages it would be one fault per 4 KiB page, 16k here.
  const long faults = MinorFaults();
  std::vector<char*> blocks =
      Touched(64 * kMiB, [](size_t i) { return 8192 + (i * 7919) % (200 * 1024); });
  EXPECT_LT(MinorFaults() - faults, 2000);
  for (char* b : blocks) free(b);

  // A burst beyond the slack: all of it goes back, the reserve with it, and says so; warming
  // again restores it.
  Burst(96 * kMiB + kReleaseSlack + 64 * kMiB);
  ReleaseFreeMemory();
  EXPECT_TRUE(WarmReserveLost());
  EXPECT_LT(RssBytes(), before + 64 * kMiB);
  ASSERT_EQ(WarmAllocator(96 * kMiB), 96 * kMiB);
  EXPECT_FALSE(WarmReserveLost());
  EXPECT_GE(RssBytes(), before + 90 * kMiB);

  // No reserve: a release hands the pages back.
  EXPECT_EQ(WarmAllocator(0), 0u);
  ReleaseFreeMemory();
  EXPECT_LT(RssBytes(), before + 64 * kMiB);
}

TEST(WarmAllocatorTest, StopsEarlyWhenAsked) {
  std::atomic<bool> stop{true};
  EXPECT_EQ(WarmAllocator(64 * kMiB, &stop), 0u);
}

}  // namespace
}  // namespace ember
