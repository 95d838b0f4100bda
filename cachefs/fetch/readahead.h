// Readahead: fills the blocks ahead of a sequential reader on background threads, before the
// reader asks for them.
//
// A ReadStream is one open file's reading state: where a sequential reader reads next, how far
// ahead its window is queued, and the block the reader is in, so the cache policy counts a block
// once per visit of a reader, not once per kernel request (one read of a block is 4-32
// requests, which saturated every block's frequency at once, so no block ever looked hotter than
// another). ReadPath::OpenStream hands one out per open file; the FUSE binding keeps it with the
// open file (DatasetFs's FileHandle).
//
// The queue is bounded (64 blocks); blocks resident or in flight are not queued, and a window's
// blocks are located on peers in one call (PeerFetcher::LocateAhead).
//
// Thread-safe. The queue's mutex and a stream's mutex are each held only around their own
// fields; nothing is called under them.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_cache.h"
#include "cachefs/fetch/file_ref.h"
#include "cachefs/fetch/peer_fetcher.h"
#include "cachefs/fetch/single_flight.h"

namespace ember::cachefs {

class ReadStream {
 public:
  explicit ReadStream(FileRef file) : file_(std::move(file)) {}

  const FileRef& file() const { return file_; }
  // Records a read of [offset, offset+size): a sequential reader gets the blocks of its window
  // ahead of it queued, once per block boundary crossed. The window starts at `min_window`
  // blocks and doubles each time the reader enters a block that was read ahead, up to
  // `max_window`; a read elsewhere starts it again.
  // Returns: the first block to read ahead and how many (0: none).
  std::pair<uint64_t, int> Advance(uint64_t offset, size_t size, int min_window, int max_window)
      ABSL_LOCKS_EXCLUDED(mu_);
  int window() ABSL_LOCKS_EXCLUDED(mu_);
  // Returns: true if the reader entered block `index` now (a new visit, which the policy counts).
  bool Enter(uint64_t index) { return last_block_.exchange(index) != index; }

 private:
  const FileRef file_;
  absl::Mutex mu_;
  uint64_t next_offset_ ABSL_GUARDED_BY(mu_) = 0;     // the furthest a sequential reader got
  uint64_t readahead_next_ ABSL_GUARDED_BY(mu_) = 0;  // first block not yet queued
  uint64_t reader_block_ ABSL_GUARDED_BY(mu_) = 0;    // the block the reader reached last
  int window_ ABSL_GUARDED_BY(mu_) = 0;               // blocks; 0 until a sequential read
  std::atomic<uint64_t> last_block_{UINT64_MAX};
};

class Readahead {
 public:
  // Fills one block (without counting an access: the reader's visit counts).
  using FillFn = std::function<void(const FileRef& file, uint64_t index)>;
  // Starts `threads` workers. `peers` may be null. Everything passed must outlive this.
  Readahead(BlockCache* cache, SingleFlight* inflight, PeerFetcher* peers, int threads,
            FillFn fill);
  // Ends the workers; blocks still queued are not filled.
  ~Readahead();

  // Queues fills of blocks [first, first+count) that are neither resident nor in flight.
  void Queue(const FileRef& file, uint64_t first, int count) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Worker() ABSL_LOCKS_EXCLUDED(mu_);

  BlockCache* const cache_;
  SingleFlight* const inflight_;
  PeerFetcher* const peers_;
  const FillFn fill_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<std::pair<FileRef, uint64_t>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace ember::cachefs
