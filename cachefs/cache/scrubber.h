// Scrubber: walks the whole cache at a bounded rate and checks every resident block against its
// checksum on the disk itself (BlockCache::ScrubBlock: O_DIRECT, past the page cache), so a
// block that rots where nobody reads it is found, quarantined and refilled before anyone needs
// it. A full pass at the default rate takes about a day for a full cache (longer for one of tiny
// blocks: the pace counts each block as at least 64 KiB, a disk read). Blocks a passthrough
// open is waiting for (checked since the agent started: see block_cache.h) are checked first,
// at full speed.
//
// Thread-safe; one thread of its own. One mutex guards the progress and the queue of blocks to
// check first; the cache is called with it released.
#pragma once

#include <cstdint>
#include <deque>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_cache.h"

namespace ember::cachefs {

class Scrubber {
 public:
  // `bytes_per_second`: the pace of the background pass; 0 = no background pass (blocks asked
  // for with CheckSoon are still checked).
  // REQUIRES: the cache outlives the scrubber.
  Scrubber(BlockCache* cache, uint64_t bytes_per_second);
  ~Scrubber();  // stops the thread

  // The default pace for a cache of `capacity` bytes: a full pass per day, at least 1 MiB/s.
  static uint64_t DefaultRate(uint64_t capacity);

  struct Progress {
    uint64_t bytes_per_second = 0;
    uint64_t passes = 0;      // background passes completed
    uint64_t pass_done = 0;   // blocks checked in the pass under way
    uint64_t pass_total = 0;  // resident blocks when it began
    uint64_t blocks = 0;      // blocks checked in all (background and asked for)
    uint64_t bytes = 0;
    uint64_t bad = 0;               // blocks found bad (quarantined)
    int64_t last_pass_unix_ms = 0;  // when the last pass ended (0: none yet)
  };
  Progress GetProgress();

  // Checks these blocks before the rest (a file waiting to be opened in passthrough).
  void CheckSoon(const std::vector<BlockAddr>& blocks);

 private:
  void Run();
  // Checks one block. Returns its length (0 if it was gone).
  uint64_t Check(const BlockAddr& addr, bool background);
  // Sleeps until `bytes` more fit the pace, or until asked to stop or a block is queued.
  void Pace(uint64_t bytes);

  BlockCache* const cache_;
  const uint64_t rate_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<BlockAddr> soon_ ABSL_GUARDED_BY(mu_);
  std::set<BlockAddr> queued_ ABSL_GUARDED_BY(mu_);
  Progress progress_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ember::cachefs
