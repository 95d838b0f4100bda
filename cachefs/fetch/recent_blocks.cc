#include "cachefs/fetch/recent_blocks.h"

#include <algorithm>

namespace ember::cachefs {

std::shared_ptr<const BlockBuffer> RecentBlocks::Get(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  for (auto it = recent_.begin(); it != recent_.end(); ++it) {
    if (it->addr == addr) {
      recent_.splice(recent_.begin(), recent_, it);
      return recent_.front().data;
    }
  }
  return nullptr;
}

std::shared_ptr<const BlockBuffer> RecentBlocks::Peek(const BlockAddr& addr, uint64_t* checksum) {
  absl::MutexLock lock(&mu_);
  for (const Recent& r : recent_) {
    if (r.addr == addr) {
      *checksum = r.checksum;
      return r.data;
    }
  }
  return nullptr;
}

void RecentBlocks::Erase(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  recent_.remove_if([&](const Recent& r) { return r.addr == addr; });
}

void RecentBlocks::Unstored(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  size_t unstored = 0;
  for (auto it = recent_.begin(); it != recent_.end();) {
    if (it->addr == addr) it->unstored = true;
    if (it->unstored && ++unstored > keep_unstored_) {
      it = recent_.erase(it);  // the oldest ones beyond the bound (the list is newest first)
      continue;
    }
    ++it;
  }
}

void RecentBlocks::Put(const BlockAddr& addr, std::shared_ptr<const BlockBuffer> data,
                       uint64_t checksum, bool from_origin) {
  if (keep_ == 0) return;
  absl::MutexLock lock(&mu_);
  recent_.push_front({addr, std::move(data), checksum, false, from_origin});
  if (recent_.size() <= keep_) return;
  // The oldest block from a peer leaves first, unless it is among the newest (what readers are
  // reading now); otherwise the oldest of all.
  const size_t newest = std::max<size_t>(1, keep_ / 4);
  size_t position = recent_.size();
  for (auto it = recent_.end(); --position >= newest;) {
    --it;
    if (!it->from_origin) {
      recent_.erase(it);
      return;
    }
  }
  recent_.pop_back();
}

}  // namespace ember::cachefs
