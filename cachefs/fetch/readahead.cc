#include "cachefs/fetch/readahead.h"

#include <algorithm>

namespace ember::cachefs {
namespace {
constexpr size_t kMaxQueuedReadahead = 64;
}

int ReadStream::window() {
  absl::MutexLock lock(&mu_);
  return window_;
}

std::pair<uint64_t, int> ReadStream::Advance(uint64_t offset, size_t size, int min_window,
                                             int max_window) {
  const uint64_t bs = file_.block_size;
  absl::MutexLock lock(&mu_);
  // Within a block of where the reader was: the kernel's requests of one sequential reader
  // arrive a little out of order.
  const bool sequential = offset + bs >= next_offset_ && offset <= next_offset_ + bs;
  next_offset_ = sequential ? std::max(next_offset_, offset + size) : offset + size;
  const uint64_t next_block = (next_offset_ + bs - 1) / bs;
  const uint64_t block = (offset + size - (size > 0 ? 1 : 0)) / bs;
  if (!sequential || min_window <= 0) {
    window_ = 0;  // a jump: start small again, from here
    reader_block_ = block;
    readahead_next_ = 0;
    return {0, 0};
  }
  if (window_ == 0) {
    window_ = min_window;
  } else if (block > reader_block_ && block < readahead_next_) {
    window_ = std::min(std::max(window_ * 2, min_window), std::max(max_window, min_window));
  }
  reader_block_ = std::max(reader_block_, block);
  const int window = window_;
  if (next_block + window <= readahead_next_) return {0, 0};
  const uint64_t first = std::max(next_block, readahead_next_);
  readahead_next_ = next_block + window;
  if (first == 0) return {0, 0};  // an empty read at offset 0: nothing crossed
  return {first, static_cast<int>(readahead_next_ - first)};
}

Readahead::Readahead(BlockCache* cache, SingleFlight* inflight, PeerFetcher* peers, int threads,
                     FillFn fill)
    : cache_(cache), inflight_(inflight), peers_(peers), fill_(std::move(fill)) {
  for (int i = 0; i < threads; i++) workers_.emplace_back([this] { Worker(); });
}

Readahead::~Readahead() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void Readahead::Queue(const FileRef& file, uint64_t first, int count) {
  // What is resident or in flight is looked at before taking the queue's lock (a block that
  // turns resident meanwhile is skipped by the worker).
  std::vector<uint64_t> wanted;
  const uint64_t blocks = file.Blocks();
  for (uint64_t i = first; i < first + count && i < blocks; i++) {
    if (wanted.size() >= kMaxQueuedReadahead) break;
    const BlockAddr addr = file.Block(i);
    if (!cache_->Resident(addr) && !inflight_->InFlight(addr)) wanted.push_back(i);
  }
  if (wanted.empty()) return;  // the common case of a small file's read: no wake-up at all
  std::vector<BlockAddr> queued;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t i : wanted) {
      if (queue_.size() >= kMaxQueuedReadahead) break;
      queue_.emplace_back(file, i);
      queued.push_back(file.Block(i));
    }
  }
  // One worker per queued block (waking them all for one block cost every small read a
  // futex storm: 18% of the agent's time in a tiny-file epoch).
  for (size_t n = 0; n < queued.size(); n++) cv_.Signal();
  // One Locate for the whole readahead window.
  if (peers_ != nullptr && !queued.empty()) peers_->LocateAhead(queued);
}

void Readahead::Worker() {
  while (true) {
    std::pair<FileRef, uint64_t> job;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    if (cache_->Resident(job.first.Block(job.second))) continue;
    fill_(job.first, job.second);
  }
}

}  // namespace ember::cachefs
