// Verification: the cache owns whether its bytes are known good. A block stored by this agent
// was checked by its fill; one loaded from the index is checked the first time it is served
// (VerifyOnce); `ember cache verify` checks them all (VerifyAll).
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <string>

#include "cachefs/cache/block_cache.h"

namespace ember::cachefs {

bool BlockCache::VerifyOnce(const BlockHold& hold) {
  if (hold.verified) return true;
  std::string buf(hold.length, '\0');
  if (PreadFull(hold.fd, hold.offset, hold.length, buf.data()) &&
      BlockChecksum(buf.data(), buf.size()) == hold.checksum) {
    MarkVerified(hold.addr);
    return true;
  }
  // Concurrent readers of the same bad copy: the one that drops it counts and logs it.
  if (Drop(hold.addr, hold.generation)) {
    checksum_failures_++;
    spdlog::error("cache: block {}/{}/{}/{} failed its checksum on disk; dropped, refetching",
                  hold.addr.dataset_id, hold.addr.version, hold.addr.file_id, hold.addr.index);
  }
  return false;
}

BlockCache::VerifyReport BlockCache::VerifyAll(
    bool repair, const std::function<void(uint64_t, uint64_t)>& progress) {
  struct Item {
    BlockAddr addr;
    uint64_t offset, checksum, generation;
    uint32_t length;
  };
  std::vector<Item> items;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [a, e] : blocks_) {
      if (!e.writing && !e.doomed)
        items.push_back({a, e.offset, e.checksum, e.generation, e.length});
    }
  }
  VerifyReport r;
  std::string buf;
  for (const Item& it : items) {
    std::string path = FilePath(it.addr);
    buf.resize(it.length);
    bool good = false;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      good = PreadFull(fd, it.offset, it.length, buf.data()) &&
             BlockChecksum(buf.data(), buf.size()) == it.checksum;
      close(fd);
    }
    r.blocks++;
    r.bytes += it.length;
    if (!good) {
      r.damaged++;
      if (r.damaged_files.size() < 20) r.damaged_files.push_back(path);
      if (repair) Drop(it.addr, it.generation);
    }
    if (progress) progress(r.blocks, items.size());
  }
  return r;
}

}  // namespace ember::cachefs
