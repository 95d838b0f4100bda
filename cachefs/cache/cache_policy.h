// CachePolicy: which block to evict, and whether a new block may enter a full cache at all.
//
// Why not plain LRU: training reads the whole dataset every epoch. When the dataset is larger
// than the cache, LRU evicts each block just before it is read again, so every epoch misses
// everything. This policy is LRU for the victim plus frequency-based admission (TinyLFU-style):
// a new block enters a full cache only if it has been asked for more often than the blocks it
// would evict. Under a cyclic scan all blocks are equally frequent, so the resident set stays
// put and every epoch after the first hits on cache/dataset of its reads (2/3 for a dataset 1.5x
// the cache), instead of 0. A block must be asked for at least two more times than its victims
// to displace them (see Admit). Frequencies age (halve) so a dataset that stops being read gives
// way to one that is read now. Not thread-safe: the owner (BlockCache) serializes calls.
#pragma once

#include <cstdint>
#include <vector>

namespace ember::cachefs {

// Count-min sketch of 4-bit counters with periodic halving.
class FrequencySketch {
 public:
  // `expected_items`: about how many distinct keys the cache holds.
  explicit FrequencySketch(uint64_t expected_items);
  void Increment(uint64_t hash);
  uint32_t Estimate(uint64_t hash) const;

 private:
  uint64_t Index(uint64_t hash, int row) const;
  std::vector<uint8_t> counters_;  // 4 rows
  uint64_t width_mask_;
  uint64_t additions_ = 0, sample_size_;
};

class CachePolicy {
 public:
  explicit CachePolicy(uint64_t expected_items) : sketch_(expected_items) {}
  // Every request for a block, hit or miss.
  void RecordAccess(uint64_t hash) { sketch_.Increment(hash); }
  // A full cache: admit `candidate` by evicting blocks whose largest frequency is `victim_max`?
  // The margin of one keeps a stray admission (a sketch collision) from cascading: otherwise the
  // block it evicted, missing on the next scan, would outrank the next not-yet-read victim, and
  // so on, which is LRU again.
  bool Admit(uint64_t candidate, uint32_t victim_max) const {
    return sketch_.Estimate(candidate) > victim_max + 1;
  }
  uint32_t Frequency(uint64_t hash) const { return sketch_.Estimate(hash); }

 private:
  FrequencySketch sketch_;
};

}  // namespace ember::cachefs
