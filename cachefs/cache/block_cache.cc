// BlockCache: residency, holds, admission and eviction. Storing blocks is in insert.cc, opening
// and loading the index in recovery.cc, verification in verify.cc, the file I/O in
// cache_files.cc.
#include "cachefs/cache/block_cache.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/units.h"

namespace ember::cachefs {
namespace {

// Now on the clock ctimes are taken from.
uint64_t RealtimeNs() {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

uint64_t PolicyHash(const BlockAddr& a) { return MakeBlockId(a).lo; }

}  // namespace

void BlockCache::Touch(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  policy_.RecordAccess(PolicyHash(addr));
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.writing || it->second.doomed) return;
  LruUnlink(&*it);
  LruPushFront(&*it);
}

BlockHoldPtr BlockCache::Acquire(const BlockAddr& addr, bool record_access) {
  absl::MutexLock lock(&mu_);
  if (record_access) policy_.RecordAccess(PolicyHash(addr));
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.writing || it->second.doomed) return nullptr;
  Entry& e = it->second;
  int fd = -1;
  auto file = OpenForRead(addr, e.segment, &fd);
  if (!file) {
    spdlog::warn("cache: block file {} vanished: {}", files_.FilePath(addr, e.segment),
                 strerror(errno));
    RemoveLocked(it, false);
    return nullptr;
  }
  e.holds++;
  LruUnlink(&*it);
  LruPushFront(&*it);
  auto* hold = new BlockHold{addr,           fd,           e.offset,        e.length, e.checksum,
                             e.checked != 0, e.generation, std::move(file), e.segment};
  return BlockHoldPtr(hold, [this](const BlockHold* h) {
    Release(h->addr);
    delete h;
  });
}

std::shared_ptr<const void> BlockCache::OpenForRead(const BlockAddr& addr, uint32_t segment,
                                                    int* fd) {
  constexpr size_t kMaxOpenFiles = 1024;
  const FileKey key = KeyOf(addr, segment);
  auto it = read_fds_.find(key);
  if (it != read_fds_.end()) {
    *fd = *static_cast<const int*>(it->second.get());
    return it->second;
  }
  int f = open(files_.FilePath(addr, segment).c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) return nullptr;
  // No readahead: it would pull pages of other blocks into the page cache, unchecked, behind the
  // verification of what is served (block_cache.h). A block's first read reads all of it anyway.
  posix_fadvise(f, 0, 0, POSIX_FADV_RANDOM);
  std::shared_ptr<const void> holder(new int(f), [](const void* p) {
    close(*static_cast<const int*>(p));
    delete static_cast<const int*>(p);
  });
  if (read_fds_.size() >= kMaxOpenFiles) read_fds_.erase(read_fds_.begin());
  read_fds_.emplace(key, holder);
  *fd = f;
  return holder;
}

std::shared_ptr<const void> BlockCache::OpenBacking(const BlockAddr& addr, int* fd) {
  // One fd per cache file, shared by its passthrough opens (an open(2) per file open costs small
  // files a fifth of their opens), kept like the daemon's read fds but with readahead on.
  constexpr size_t kMaxOpenFiles = 1024;
  absl::MutexLock lock(&mu_);
  auto b = blocks_.find(addr);
  if (b != blocks_.end() && b->second.segment != 0) return nullptr;  // packed: no file of its own
  auto it = backing_fds_.find(KeyOf(addr, 0));
  if (it != backing_fds_.end()) {
    *fd = *static_cast<const int*>(it->second.get());
    return it->second;
  }
  int f = open(FilePath(addr).c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) return nullptr;
  std::shared_ptr<const void> holder(new int(f), [](const void* p) {
    close(*static_cast<const int*>(p));
    delete static_cast<const int*>(p);
  });
  if (backing_fds_.size() >= kMaxOpenFiles) backing_fds_.erase(backing_fds_.begin());
  backing_fds_.emplace(KeyOf(addr, 0), holder);
  *fd = f;
  return holder;
}

void BlockCache::Release(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(addr);
  if (it == blocks_.end()) return;
  if (--it->second.holds == 0 && it->second.doomed) {
    const uint32_t seg = it->second.segment;
    OwnChangeLocked(addr, seg, files_.PunchHole(addr, seg, it->second.offset, it->second.length));
    used_ -= it->second.length;
    EraseLocked(it);
  }
}

void BlockCache::SetQuarantineListener(std::function<void(const BlockAddr&)> listener) {
  quarantine_listener_ = std::move(listener);
}

bool BlockCache::StampAgreesLocked(const BlockAddr& addr, uint32_t segment, uint64_t stamp) {
  if (stamp == 0) return false;
  auto [it, fresh] = files_state_.emplace(KeyOf(addr, segment), FileState{stamp, 0, false});
  FileState& f = it->second;
  if (fresh) return false;  // first sight: a baseline, nothing known yet
  if (f.stamp == stamp) {
    // A change someone else made is trusted only once its bytes must have landed: a reader
    // that checked the old bytes between the ctime's change and the new bytes' copy must not
    // make the block trusted (IntegrityTest.ReadersDuringQuarantineGetNoWrongBytes, rarely,
    // under load: the writer was preempted between the two).
    return !f.foreign || RealtimeNs() >= stamp + kSettleNs;
  }
  if (stamp < f.stamp) return false;  // an older look
  // Our own write to another range of the file is under way (a fill's block stored beside the
  // ones being read): the change may be ours or someone else's. Not taken as agreeing (each
  // reader meanwhile checks its own block whole), nor as someone else's (that would drop every
  // block's checks). Taking it as ours let a corruption made during a refill be served
  // unchecked (IntegrityTest.ReadersDuringQuarantineGetNoWrongBytes, once in a CI run).
  if (f.writers > 0) return false;
  // Newer than the agent's own last change: someone else wrote the file. Nothing of it is known.
  f.stamp = stamp;
  f.foreign = true;
  uint64_t cleared = 0;
  auto clear = [&](Entry& e) {
    cleared += e.checked || e.verified;
    e.checked = e.verified = false;
  };
  if (segment != 0) {
    for (auto& [a, e] : blocks_) {  // rare: a walk of everything beats an index per segment
      if (e.segment == segment) clear(e);
    }
  } else {
    const BlockAddr first{addr.dataset_id, addr.version, addr.file_id, 0};
    for (auto b = blocks_.lower_bound(first);
         b != blocks_.end() && KeyOf(b->first, 0) == KeyOf(addr, 0); ++b) {
      if (b->second.segment == 0) clear(b->second);
    }
  }
  foreign_changes_++;
  spdlog::warn(
      "cache: {} was changed by someone else; its {} block(s) are checked again before "
      "they are served",
      files_.FilePath(addr, segment), cleared);
  return false;
}

void BlockCache::OwnChangeLocked(const BlockAddr& addr, uint32_t segment, uint64_t stamp) {
  if (stamp == 0) return;
  FileState& f = files_state_[KeyOf(addr, segment)];
  if (stamp >= f.stamp) {
    f.stamp = stamp;
    f.foreign = false;
  }
}

void BlockCache::ForgetPageChecks(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  const BlockAddr first{addr.dataset_id, addr.version, addr.file_id, 0};
  for (auto b = blocks_.lower_bound(first);
       b != blocks_.end() && KeyOf(b->first, 0) == KeyOf(addr, 0); ++b) {
    b->second.verified = false;
  }
}

bool BlockCache::AllChecked(const std::vector<std::shared_ptr<const BlockHold>>& holds) {
  if (holds.empty()) return false;
  const uint64_t stamp = ChangeStamp(holds.front()->fd);
  absl::MutexLock lock(&mu_);
  if (!StampAgreesLocked(holds.front()->addr, holds.front()->segment, stamp)) return false;
  for (const auto& h : holds) {
    auto it = blocks_.find(h->addr);
    if (it == blocks_.end() || it->second.generation != h->generation || it->second.doomed ||
        !it->second.checked) {
      return false;
    }
  }
  return true;
}

std::vector<BlockAddr> BlockCache::BlocksAfter(const BlockAddr* after, size_t max) {
  absl::MutexLock lock(&mu_);
  std::vector<BlockAddr> out;
  auto it = after == nullptr ? blocks_.begin() : blocks_.upper_bound(*after);
  for (; it != blocks_.end() && out.size() < max; ++it) {
    if (!it->second.writing && !it->second.doomed) out.push_back(it->first);
  }
  return out;
}

bool BlockCache::Resident(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(addr);
  return it != blocks_.end() && !it->second.writing && !it->second.doomed;
}

void BlockCache::RemoveLocked(Blocks::iterator it, bool evicted) {
  const BlockAddr addr = it->first;
  if (absl::Status st = index_->Delete(addr); !st.ok()) {
    // Its record is dropped at the next start anyway: the range is punched below.
    spdlog::warn("cache: cannot remove block {}/{}/{}/{} from the index: {}", addr.dataset_id,
                 addr.version, addr.file_id, addr.index, std::string(st.message()));
  }
  removed_.push_back(addr);
  if (evicted) evictions_++;
  if (it->second.holds > 0) {
    it->second.doomed = true;  // punched by the last Release
    return;
  }
  const uint32_t seg = it->second.segment;
  OwnChangeLocked(addr, seg, files_.PunchHole(addr, seg, it->second.offset, it->second.length));
  used_ -= it->second.length;
  EraseLocked(it);
}

void BlockCache::LruPushFront(Node* n) {
  n->second.lru_prev = nullptr;
  n->second.lru_next = lru_front_;
  (lru_front_ != nullptr ? lru_front_->second.lru_prev : lru_back_) = n;
  lru_front_ = n;
}

void BlockCache::LruUnlink(Node* n) {
  Entry& e = n->second;
  (e.lru_prev != nullptr ? e.lru_prev->second.lru_next : lru_front_) = e.lru_next;
  (e.lru_next != nullptr ? e.lru_next->second.lru_prev : lru_back_) = e.lru_prev;
  e.lru_prev = e.lru_next = nullptr;
}

void BlockCache::EraseLocked(Blocks::iterator it) {
  const BlockAddr addr = it->first;
  const uint32_t segment = it->second.segment;
  LruUnlink(&*it);
  blocks_.erase(it);
  if (segment != 0) {
    SegmentLostLocked(segment);
    return;
  }
  // The file's state goes with its last block (unless a write of it is under way).
  auto next = blocks_.lower_bound(BlockAddr{addr.dataset_id, addr.version, addr.file_id, 0});
  if (next == blocks_.end() || KeyOf(next->first, 0) != KeyOf(addr, 0)) {
    auto f = files_state_.find(KeyOf(addr, 0));
    if (f != files_state_.end() && f->second.writers == 0) files_state_.erase(f);
  }
}

void BlockCache::SegmentLostLocked(uint32_t segment) {
  auto n = segment_objects_.find(segment);
  if (n == segment_objects_.end() || --n->second > 0) return;
  if (!files_.RemoveSegment(segment)) return;  // the active one: looked at when appends move on
  segment_objects_.erase(n);
  const FileKey key = KeyOf({}, segment);
  read_fds_.erase(key);
  auto f = files_state_.find(key);
  if (f != files_state_.end() && f->second.writers == 0) files_state_.erase(f);
}

std::string BlockCache::PathOf(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(addr);
  return it == blocks_.end() ? std::string() : files_.FilePath(addr, it->second.segment);
}

bool BlockCache::Drop(const BlockAddr& addr, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.writing || it->second.doomed) return false;
  if (generation != 0 && it->second.generation != generation) return false;
  RemoveLocked(it, false);
  return true;
}

bool BlockCache::MakeRoom(const BlockAddr& addr, uint32_t len) {
  if (used_ + len <= options_.capacity_bytes) return true;
  const int64_t now_ms = NowUnixMs();
  // Choose victims from the LRU end, skipping held, pinned and in-flight blocks.
  std::vector<Blocks::iterator> victims;
  uint64_t freed = 0;
  uint32_t victim_max = 0;
  for (Node* n = lru_back_; n != nullptr && used_ + len - freed > options_.capacity_bytes;
       n = n->second.lru_prev) {
    auto v = blocks_.find(n->first);
    if (v->second.holds > 0 || v->second.writing || v->second.doomed ||
        v->second.pinned_until_ms > now_ms) {
      continue;
    }
    victims.push_back(v);
    freed += v->second.length;
    victim_max = std::max(victim_max, policy_.Frequency(PolicyHash(v->first)));
  }
  if (used_ + len - freed > options_.capacity_bytes ||
      !policy_.Admit(PolicyHash(addr), victim_max)) {
    return false;
  }
  for (auto v : victims) RemoveLocked(v, true);
  return true;
}

bool BlockCache::SetPin(const BlockAddr& addr, int64_t until_unix_ms) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.writing || it->second.doomed) return false;
  Entry& e = it->second;
  if (e.pinned_until_ms == until_unix_ms) return true;
  e.pinned_until_ms = until_unix_ms;
  if (absl::Status st =
          index_->Put({addr, e.checksum, e.offset, e.length, until_unix_ms, e.segment});
      !st.ok()) {
    // Held in memory for this agent's lifetime; a restart forgets the pin.
    spdlog::warn("cache: cannot store the pin of block {}/{}/{}/{}: {}", addr.dataset_id,
                 addr.version, addr.file_id, addr.index, std::string(st.message()));
  }
  return true;
}

BlockCache::Stats BlockCache::GetStats() {
  absl::MutexLock lock(&mu_);
  Stats s;
  const int64_t now_ms = NowUnixMs();
  for (const auto& [a, e] : blocks_) {
    if (e.pinned_until_ms > now_ms && !e.doomed) {
      s.pinned_bytes += e.length;
      s.pinned_bytes_by_dataset[a.dataset_id] += e.length;
    }
  }
  s.capacity_bytes = options_.capacity_bytes;
  s.used_bytes = used_;
  s.resident_blocks = blocks_.size() - writing_;  // not those being written
  s.evictions = evictions_;
  s.not_admitted = not_admitted_;
  s.checksum_failures = checksum_failures_;
  s.verifications = verifications_;
  s.foreign_changes = foreign_changes_;
  s.recent_corruptions = corruptions_;
  return s;
}

void BlockCache::TakeChanges(std::vector<BlockAddr>* added, std::vector<BlockAddr>* removed) {
  absl::MutexLock lock(&mu_);
  added->swap(added_);
  removed->swap(removed_);
  added_.clear();
  removed_.clear();
}

void BlockCache::ForEachResidentFile(
    const std::function<void(uint32_t, uint32_t, uint64_t, const std::string&)>& fn) {
  std::vector<std::tuple<uint32_t, uint32_t, uint64_t, std::string>> files;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [a, e] : blocks_) {
      if (e.writing || e.doomed) continue;
      if (files.empty() || std::get<0>(files.back()) != a.dataset_id ||
          std::get<1>(files.back()) != a.version || std::get<2>(files.back()) != a.file_id) {
        files.emplace_back(a.dataset_id, a.version, a.file_id, std::string());
      }
      std::string& bm = std::get<3>(files.back());
      if (bm.size() <= a.index / 8) bm.resize(a.index / 8 + 1, '\0');
      bm[a.index / 8] = static_cast<char>(bm[a.index / 8] | (1 << (a.index % 8)));
    }
  }
  for (const auto& [ds, ver, file, bm] : files) fn(ds, ver, file, bm);
}

}  // namespace ember::cachefs
