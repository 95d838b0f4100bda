#include "cachefs/fetch/write_behind.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/time/time.h"
#include "common/metrics.h"

namespace ember::cachefs {
namespace {
// Bounds: blocks (small files fill fast and claim their checksums in batches) and bytes (large
// blocks).
constexpr size_t kMaxQueuedWrites = 1024;
constexpr uint64_t kMaxQueuedWriteBytes = 64ull << 20;
// A writer that finds fewer small blocks queued than a batch waits up to kLinger (from the
// oldest's arrival) for more: a first epoch of small files fills one block per reader at a time,
// and each batch costs a meta call for its claims (most of the agent's CPU per fill when batches
// were of 1-4 blocks; 50 ms rather than 10 ms: a cold tiny-file epoch made ~21-block batches,
// 9,500 checksum calls and 2,900 location reports for 200,000 files, and 5x fewer of each with
// 50 ms). The readers have their bytes already; only the cache commit waits.
constexpr size_t kBatch = 256;
constexpr uint64_t kLingerBelowBytes = 4ull << 20;
constexpr auto kLinger = std::chrono::milliseconds(50);
}  // namespace

WriteBehind::WriteBehind(BlockCache* cache, ChecksumBook* checksums, RecentBlocks* recent,
                         SingleFlight* inflight, int threads)
    : cache_(cache), checksums_(checksums), recent_(recent), inflight_(inflight) {
  for (int i = 0; i < threads; i++) writers_.emplace_back([this] { Writer(); });
}

WriteBehind::~WriteBehind() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // writers finish what is queued first
  }
  cv_.SignalAll();
  for (auto& t : writers_) t.join();
}

namespace {
metrics::Histogram* Stage(const char* stage) {
  return metrics::Global().GetHistogram(
      "ember_fill_stage_seconds",
      "Stages of block fills after the bytes arrived: waiting for a writer (write_queue), "
      "claiming checksums in meta (claim, per batch), storing in the cache (cache_write, per "
      "block: a batch's time shared out).",
      {{"stage", stage}});
}
double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

void WriteBehind::Submit(Write w) {
  const uint64_t len = w.data->size();
  w.submitted = std::chrono::steady_clock::now();
  std::vector<Write> ws;
  {
    absl::MutexLock lock(&mu_);
    if (writes_.size() < kMaxQueuedWrites &&
        queued_bytes_ + len <= std::max<uint64_t>(kMaxQueuedWriteBytes, len) && !stopping_) {
      queued_bytes_ += len;
      writes_.push_back(std::move(w));
      // A writer waits for the first write, or lingers for a batch (or for bytes enough).
      if (writes_.size() == 1 || writes_.size() % kBatch == 0 ||
          queued_bytes_ >= kLingerBelowBytes) {
        cv_.Signal();
      }
      return;
    }
    // Full (the writers are behind): this fill stores the oldest queued writes with its own, a
    // batch (one claim call, one segment write, one index write), not its block alone: one-block
    // stores were 11% of an agent's CPU in a tiny-file prefetch to three nodes.
    TakeLocked(kBatch, kLingerBelowBytes, &ws);
  }
  ws.push_back(std::move(w));
  StoreAll(ws);
}

void WriteBehind::TakeLocked(size_t max_writes, uint64_t max_bytes, std::vector<Write>* ws) {
  uint64_t bytes = 0;
  for (size_t taken = 0; !writes_.empty() && taken < max_writes && bytes < max_bytes; taken++) {
    const uint64_t n = writes_.front().data->size();
    queued_bytes_ -= n;
    bytes += n;
    ws->push_back(std::move(writes_.front()));
    writes_.pop_front();
  }
}

void WriteBehind::Hurry() {
  bool wake = false;
  {
    absl::MutexLock lock(&mu_);
    wake = !hurry_ && !writes_.empty();
    if (wake) hurry_ = true;
  }
  if (wake) cv_.SignalAll();
}

void WriteBehind::Writer() {
  for (;;) {
    std::vector<Write> ws;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && writes_.empty()) cv_.Wait(&mu_);
      if (writes_.empty()) return;
      const auto deadline = writes_.front().submitted + kLinger;
      while (!stopping_ && !hurry_ && !writes_.empty() && writes_.size() < kBatch &&
             queued_bytes_ < kLingerBelowBytes) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) break;
        cv_.WaitWithTimeout(&mu_, absl::FromChrono(deadline - now));
      }
      if (writes_.empty()) continue;  // another writer took them
      hurry_ = false;
      // All that queued up: one meta call for their checksums.
      TakeLocked(SIZE_MAX, UINT64_MAX, &ws);
    }
    StoreAll(ws);
  }
}

void WriteBehind::StoreAll(std::vector<Write>& ws) {
  static metrics::Histogram* const queue_stage = Stage("write_queue");
  static metrics::Histogram* const claim_stage = Stage("claim");
  static metrics::Histogram* const write_stage = Stage("cache_write");
  for (const Write& w : ws) queue_stage->Observe(Since(w.submitted));
  std::vector<BlockDirectory::Claim> claims;
  std::vector<size_t> which;
  for (size_t i = 0; i < ws.size(); i++) {
    if (!ws[i].claim) continue;
    claims.push_back({ws[i].addr, ws[i].checksum});
    which.push_back(i);
  }
  std::vector<bool> conflict(ws.size(), false);
  const auto claim_start = std::chrono::steady_clock::now();
  std::vector<bool> claimed = checksums_->Claim(claims);
  if (!claims.empty()) claim_stage->Observe(Since(claim_start));
  for (size_t k = 0; k < which.size(); k++) conflict[which[k]] = claimed[k];
  // The blocks that did not conflict, stored in one batch (one segment write and one index
  // write for many small files).
  std::vector<BlockCache::InsertItem> items;
  std::vector<size_t> stored;
  for (size_t i = 0; i < ws.size(); i++) {
    const Write& w = ws[i];
    if (conflict[i]) {
      recent_->Erase(w.addr);
      // Settled and ended before the others are stored (and before the log says so): a read
      // from now on leads a fill of its own, which fails, instead of joining this one for the
      // origin's bytes while a batch's other files are written.
      w.fill->Settle(true);
      inflight_->End(w.addr, w.fill);
      spdlog::error(
          "read: {}: the origin's bytes differ from those first read for this dataset version "
          "(the origin changed in place); not cached, later reads fail; run `ember dataset "
          "refresh`",
          w.where);
      continue;
    }
    items.push_back({w.addr, w.file_size, w.offset, w.data->view(), w.checksum});
    stored.push_back(i);
  }
  if (!items.empty()) {
    const auto write_start = std::chrono::steady_clock::now();
    std::vector<BlockCache::InsertResult> results = cache_->InsertMany(items);
    const double took = Since(write_start) / static_cast<double>(items.size());
    for (size_t k = 0; k < stored.size(); k++) {
      // kept in memory a short while only
      if (results[k] != BlockCache::InsertResult::kStored) recent_->Unstored(ws[stored[k]].addr);
      write_stage->Observe(took);
    }
  }
  for (size_t i = 0; i < ws.size(); i++) {
    if (conflict[i]) continue;  // ended above
    ws[i].fill->Settle(false);
    inflight_->End(ws[i].addr, ws[i].fill);
  }
}

}  // namespace ember::cachefs
