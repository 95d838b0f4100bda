#include "cachefs/cache/scrubber.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "common/metrics.h"
#include "common/units.h"

namespace ember::cachefs {
namespace {

constexpr size_t kWalkChunk = 1024;  // blocks listed from the cache at a time
// The background pace counts a block as at least this many bytes: a tiny block costs a disk read
// (and the checks around it) like a large one's first chunk.
constexpr uint64_t kMinPaceCharge = 64 << 10;

metrics::Counter* ScrubBytes() {
  static metrics::Counter* const c = metrics::Global().GetCounter(
      "ember_cache_scrub_bytes_total", "Bytes of cache blocks the scrubber read back and checked.");
  return c;
}

}  // namespace

uint64_t Scrubber::DefaultRate(uint64_t capacity) {
  return std::max<uint64_t>(1 << 20, capacity / 86'400);
}

Scrubber::Scrubber(BlockCache* cache, uint64_t bytes_per_second)
    : cache_(cache), rate_(bytes_per_second) {
  progress_.bytes_per_second = rate_;
  thread_ = std::thread([this] { Run(); });
}

Scrubber::~Scrubber() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

Scrubber::Progress Scrubber::GetProgress() {
  absl::MutexLock lock(&mu_);
  return progress_;
}

void Scrubber::CheckSoon(const std::vector<BlockAddr>& blocks) {
  absl::MutexLock lock(&mu_);
  for (const BlockAddr& a : blocks) {
    if (queued_.insert(a).second) soon_.push_back(a);
  }
}

uint64_t Scrubber::Check(const BlockAddr& addr, bool background) {
  BlockHoldPtr probe = cache_->Acquire(addr, /*record_access=*/false);
  const uint64_t len = probe ? probe->length : 0;
  probe.reset();
  if (len == 0) return 0;
  const BlockCache::ScrubResult r = cache_->ScrubBlock(addr);
  if (r == BlockCache::ScrubResult::kGone) return 0;
  ScrubBytes()->Inc(len);
  absl::MutexLock lock(&mu_);
  progress_.blocks++;
  progress_.bytes += len;
  if (r == BlockCache::ScrubResult::kBad) progress_.bad++;
  if (background) progress_.pass_done++;
  return len;
}

void Scrubber::Pace(uint64_t bytes) {
  if (rate_ == 0 || bytes == 0) return;
  const absl::Duration wait = absl::Seconds(static_cast<double>(bytes) / rate_);
  absl::MutexLock lock(&mu_);
  auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !soon_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&woken), wait);
}

void Scrubber::Run() {
  bool walking = false;
  bool have_last = false;
  BlockAddr last{};
  std::vector<BlockAddr> batch;
  size_t next = 0;
  for (;;) {
    // Blocks asked for come first, unpaced.
    std::optional<BlockAddr> soon;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (!soon_.empty()) {
        soon = soon_.front();
        soon_.pop_front();
        queued_.erase(*soon);
      } else if (rate_ == 0) {
        auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !soon_.empty(); };
        mu_.Await(absl::Condition(&woken));
        continue;
      }
    }
    if (soon) {
      Check(*soon, /*background=*/false);
      continue;
    }
    // The background pass, in address order, a chunk at a time.
    if (!walking) {
      walking = true;
      have_last = false;
      next = batch.size();
      const uint64_t total = cache_->GetStats().resident_blocks;
      absl::MutexLock lock(&mu_);
      progress_.pass_done = 0;
      progress_.pass_total = total;
    }
    if (next == batch.size()) {
      batch = cache_->BlocksAfter(have_last ? &last : nullptr, kWalkChunk);
      next = 0;
      if (batch.empty()) {
        walking = false;
        absl::MutexLock lock(&mu_);
        progress_.passes++;
        progress_.last_pass_unix_ms = NowUnixMs();
        if (progress_.bad > 0 || progress_.passes == 1) {
          spdlog::info("scrub: pass {} done ({} blocks checked in all, {} bad)", progress_.passes,
                       progress_.blocks, progress_.bad);
        }
        auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !soon_.empty(); };
        mu_.AwaitWithTimeout(absl::Condition(&woken), absl::Seconds(1));  // an empty cache
        continue;
      }
    }
    last = batch[next++];
    have_last = true;
    if (const uint64_t len = Check(last, /*background=*/true); len > 0) {
      Pace(std::max(len, kMinPaceCharge));
    }
  }
}

}  // namespace ember::cachefs
