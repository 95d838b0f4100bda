#include "cachefs/fetch/checksum_book.h"

#include <spdlog/spdlog.h>

#include <string>

namespace ember::cachefs {
namespace {
constexpr size_t kMaxKnown = 100'000;  // then everything is forgotten and learned again
}

ChecksumBook::ChecksumBook(BlockDirectory* directory, std::chrono::milliseconds ttl)
    : directory_(directory), ttl_(ttl) {}

void ChecksumBook::Learn(const BlockAddr& addr, uint64_t checksum) {
  absl::MutexLock lock(&mu_);
  if (known_.size() > kMaxKnown) known_.clear();
  known_[addr] = {checksum, std::chrono::steady_clock::now()};
}

std::optional<uint64_t> ChecksumBook::Known(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  auto it = known_.find(addr);
  if (it == known_.end() || std::chrono::steady_clock::now() - it->second.at > ttl_) {
    return std::nullopt;
  }
  return it->second.checksum;
}

bool ChecksumBook::Conflicting(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  return conflicts_.count(addr) > 0;
}

std::vector<bool> ChecksumBook::Claim(const std::vector<BlockDirectory::Claim>& claims) {
  if (claims.empty()) return {};
  auto r = directory_->RecordChecksums(claims);
  if (!r.ok()) {
    // Meta is down: keep serving; the checksums are recorded when it returns.
    if (!meta_down_logged_.exchange(true)) {
      spdlog::warn("read: cannot record checksums in meta ({}); will retry",
                   std::string(r.status().message()));
    }
    absl::MutexLock lock(&mu_);
    pending_.insert(pending_.end(), claims.begin(), claims.end());
    return std::vector<bool>(claims.size(), false);
  }
  meta_down_logged_ = false;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < claims.size(); i++) {
    if ((*r)[i]) conflicts_.insert(claims[i].addr);
  }
  return *std::move(r);
}

std::vector<BlockAddr> ChecksumBook::Flush() {
  std::vector<BlockDirectory::Claim> pending;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(pending_);
  }
  if (pending.empty()) return {};
  auto r = directory_->RecordChecksums(pending);
  if (absl::IsNotFound(r.status()) || absl::IsInvalidArgument(r.status())) {
    // A dataset version removed meanwhile: nothing to record; the blocks age out of the cache.
    spdlog::warn("read: dropping {} pending checksums: {}", pending.size(),
                 std::string(r.status().message()));
    return {};
  }
  if (!r.ok()) {
    absl::MutexLock lock(&mu_);
    pending_.insert(pending_.end(), pending.begin(), pending.end());
    return {};
  }
  std::vector<BlockAddr> conflicts;
  for (size_t i = 0; i < pending.size(); i++) {
    if (!(*r)[i]) continue;
    const BlockAddr& a = pending[i].addr;
    spdlog::error(
        "read: block {}/{}/{}/{} filled while meta was away conflicts with meta's "
        "checksum; dropping it",
        a.dataset_id, a.version, a.file_id, a.index);
    conflicts.push_back(a);
  }
  absl::MutexLock lock(&mu_);
  conflicts_.insert(conflicts.begin(), conflicts.end());
  return conflicts;
}

}  // namespace ember::cachefs
