// WriteBehind: stores filled blocks in the cache after their readers were answered.
//
// A fill hands its block here once the readers waiting on it have the bytes: the cache write
// (a page-cache copy that costs as much as the fetch on some machines) then happens while they
// go on. Writer threads take everything queued at once, claim the checksums of the blocks that
// need it in one directory call (ChecksumBook::Claim: first writer wins), then store the blocks
// in one batch (BlockCache::InsertMany, those the policy admits; reported to meta through the
// cache's change log). A block whose claim conflicts is not stored and leaves RecentBlocks (the
// book remembers it; later fills of it fail). Each write then settles its fill and ends it in
// SingleFlight. A writer finding only a few small blocks queued waits up to 50 ms for a batch
// of 256, unless someone waits for a write to settle (Hurry: a prefetch). The queue is bounded
// (1024 blocks, 64 MiB): when it is full the fill stores its block itself together with the
// oldest queued ones (a batch, as a writer would), which slows fills to the disk's pace.
//
// Thread-safe. The queue's mutex is held only to queue and take writes; nothing is called
// under it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_buffer.h"
#include "cachefs/cache/block_cache.h"
#include "cachefs/fetch/checksum_book.h"
#include "cachefs/fetch/recent_blocks.h"
#include "cachefs/fetch/single_flight.h"

namespace ember::cachefs {

class WriteBehind {
 public:
  // A filled block to store.
  struct Write {
    BlockAddr addr;
    uint64_t file_size = 0;
    uint64_t offset = 0;
    std::shared_ptr<const BlockBuffer> data;
    uint64_t checksum = 0;
    std::shared_ptr<Fill> fill;  // settled and ended in SingleFlight once stored
    bool claim = false;          // read from the origin with no checksum known: claim it first
    std::string where;           // "DATASET block N of PATH", for the log
    std::chrono::steady_clock::time_point submitted{};  // set by Submit
  };

  // Starts `threads` writers. Everything passed must outlive this.
  WriteBehind(BlockCache* cache, ChecksumBook* checksums, RecentBlocks* recent,
              SingleFlight* inflight, int threads);
  // Writers store what is queued, then end.
  ~WriteBehind();

  // Queues the write, or stores it now when the queue is full (or the writers are ending).
  void Submit(Write w) ABSL_LOCKS_EXCLUDED(mu_);
  // Someone waits for a queued write to settle: the writers take what is queued now instead of
  // waiting for a larger batch.
  void Hurry() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Claims the checksums of the writes that need it in one call, then stores each write (or,
  // on a conflict, nothing), settles its fill and ends it.
  void StoreAll(std::vector<Write>& ws) ABSL_LOCKS_EXCLUDED(mu_);
  void Writer() ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the oldest queued writes to `ws`: at most `max_writes`, and none once `max_bytes` are
  // taken.
  void TakeLocked(size_t max_writes, uint64_t max_bytes, std::vector<Write>* ws)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  BlockCache* const cache_;
  ChecksumBook* const checksums_;
  RecentBlocks* const recent_;
  SingleFlight* const inflight_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Write> writes_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool hurry_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> writers_;
};

}  // namespace ember::cachefs
