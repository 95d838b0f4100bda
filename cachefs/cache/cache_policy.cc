#include "cachefs/cache/cache_policy.h"

#include <algorithm>

namespace ember::cachefs {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace

FrequencySketch::FrequencySketch(uint64_t expected_items) {
  // About four counters per cached block in each of 4 rows, at most 4 x 8 MiB of counters.
  uint64_t width = 64;
  while (width < expected_items * 4 && width < (8ull << 20)) width <<= 1;
  counters_.assign(width * 4, 0);
  width_mask_ = width - 1;
  sample_size_ = width * 10;
}

uint64_t FrequencySketch::Index(uint64_t hash, int row) const {
  return static_cast<uint64_t>(row) * (width_mask_ + 1) +
         (Mix(hash + 0x9e3779b97f4a7c15ull * (row + 1)) & width_mask_);
}

void FrequencySketch::Increment(uint64_t hash) {
  // Conservative update: only the smallest counters grow, which keeps estimates tight.
  uint32_t est = Estimate(hash);
  if (est < 15) {
    for (int r = 0; r < 4; r++) {
      uint8_t& c = counters_[Index(hash, r)];
      if (c == est) c++;
    }
  }
  // Every access ticks the aging clock, also of saturated keys: otherwise a cache whose blocks
  // all reached the maximum would never age and never admit a new working set.
  if (++additions_ >= sample_size_) {
    for (auto& c : counters_) c >>= 1;
    additions_ /= 2;
  }
}

uint32_t FrequencySketch::Estimate(uint64_t hash) const {
  uint32_t m = 15;
  for (int r = 0; r < 4; r++) m = std::min<uint32_t>(m, counters_[Index(hash, r)]);
  return m;
}

}  // namespace ember::cachefs
