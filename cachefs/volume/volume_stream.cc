// VolumeStream (volume_stream.h): a reader's blocks fetched from the holders into memory.
#include "cachefs/volume/volume_stream.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <new>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/memory.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {

// Buffers of dropped blocks, of every stream (VolumeStream::kBufferPool, kBufferIdle), newest
// last.
class BufferPool {
 public:
  static BufferPool& Get() {
    static BufferPool* const pool = new BufferPool();  // never destroyed: streams may outlive
    return *pool;                                      // static destruction
  }
  // A pooled buffer of `size` bytes no reply holds any more; nullptr if none.
  std::shared_ptr<char[]> Take(size_t size) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    TrimLocked(absl::Now());
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
      if (it->size == size && it->buf.use_count() == 1) {
        std::shared_ptr<char[]> buf = std::move(it->buf);
        bytes_ -= size;
        kept_.erase(std::next(it).base());
        return buf;
      }
    }
    return nullptr;
  }
  void Give(std::shared_ptr<char[]> buf, size_t size) ABSL_LOCKS_EXCLUDED(mu_) {
    if (buf == nullptr) return;
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&mu_);
    bytes_ += size;
    kept_.push_back(Kept{std::move(buf), size, now});
    TrimLocked(now);
  }
  void Trim() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    TrimLocked(absl::Now());
  }

 private:
  struct Kept {
    std::shared_ptr<char[]> buf;
    size_t size = 0;
    absl::Time since;
  };
  void TrimLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!kept_.empty() && (bytes_ > VolumeStream::kBufferPool ||
                              now - kept_.front().since > VolumeStream::kBufferIdle)) {
      bytes_ -= kept_.front().size;
      kept_.pop_front();
    }
  }
  absl::Mutex mu_;
  std::deque<Kept> kept_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

VolumeStream::VolumeStream(std::string name, uint64_t file_id, uint64_t size, uint64_t block_size,
                           std::vector<uint64_t> sums, std::vector<Source> sources)
    : name_(std::move(name)),
      file_id_(file_id),
      size_(size),
      block_size_(block_size),
      sums_(std::move(sums)),
      sources_(std::move(sources)) {}

VolumeStream::~VolumeStream() {
  std::vector<std::thread> workers;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    workers.swap(workers_);
  }
  for (auto& t : workers) t.join();
  absl::MutexLock lock(&mu_);
  for (auto& [b, blk] : blocks_) BufferPool::Get().Give(std::move(blk.buf), block_size_);
}

void VolumeStream::ReleaseIdleBuffers() { BufferPool::Get().Trim(); }

void VolumeStream::WantLocked(uint64_t b) {
  if (b >= sums_.size() || blocks_.count(b) > 0) return;
  blocks_[b] = Block{};
  ahead_.insert(b);
}

std::shared_ptr<char[]> VolumeStream::BufferLocked() {
  // A dropped block's buffer (this stream's or a closed one's) once no reply holds it.
  if (std::shared_ptr<char[]> buf = BufferPool::Get().Take(block_size_); buf != nullptr) {
    return buf;
  }
  // New memory, in huge pages (restore of 4 x 512 MiB, alternating: 1.37-1.42 s and 1.69 CPU-s
  // on the reading node with 4 KiB pages, 1.28-1.30 s and 1.21-1.29 CPU-s with huge pages).
  return NewBulkBuffer(block_size_);
}

std::vector<absl::Status> VolumeStream::FetchChecked(std::vector<VolumeStore::Piece>& pieces) {
  std::vector<absl::Status> st(pieces.size(), absl::UnavailableError("no source to read from"));
  std::vector<std::string> why(pieces.size());
  for (const Source& src : sources_) {
    std::vector<VolumeStore::Piece> ask;
    std::vector<size_t> at;  // ask[j] is pieces[at[j]]
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (st[k].ok()) continue;
      ask.push_back(pieces[k]);
      ask.back().received_sum.reset();
      at.push_back(k);
    }
    if (ask.empty()) break;
    const absl::Status got = src.read(ask);
    for (size_t j = 0; j < ask.size(); ++j) {
      const size_t k = at[j];
      if (!got.ok()) {
        st[k] = got;
      } else if (VolumeStore::SumOf(ask[j]) != sums_[ask[j].index]) {
        st[k] = absl::DataLossError("bytes that do not match the block's checksum");
      } else {
        st[k] = absl::OkStatus();
        continue;
      }
      spdlog::warn("volume: '{}' (contents {}) block {} from {}: {}", name_, file_id_, ask[j].index,
                   src.name, std::string(st[k].message()));
      absl::StrAppend(&why[k], why[k].empty() ? "" : "; ", src.name, ": ", st[k].message());
    }
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (!st[k].ok() && !why[k].empty()) {
      st[k] = absl::Status(st[k].code(), absl::StrCat("block ", pieces[k].index, ": ", why[k]));
    }
  }
  return st;
}

void VolumeStream::Work() {
  const size_t batch = static_cast<size_t>(std::max<uint64_t>(1, kBatch / block_size_));
  absl::MutexLock lock(&mu_);
  auto wanted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closing_ || !urgent_.empty() || !ahead_.empty();
  };
  while (true) {
    mu_.Await(absl::Condition(&wanted));
    if (closing_) return;
    std::vector<VolumeStore::Piece> pieces;
    // Blocks a READ waits for go alone (a batch is ready only once all of it is in: padded
    // with blocks ahead, the reader's first block would wait for a whole kBatch, not its own).
    const bool urgent = !urgent_.empty();
    for (std::set<uint64_t>* from : {&urgent_, &ahead_}) {
      if (urgent && from == &ahead_) break;
      while (!from->empty() && pieces.size() < batch) {
        const uint64_t b = *from->begin();
        from->erase(from->begin());
        urgent_.erase(b);
        ahead_.erase(b);
        auto it = blocks_.find(b);
        if (it == blocks_.end() || it->second.ready || it->second.buf != nullptr) continue;
        it->second.buf = BufferLocked();
        it->second.len = static_cast<size_t>(std::min(block_size_, size_ - b * block_size_));
        pieces.push_back(VolumeStore::Piece{b, it->second.buf.get(), it->second.len});
      }
    }
    if (pieces.empty()) continue;
    std::sort(pieces.begin(), pieces.end(),
              [](const auto& x, const auto& y) { return x.index < y.index; });
    mu_.Unlock();
    std::vector<absl::Status> st = FetchChecked(pieces);
    mu_.Lock();
    for (size_t k = 0; k < pieces.size(); ++k) {
      Block& blk = blocks_[pieces[k].index];  // blocks in flight are never dropped
      blk.ready = true;
      blk.status = st[k];
      if (!st[k].ok()) {
        BufferPool::Get().Give(std::move(blk.buf), block_size_);
        blk.buf = nullptr;
      }
    }
  }
}

absl::Status VolumeStream::Read(uint64_t offset, size_t size, ReadResult* out) {
  const uint64_t end = std::min<uint64_t>(offset + size, size_);
  if (offset >= end) return absl::OkStatus();
  const uint64_t first = offset / block_size_, last = (end - 1) / block_size_;
  absl::MutexLock lock(&mu_);
  for (uint64_t b = first; b <= last; ++b) {
    if (auto it = blocks_.find(b);
        it != blocks_.end() && it->second.ready && !it->second.status.ok()) {
      blocks_.erase(it);  // failed for an earlier READ: asked again
    }
    WantLocked(b);
    if (auto it = blocks_.find(b); !it->second.ready && it->second.buf == nullptr) {
      urgent_.insert(b);
    }
  }
  reading_.insert({first, last});
  absl::Cleanup unpin = [this, first, last]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    reading_.erase(reading_.find({first, last}));
  };
  // A reader going straight on (this READ starts in the block the last one ended in, or the
  // next) has the blocks after it asked for ahead; one that jumps waits for its own only.
  const bool straight = first == next_ || first + 1 == next_ || (first == 0 && next_ == 0);
  next_ = last + 1;
  // The read ahead grows a batch at a time: grown a block per block read, each request to the
  // holder would carry a block or two, and the holder's disk and the network would wait on
  // round trips.
  if (!straight || ahead_end_ < last + 1) ahead_end_ = last + 1;
  if (straight) {
    const uint64_t ahead = std::max<uint64_t>(1, kAhead / block_size_);
    const uint64_t step = std::max<uint64_t>(1, kBatch / block_size_);
    const uint64_t end = std::min<uint64_t>(last + 1 + ahead, sums_.size());
    if (end >= ahead_end_ + step || (end == sums_.size() && end > ahead_end_)) {
      for (uint64_t b = ahead_end_; b < end; ++b) WantLocked(b);
      ahead_end_ = end;
    }
  }
  // Dropped: blocks behind this READ, and any held past what a reader is read ahead.
  const uint64_t keep = std::max<uint64_t>(1, (kAhead + kWorkers * kBatch) / block_size_);
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    const bool pinned = std::any_of(reading_.begin(), reading_.end(), [&](const auto& r) {
      return r.first <= it->first && it->first <= r.second;
    });
    const bool behind = !pinned && it->first < first;
    const bool far = !pinned && it->first > last + keep;
    if ((behind || far) && it->second.buf == nullptr && !it->second.ready) {
      urgent_.erase(it->first);  // wanted, not yet asked for
      ahead_.erase(it->first);
      it = blocks_.erase(it);
    } else if ((behind || far) && it->second.ready) {
      BufferPool::Get().Give(std::move(it->second.buf), block_size_);
      it = blocks_.erase(it);
    } else {
      ++it;
    }
  }
  while (workers_.size() < kWorkers && (!urgent_.empty() || !ahead_.empty())) {
    workers_.emplace_back([this] { Work(); });
  }
  auto ready = [this, first, last]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (uint64_t b = first; b <= last; ++b) {
      if (!blocks_[b].ready) return false;
    }
    return true;
  };
  mu_.Await(absl::Condition(&ready));
  for (uint64_t b = first; b <= last; ++b) {
    if (const Block& blk = blocks_[b]; !blk.status.ok()) {
      return ErrnoStatus(EIO, absl::StrCat("'", name_, "': ", blk.status.message()));
    }
  }
  for (uint64_t b = first; b <= last; ++b) {
    const Block& blk = blocks_[b];
    const uint64_t from = std::max(offset, b * block_size_);
    const uint64_t to = std::min(end, b * block_size_ + blk.len);
    out->segments.push_back(
        {blk.buf.get() + (from - b * block_size_), static_cast<size_t>(to - from)});
    out->holds.push_back(blk.buf);
    out->total += to - from;
  }
  return absl::OkStatus();
}

}  // namespace ember::cachefs
