// Verification: the cache owns whether its bytes are known good (see block_cache.h). Reads are
// checked (ReadVerified), blocks sent to peers are checked (EnsureVerified), the scrubber checks
// the disk itself (ScrubBlock), and a bad block is quarantined (Quarantine). `ember cache
// verify` checks everything of a stopped node (VerifyAll).
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cachefs/cache/block_buffer.h"
#include "cachefs/cache/block_cache.h"

namespace ember::cachefs {
namespace {

constexpr size_t kRecentCorruptions = 20;

}  // namespace

absl::Status BlockCache::ReadVerified(const BlockHold& hold, uint64_t pos, size_t len, char* dst) {
  for (int attempt = 0; attempt < 3; attempt++) {
    uint64_t before = ChangeStamp(hold.fd);
    bool verified = false;
    bool lead = false;  // this reader checks the block; readers of it meanwhile wait
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        auto it = blocks_.find(hold.addr);
        if (it == blocks_.end() || it->second.generation != hold.generation || it->second.doomed) {
          break;  // VerifyNow reads and checks it (the hold keeps its bytes)
        }
        if (StampAgreesLocked(hold.addr, hold.segment, before) && it->second.verified) {
          verified = true;
          break;
        }
        if (!it->second.verifying) {
          it->second.verifying = true;
          lead = true;
          break;
        }
        // Many readers of a block just stored (its pages not in the page cache: written
        // O_DIRECT) would each read and check all of it: one does, the others then copy.
        verified_cv_.Wait(&mu_);
        mu_.Unlock();
        before = ChangeStamp(hold.fd);
        mu_.Lock();
      }
    }
    // A checked copy still wholly in the page cache, and nobody wrote the file meanwhile (a
    // write changes the ctime before it changes the bytes).
    if (verified && PreadCached(hold.fd, pos, len, dst)) {
      const uint64_t after = ChangeStamp(hold.fd);
      if (after == before) return absl::OkStatus();
      absl::MutexLock lock(&mu_);  // changed meanwhile: by our own write elsewhere in the file?
      auto it = blocks_.find(hold.addr);
      if (it != blocks_.end() && it->second.generation == hold.generation && !it->second.doomed &&
          StampAgreesLocked(hold.addr, hold.segment, after) && it->second.verified) {
        return absl::OkStatus();
      }
    }
    absl::Status st = VerifyNow(hold, before, pos, len, dst);
    if (lead) {
      absl::MutexLock lock(&mu_);
      auto it = blocks_.find(hold.addr);
      // Whatever its generation now (a revive may have replaced it): a flag left set would
      // hold up every later reader; cleared too early, two readers check at once.
      if (it != blocks_.end()) it->second.verifying = false;
      verified_cv_.SignalAll();
    }
    if (!absl::IsAborted(st)) return st;
  }
  return absl::UnavailableError(absl::StrCat(
      "cache file ", files_.FilePath(hold.addr, hold.segment), " kept changing while it was read"));
}

absl::Status BlockCache::PrepareSend(const BlockHold& hold) {
  for (int attempt = 0; attempt < 3; attempt++) {
    const uint64_t before = ChangeStamp(hold.fd);
    {
      absl::MutexLock lock(&mu_);
      auto it = blocks_.find(hold.addr);
      if (it == blocks_.end() || it->second.generation != hold.generation || it->second.doomed) {
        return absl::DataLossError("the block left the cache");
      }
      if (StampAgreesLocked(hold.addr, hold.segment, before) && it->second.checked) {
        if (it->second.verified &&
            !PagesCached(hold.fd, hold.offset, hold.length).value_or(false)) {
          it->second.verified = false;  // the send brings pages from the disk, unchecked
        }
        return absl::OkStatus();
      }
    }
    absl::Status st = VerifyNow(hold, before, 0, 0, nullptr);
    if (!absl::IsAborted(st)) return st;
  }
  return absl::UnavailableError(absl::StrCat(
      "cache file ", files_.FilePath(hold.addr, hold.segment), " kept changing while it was read"));
}

absl::Status BlockCache::VerifyNow(const BlockHold& hold, uint64_t before, uint64_t pos, size_t len,
                                   char* dst) {
  BlockBuffer buf(hold.length);
  const bool read = PreadFull(hold.fd, hold.offset, hold.length, buf.data());
  const uint64_t after = ChangeStamp(hold.fd);
  const bool good = read && BlockChecksum(buf.data(), hold.length) == hold.checksum;
  if (!good && after != before) {
    return absl::AbortedError("the file changed while it was read");  // ours, maybe: look again
  }
  if (!good) {
    Quarantine(hold.addr, hold.generation,
               read ? "its bytes do not match its checksum" : "it cannot be read");
    return absl::DataLossError(absl::StrCat("block ", hold.addr.index, " of cache file ",
                                            files_.FilePath(hold.addr, hold.segment),
                                            " was bad; quarantined"));
  }
  verifications_++;
  {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(hold.addr);
    if (it != blocks_.end() && it->second.generation == hold.generation && !it->second.doomed &&
        StampAgreesLocked(hold.addr, hold.segment, after)) {
      it->second.checked = true;
      it->second.verified = true;  // its pages are in the page cache now, just checked
    }
  }
  if (dst != nullptr) std::memcpy(dst, buf.data() + (pos - hold.offset), len);
  return absl::OkStatus();
}

BlockCache::ScrubResult BlockCache::ScrubBlock(const BlockAddr& addr) {
  BlockHoldPtr hold = Acquire(addr, /*record_access=*/false);
  if (!hold) return ScrubResult::kGone;
  const uint64_t before = ChangeStamp(hold->fd);
  BlockBuffer buf((hold->length + BlockBuffer::kAlign - 1) / BlockBuffer::kAlign *
                  BlockBuffer::kAlign);
  const bool read =
      files_.ReadFromDisk(addr, hold->segment, hold->offset, hold->length, buf.data());
  const uint64_t after = ChangeStamp(hold->fd);
  if (read && BlockChecksum(buf.data(), hold->length) == hold->checksum) {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(addr);
    if (it != blocks_.end() && it->second.generation == hold->generation && !it->second.doomed &&
        after == before && StampAgreesLocked(addr, hold->segment, after)) {
      it->second.checked = true;
    }
    return ScrubResult::kGood;
  }
  if (after != before) return ScrubResult::kGood;  // changed under the read: the next pass looks
  Quarantine(addr, hold->generation,
             read ? "the scrubber found its bytes on disk do not match its checksum"
                  : "the scrubber cannot read it");
  return ScrubResult::kBad;
}

bool BlockCache::Quarantine(const BlockAddr& addr, uint64_t generation, const std::string& why) {
  std::string event;
  {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(addr);
    if (it == blocks_.end() || it->second.writing || it->second.doomed) return false;
    if (generation != 0 && it->second.generation != generation) return false;
    const std::string when =
        absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(), absl::UTCTimeZone());
    event = absl::StrCat(when, " block ", addr.index, " of ",
                         files_.FilePath(addr, it->second.segment), ": ", why);
    corruptions_.push_back(event);
    if (corruptions_.size() > kRecentCorruptions) corruptions_.erase(corruptions_.begin());
    RemoveLocked(it, false);  // out of the index and of meta's view; punched once unheld
  }
  checksum_failures_++;
  spdlog::error("cache: quarantined {}; refilling it from a peer or the origin", event);
  if (quarantine_listener_) quarantine_listener_(addr);
  return true;
}

BlockCache::VerifyReport BlockCache::VerifyAll(
    bool repair, const std::function<void(uint64_t, uint64_t)>& progress) {
  struct Item {
    BlockAddr addr;
    uint64_t offset, checksum, generation;
    uint32_t length;
    uint32_t segment;
  };
  std::vector<Item> items;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [a, e] : blocks_) {
      if (!e.writing && !e.doomed)
        items.push_back({a, e.offset, e.checksum, e.generation, e.length, e.segment});
    }
  }
  VerifyReport r;
  std::string buf;
  for (const Item& it : items) {
    std::string path = files_.FilePath(it.addr, it.segment);
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
