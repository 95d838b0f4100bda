#include "cachefs/fetch/recent_blocks.h"

#include <algorithm>

namespace ember::cachefs {

std::shared_ptr<const BlockBuffer> RecentBlocks::Get(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(addr);
  if (it == index_.end()) return nullptr;
  recent_.splice(recent_.begin(), recent_, it->second);  // iterators stay valid
  return recent_.front().data;
}

std::shared_ptr<const BlockBuffer> RecentBlocks::Peek(const BlockAddr& addr, uint64_t* checksum) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(addr);
  if (it == index_.end()) return nullptr;
  *checksum = it->second->checksum;
  return it->second->data;
}

void RecentBlocks::EraseAt(List::iterator it) {
  cost_ -= it->cost;
  index_.erase(it->addr);
  recent_.erase(it);
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

RecentBlocks::List::iterator RecentBlocks::Victim() {
  // The newest quarter of the budget (at least the newest block) is kept whatever its source.
  size_t newest = 0;
  auto boundary = recent_.begin();
  while (boundary != recent_.end() && (boundary == recent_.begin() || newest < budget_ / 4)) {
    newest += boundary->cost;
    ++boundary;
  }
  for (auto it = recent_.end(); it != boundary;) {
    --it;
    if (!it->from_origin) return it;
  }
  return std::prev(recent_.end());
}

void RecentBlocks::Put(const BlockAddr& addr, std::shared_ptr<const BlockBuffer> data,
                       uint64_t checksum, bool from_origin) {
  if (budget_ == 0) return;
  absl::MutexLock lock(&mu_);
  auto old = index_.find(addr);
  if (old != index_.end()) EraseAt(old->second);
  const size_t cost = std::max(data->size(), kMinCost);
  recent_.push_front({addr, std::move(data), checksum, false, from_origin, cost});
  index_[addr] = recent_.begin();
  cost_ += cost;
  while (cost_ > budget_ && recent_.size() > 1) EraseAt(Victim());
}

}  // namespace ember::cachefs
