#include "cachefs/cache/cache_policy.h"

#include <gtest/gtest.h>

#include "cachefs/cache/block_cache.h"
#include "tests/testing/testing.h"

namespace ember::cachefs {
namespace {

TEST(FrequencySketchTest, CountsAndAges) {
  FrequencySketch s(100);
  for (int i = 0; i < 5; i++) s.Increment(42);
  EXPECT_EQ(s.Estimate(42), 5u);
  EXPECT_EQ(s.Estimate(43), 0u);
  for (int i = 0; i < 40; i++) s.Increment(7);
  EXPECT_EQ(s.Estimate(7), 15u);  // saturates
  // Many other keys: counters halve, so old counts fade.
  for (uint64_t k = 1000; k < 20000; k++) s.Increment(k);
  EXPECT_LT(s.Estimate(7), 15u);
}

// A small cache whose few blocks all saturated (every read request counts an access) must still
// age: a new working set read as often must eventually outrank the old one.
TEST(FrequencySketchTest, SaturatedKeysStillAge) {
  FrequencySketch s(16);
  for (uint64_t k = 1; k <= 4; k++) {
    for (int i = 0; i < 40; i++) s.Increment(k);
  }
  EXPECT_EQ(s.Estimate(1), 15u);
  for (int i = 0; i < 2000; i++) s.Increment(5);  // one hot key, saturated after 15
  EXPECT_LT(s.Estimate(1), 8u);
}

// Repeated full scans of a dataset 1.5x the cache: plain LRU would hit 0% from the second scan
// on; this policy keeps the resident set and hits on about 2/3 of reads.
TEST(CachePolicyTest, RepeatedScansLargerThanCacheStillHit) {
  testing::TempDir dir;
  const uint32_t kBlock = 64 << 10;
  const int kCacheBlocks = 100, kDataBlocks = 150;
  BlockCache::Options o;
  o.dir = dir.path();
  o.capacity_bytes = uint64_t{kCacheBlocks} * kBlock;
  o.expected_block_size = kBlock;
  auto cache = BlockCache::Open(o);
  ASSERT_TRUE(cache.ok());
  std::string data(kBlock, 'x');
  for (int scan = 0; scan < 6; scan++) {
    int hits = 0;
    for (int b = 0; b < kDataBlocks; b++) {
      BlockAddr a{1, 1, 1, static_cast<uint64_t>(b)};
      if ((*cache)->Acquire(a)) {
        hits++;
      } else {
        (*cache)->Insert(a, uint64_t{kDataBlocks} * kBlock, uint64_t{kBlock} * b, data, 1);
      }
      ASSERT_LE((*cache)->GetStats().used_bytes, o.capacity_bytes);
    }
    double ratio = static_cast<double>(hits) / kDataBlocks;
    if (scan == 0) {
      EXPECT_EQ(hits, 0);
    } else {
      EXPECT_GE(ratio, 0.5) << "scan " << scan;
    }
  }
}

// A new hot dataset displaces one that is no longer read.
TEST(CachePolicyTest, NewWorkingSetEventuallyWins) {
  testing::TempDir dir;
  const uint32_t kBlock = 64 << 10;
  BlockCache::Options o;
  o.dir = dir.path();
  o.capacity_bytes = 50ull * kBlock;
  o.expected_block_size = kBlock;
  auto cache = BlockCache::Open(o);
  std::string data(kBlock, 'y');
  auto scan = [&](uint32_t ds) {
    int hits = 0;
    for (uint64_t b = 0; b < 40; b++) {
      BlockAddr a{ds, 1, 1, b};
      if ((*cache)->Acquire(a)) {
        hits++;
      } else {
        (*cache)->Insert(a, 40ull * kBlock, b * kBlock, data, 1);
      }
    }
    return hits;
  };
  for (int i = 0; i < 3; i++) scan(1);
  int last = 0;
  for (int i = 0; i < 8; i++) last = scan(2);
  EXPECT_GE(last, 30);
}

}  // namespace
}  // namespace ember::cachefs
