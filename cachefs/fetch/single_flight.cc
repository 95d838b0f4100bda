#include "cachefs/fetch/single_flight.h"

namespace ember::cachefs {

void Fill::Finish(Result result) {
  absl::MutexLock lock(&mu_);
  result_ = std::move(result);
  done_ = true;
}

void Fill::Settle(bool conflict) {
  absl::MutexLock lock(&mu_);
  conflict_ = conflict;
  settled_ = true;
}

Fill::Result Fill::WaitDone() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return result_;
}

bool Fill::WaitSettled() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&settled_));
  return conflict_;
}

std::pair<std::shared_ptr<Fill>, bool> SingleFlight::Join(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(addr);
  if (it != inflight_.end()) return {it->second, false};
  auto fill = std::make_shared<Fill>();
  inflight_.emplace(addr, fill);
  return {fill, true};
}

void SingleFlight::End(const BlockAddr& addr, const std::shared_ptr<Fill>& fill) {
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(addr);
  if (it != inflight_.end() && it->second == fill) inflight_.erase(it);
}

bool SingleFlight::InFlight(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  return inflight_.count(addr) > 0;
}

}  // namespace ember::cachefs
