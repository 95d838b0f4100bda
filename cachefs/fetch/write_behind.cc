#include "cachefs/fetch/write_behind.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace ember::cachefs {
namespace {
// Bounds: blocks (small files fill fast and claim their checksums in batches) and bytes (large
// blocks).
constexpr size_t kMaxQueuedWrites = 64;
constexpr uint64_t kMaxQueuedWriteBytes = 64ull << 20;
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

void WriteBehind::Submit(Write w) {
  const uint64_t len = w.data->size();
  {
    absl::MutexLock lock(&mu_);
    if (writes_.size() < kMaxQueuedWrites &&
        queued_bytes_ + len <= std::max<uint64_t>(kMaxQueuedWriteBytes, len) && !stopping_) {
      queued_bytes_ += len;
      writes_.push_back(std::move(w));
      cv_.Signal();
      return;
    }
  }
  std::vector<Write> ws;
  ws.push_back(std::move(w));
  StoreAll(ws);
}

void WriteBehind::Writer() {
  for (;;) {
    std::vector<Write> ws;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && writes_.empty()) cv_.Wait(&mu_);
      if (writes_.empty()) return;
      while (!writes_.empty()) {  // all that queued up: one meta call for their checksums
        queued_bytes_ -= writes_.front().data->size();
        ws.push_back(std::move(writes_.front()));
        writes_.pop_front();
      }
    }
    StoreAll(ws);
  }
}

void WriteBehind::StoreAll(std::vector<Write>& ws) {
  std::vector<BlockDirectory::Claim> claims;
  std::vector<size_t> which;
  for (size_t i = 0; i < ws.size(); i++) {
    if (!ws[i].claim) continue;
    claims.push_back({ws[i].addr, ws[i].checksum});
    which.push_back(i);
  }
  std::vector<bool> conflict(ws.size(), false);
  std::vector<bool> claimed = checksums_->Claim(claims);
  for (size_t k = 0; k < which.size(); k++) conflict[which[k]] = claimed[k];
  for (size_t i = 0; i < ws.size(); i++) {
    const Write& w = ws[i];
    if (conflict[i]) {
      recent_->Erase(w.addr);
      spdlog::error(
          "read: {}: the origin's bytes differ from those first read for this dataset version "
          "(the origin changed in place); not cached, later reads fail; run `ember dataset "
          "refresh`",
          w.where);
    } else {
      cache_->Insert(w.addr, w.file_size, w.offset, w.data->view(),
                     w.checksum);  // or kept in memory
    }
    w.fill->Settle(conflict[i]);
    inflight_->End(w.addr, w.fill);
  }
}

}  // namespace ember::cachefs
