#include "cachefs/fetch/recent_blocks.h"

#include <algorithm>

namespace ember::cachefs {

std::shared_ptr<const BlockBuffer> RecentBlocks::Get(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(addr);
  if (it == index_.end()) return nullptr;
  MoveToFront(it->second);
  return recent_.front().data;
}

std::shared_ptr<const BlockBuffer> RecentBlocks::Peek(const BlockAddr& addr, uint64_t* checksum) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(addr);
  if (it == index_.end()) return nullptr;
  *checksum = it->second->checksum;
  return it->second->data;
}

void RecentBlocks::Rebalance() {
  const size_t quarter = budget_ / 4;
  // Grow while short of a quarter, then shrink while the oldest of the quarter is not needed to
  // reach it (the quarter always holds the newest block).
  while (newest_cost_ < quarter && boundary_ != recent_.end()) {
    boundary_->newest = true;
    newest_cost_ += boundary_->cost;
    ++boundary_;
  }
  while (boundary_ != recent_.begin() && std::prev(boundary_) != recent_.begin() &&
         newest_cost_ - std::prev(boundary_)->cost >= quarter) {
    --boundary_;
    boundary_->newest = false;
    newest_cost_ -= boundary_->cost;
  }
}

void RecentBlocks::MoveToFront(List::iterator it) {
  if (it == boundary_) ++boundary_;
  recent_.splice(recent_.begin(), recent_, it);  // iterators stay valid
  it->used = std::chrono::steady_clock::now();   // the list stays in order of use
  if (!it->from_origin) peers_.splice(peers_.begin(), peers_, it->in_peers);
  if (!it->newest) {
    it->newest = true;
    newest_cost_ += it->cost;
  }
  Rebalance();
}

void RecentBlocks::EraseAt(List::iterator it) {
  if (it == boundary_) ++boundary_;
  if (it->newest) newest_cost_ -= it->cost;
  if (!it->from_origin) peers_.erase(it->in_peers);
  cost_ -= it->cost;
  index_.erase(it->addr);
  recent_.erase(it);
  Rebalance();
}

void RecentBlocks::Erase(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(addr);
  if (it != index_.end()) EraseAt(it->second);
}

void RecentBlocks::Unstored(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  auto at = index_.find(addr);
  if (at == index_.end()) return;
  at->second->unstored = true;
  size_t unstored = 0;
  for (auto it = recent_.begin(); it != recent_.end();) {
    if (it->unstored && ++unstored > keep_unstored_) {
      auto next = std::next(it);
      EraseAt(it);  // the oldest ones beyond the bound (the list is newest first)
      it = next;
      continue;
    }
    ++it;
  }
}

size_t RecentBlocks::DropUnusedSince(std::chrono::steady_clock::time_point cutoff) {
  absl::MutexLock lock(&mu_);
  size_t dropped = 0;
  while (!recent_.empty() && recent_.back().used < cutoff) {
    dropped += recent_.back().data->size();
    EraseAt(std::prev(recent_.end()));
  }
  return dropped;
}

RecentBlocks::List::iterator RecentBlocks::Victim() {
  if (!peers_.empty() && !peers_.back()->newest) return peers_.back();
  return std::prev(recent_.end());
}

void RecentBlocks::Put(const BlockAddr& addr, std::shared_ptr<const BlockBuffer> data,
                       uint64_t checksum, bool from_origin) {
  if (budget_ == 0) return;
  absl::MutexLock lock(&mu_);
  auto old = index_.find(addr);
  if (old != index_.end()) EraseAt(old->second);
  const size_t cost = std::max(data->size(), kMinCost);
  recent_.push_back({addr, std::move(data), checksum, false, from_origin, false, cost, {}, {}});
  auto it = std::prev(recent_.end());
  if (boundary_ == recent_.end()) boundary_ = it;  // end() moved: the new block is past the quarter
  if (!from_origin) it->in_peers = peers_.insert(peers_.end(), it);
  index_[addr] = it;
  cost_ += cost;
  MoveToFront(it);
  while (cost_ > budget_ && recent_.size() > 1) EraseAt(Victim());
}

}  // namespace ember::cachefs
