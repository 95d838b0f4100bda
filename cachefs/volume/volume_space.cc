// VolumeStore's space (volume_store.h): what its files take against the limit, the dropping of
// contents the origin holds to make room, and of contents no file refers to any more.
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cachefs/volume/volume_store.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/units.h"

namespace ember::cachefs {
namespace {

// When contents were sealed or copied here (their `.sums`), or 0 if they are not whole here.
int64_t SealedAt(const std::string& path) {
  struct stat st;
  if (stat((path + ".sums").c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec);
}

}  // namespace

void VolumeStore::SetLimit(uint64_t limit, absl::Duration wait) {
  absl::MutexLock lock(&space_mu_);
  limit_ = limit;
  wait_ = wait;
}

uint64_t VolumeStore::Used() {
  absl::MutexLock lock(&space_mu_);
  return used_;
}

void VolumeStore::Unreserve(uint64_t bytes) {
  absl::MutexLock lock(&space_mu_);
  used_ -= std::min(used_, bytes);
  room_.SignalAll();
}

void VolumeStore::SetEvictable(std::set<std::pair<uint32_t, uint64_t>> ids) {
  absl::MutexLock lock(&space_mu_);
  evictable_ = std::move(ids);
  room_.SignalAll();
}

bool VolumeStore::MakeRoomLocked(uint64_t bytes) {
  if (limit_ == 0 || used_ + bytes <= limit_) return true;
  // Oldest sealed first.
  std::vector<std::pair<int64_t, std::pair<uint32_t, uint64_t>>> order;
  for (const auto& id : evictable_) order.emplace_back(SealedAt(PathOf(id.first, id.second)), id);
  std::sort(order.begin(), order.end());
  for (const auto& [at, id] : order) {
    if (used_ + bytes <= limit_) break;
    const std::string path = PathOf(id.first, id.second);
    struct stat st;
    if (stat(path.c_str(), &st) != 0) continue;
    ForgetServing(id.first, id.second);  // lock order: space_mu_, then serving_mu_
    unlink((path + ".sums").c_str());
    if (unlink(path.c_str()) == 0) {
      used_ -= std::min<uint64_t>(used_, static_cast<uint64_t>(st.st_size));
      spdlog::info("volume: dropped contents {}/{} ({}), in the origin, to make room", id.first,
                   id.second, FormatBytes(static_cast<uint64_t>(st.st_size)));
    }
    evictable_.erase(id);
  }
  return used_ + bytes <= limit_;
}

absl::Status VolumeStore::Reserve(uint64_t bytes) {
  static metrics::Counter* const enospc = metrics::Global().GetCounter(
      "ember_volume_enospc_total",
      "Volume writes and copies refused for want of room for contents not yet in the origin.");
  absl::MutexLock lock(&space_mu_);
  if (limit_ != 0 && bytes > limit_) {
    enospc->Inc();
    return ErrnoStatus(ENOSPC, absl::StrCat("volume space: ", FormatBytes(bytes),
                                            " asked for at once, over the whole limit of ",
                                            FormatBytes(limit_), " (--volume-space)"));
  }
  const absl::Time deadline = absl::Now() + wait_;
  waiting_++;  // uploads do not pause for writers while one waits for them
  absl::Cleanup waited = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(space_mu_) { waiting_--; };
  while (!MakeRoomLocked(bytes)) {
    if (absl::Now() >= deadline) {
      enospc->Inc();
      const std::string why = absl::StrCat(
          "volume space full: ", FormatBytes(used_), " of ", FormatBytes(limit_),
          " held by contents not yet in the origin (waited ", absl::FormatDuration(wait_),
          " for uploads); ", FormatBytes(bytes), " more refused");
      spdlog::warn("{}", why);
      return ErrnoStatus(ENOSPC, why);
    }
    // Uploads finishing make contents evictable (SetEvictable), drops free room: then again.
    room_.WaitWithDeadline(&space_mu_, deadline);
  }
  used_ += bytes;
  return absl::OkStatus();
}

bool VolumeStore::Starved() {
  absl::MutexLock lock(&space_mu_);
  return waiting_ > 0;
}

int VolumeStore::DropUnreferenced(const std::set<std::pair<uint32_t, uint64_t>>& live,
                                  absl::Time sealed_before,
                                  const std::set<std::pair<uint32_t, uint64_t>>& writing) {
  const int64_t before = absl::ToUnixSeconds(sealed_before);
  std::vector<std::pair<uint32_t, uint64_t>> drop;
  std::error_code ec;
  for (auto vd = std::filesystem::directory_iterator(dir_, ec);
       !ec && vd != std::filesystem::directory_iterator(); vd.increment(ec)) {
    uint32_t vol = 0;
    if (!absl::SimpleAtoi(vd->path().filename().string(), &vol)) continue;
    std::error_code ec2;
    for (auto f = std::filesystem::directory_iterator(vd->path(), ec2);
         !ec2 && f != std::filesystem::directory_iterator(); f.increment(ec2)) {
      uint64_t id = 0;
      if (!absl::SimpleAtoi(f->path().filename().string(), &id)) continue;  // .sums, .tmp
      if (live.count({vol, id}) > 0) continue;
      const int64_t sealed = SealedAt(f->path().string());
      if (sealed != 0 && sealed < before) drop.emplace_back(vol, id);  // never staging files
    }
  }
  for (const auto& [vol, id] : drop) Drop(vol, id);
  // Copies made ahead of a commit that never came here (the writer died, its commit failed, or
  // it chose another node): a commit's copy takes its copy ahead at once, so one still here
  // and not being written is of no use.
  std::vector<std::pair<uint32_t, uint64_t>> stale;
  auto stale_locked =
      [&](const std::pair<uint32_t, uint64_t>& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu_) {
        auto it = ahead_.find(key);
        return it != ahead_.end() && writing.count(key) == 0 && it->second.touched < sealed_before;
      };
  {
    absl::MutexLock lock(&fetch_mu_);
    for (const auto& [key, ahead] : ahead_) {
      if (stale_locked(key)) stale.push_back(key);
    }
  }
  for (const auto& key : stale) {
    std::shared_ptr<void> turn = CopyTurn(key);  // not while a copy of it runs
    bool still;
    {
      absl::MutexLock lock(&fetch_mu_);
      still = stale_locked(key);
    }
    if (still) {
      Drop(key.first, key.second);
      drop.push_back(key);
    }
  }
  if (!drop.empty()) {
    spdlog::info("volume: dropped {} contents no file refers to any more", drop.size());
  }
  return static_cast<int>(drop.size());
}

}  // namespace ember::cachefs
