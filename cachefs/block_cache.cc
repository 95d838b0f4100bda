#include "cachefs/block_cache.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "cachefs/index_record.h"

namespace ember::cachefs {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t PolicyHash(const BlockAddr& a) { return MakeBlockId(a).lo; }

constexpr size_t kDirectAlign = 4096;  // offset, length and memory alignment for O_DIRECT

// Writes all of data at offset; returns 0 or an errno.
int PwriteFull(int fd, const char* data, size_t len, uint64_t offset) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pwrite(fd, data + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno != EINTR) return errno;
    } else if (n == 0) {
      return EIO;
    } else {
      done += static_cast<size_t>(n);
    }
  }
  return 0;
}

// Writes data at offset through fd (opened with O_DIRECT, data 4 KiB-aligned in memory): the
// aligned part straight from data, then the unaligned tail with O_DIRECT cleared. 0 or an errno.
int DirectWrite(int fd, std::string_view data, uint64_t offset) {
  const size_t aligned = data.size() / kDirectAlign * kDirectAlign;
  if (int err = PwriteFull(fd, data.data(), aligned, offset); err != 0) return err;
  if (aligned == data.size()) return 0;
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) return errno;
  return PwriteFull(fd, data.data() + aligned, data.size() - aligned, offset + aligned);
}

}  // namespace

BlockCache::BlockCache(const Options& options)
    : options_(options),
      direct_writes_(options.direct_writes),
      policy_(std::max<uint64_t>(1, options.capacity_bytes / options.expected_block_size)) {}

BlockCache::~BlockCache() {
  if (index_) index_->Close();
}

std::string BlockCache::FilePath(const BlockAddr& a) const {
  return absl::StrCat(options_.dir, "/blocks/", a.dataset_id, "/", a.version, "/", a.file_id);
}

absl::StatusOr<std::unique_ptr<BlockCache>> BlockCache::Open(const Options& options) {
  std::error_code ec;
  std::filesystem::create_directories(options.dir + "/blocks", ec);
  std::string probe = options.dir + "/.write-probe";
  int fd = ec ? -1 : open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cache dir '", options.dir, "' is not writable: ", ec ? ec.message() : strerror(errno)));
  }
  close(fd);
  unlink(probe.c_str());

  std::unique_ptr<BlockCache> cache(new BlockCache(options));
  rocksdb::Options ro;
  ro.create_if_missing = true;
  ro.write_buffer_size = 8 << 20;
  ro.max_open_files = 64;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(ro, options.dir + "/index", &db);
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open cache index in '", options.dir, "': ", s.ToString()));
  }
  cache->index_.reset(db);

  // Load the index; forget blocks whose file is gone.
  std::set<std::string> missing_files, present_files;
  std::vector<std::string> stale_keys;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto rec = DecodeIndexRecord(std::string_view(it->key().data(), it->key().size()),
                                 std::string_view(it->value().data(), it->value().size()));
    if (!rec) {
      stale_keys.push_back(it->key().ToString());
      continue;
    }
    const BlockAddr a = rec->addr;
    Entry e;
    e.checksum = rec->checksum;
    e.offset = rec->offset;
    e.length = rec->length;
    e.pinned_until_ms = rec->pinned_until_ms;
    e.generation = cache->next_generation_++;
    std::string path = cache->FilePath(a);
    if (!present_files.count(path)) {
      struct stat st;
      bool ok = !missing_files.count(path) && stat(path.c_str(), &st) == 0 &&
                static_cast<uint64_t>(st.st_size) >= e.offset + e.length;
      if (!ok) {
        missing_files.insert(path);
        stale_keys.push_back(it->key().ToString());
        continue;
      }
      present_files.insert(path);
    }
    cache->used_ += e.length;
    auto [node, inserted] = cache->blocks_.emplace(a, e);
    // Loaded in key order; all start as the least recent, in that order.
    Node* n = &*node;
    n->second.lru_prev = cache->lru_back_;
    (cache->lru_back_ != nullptr ? cache->lru_back_->second.lru_next : cache->lru_front_) = n;
    cache->lru_back_ = n;
  }
  for (const auto& k : stale_keys) db->Delete(rocksdb::WriteOptions(), k);
  if (!stale_keys.empty()) {
    spdlog::warn(
        "cache: forgot {} index records that were damaged or whose cache files were missing or "
        "short",
        stale_keys.size());
  }
  // A smaller capacity than last time: evict down to it (unpinned blocks first).
  {
    std::lock_guard lock(cache->mu_);
    const int64_t now_ms = NowMs();
    std::vector<BlockAddr> victims;
    uint64_t used = cache->used_;
    for (Node* n = cache->lru_back_; n != nullptr && used > options.capacity_bytes;
         n = n->second.lru_prev) {
      if (n->second.pinned_until_ms > now_ms) continue;
      victims.push_back(n->first);
      used -= n->second.length;
    }
    for (const auto& v : victims) cache->RemoveLocked(cache->blocks_.find(v), true);
    cache->added_.clear();
    cache->removed_.clear();
  }
  spdlog::info("cache: {} resident blocks, {} of {} bytes used, in {}", cache->blocks_.size(),
               cache->used_, options.capacity_bytes, options.dir);
  return cache;
}

void BlockCache::Touch(const BlockAddr& addr) {
  std::lock_guard lock(mu_);
  policy_.RecordAccess(PolicyHash(addr));
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.writing || it->second.doomed) return;
  LruUnlink(&*it);
  LruPushFront(&*it);
}

BlockCache::PinPtr BlockCache::Acquire(const BlockAddr& addr, bool record_access) {
  std::lock_guard lock(mu_);
  if (record_access) policy_.RecordAccess(PolicyHash(addr));
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.writing || it->second.doomed) return nullptr;
  Entry& e = it->second;
  int fd = -1;
  auto file = OpenForRead(addr, &fd);
  if (!file) {
    spdlog::warn("cache: block file {} vanished: {}", FilePath(addr), strerror(errno));
    RemoveLocked(it, false);
    return nullptr;
  }
  e.pins++;
  LruUnlink(&*it);
  LruPushFront(&*it);
  auto* pin =
      new Pin{addr, fd, e.offset, e.length, e.checksum, e.verified, e.generation, std::move(file)};
  return PinPtr(pin, [this](const Pin* p) {
    Unpin(p->addr);
    delete p;
  });
}

std::shared_ptr<const void> BlockCache::OpenForRead(const BlockAddr& addr, int* fd) {
  constexpr size_t kMaxOpenFiles = 1024;
  auto key = std::make_tuple(addr.dataset_id, addr.version, addr.file_id);
  auto it = read_fds_.find(key);
  if (it != read_fds_.end()) {
    *fd = *static_cast<const int*>(it->second.get());
    return it->second;
  }
  int f = open(FilePath(addr).c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) return nullptr;
  std::shared_ptr<const void> holder(new int(f), [](const void* p) {
    close(*static_cast<const int*>(p));
    delete static_cast<const int*>(p);
  });
  if (read_fds_.size() >= kMaxOpenFiles) read_fds_.erase(read_fds_.begin());
  read_fds_.emplace(key, holder);
  *fd = f;
  return holder;
}

void BlockCache::Unpin(const BlockAddr& addr) {
  std::lock_guard lock(mu_);
  auto it = blocks_.find(addr);
  if (it == blocks_.end()) return;
  if (--it->second.pins == 0 && it->second.doomed) {
    PunchHole(addr, it->second.offset, it->second.length);
    used_ -= it->second.length;
    EraseLocked(it);
  }
}

void BlockCache::MarkVerified(const BlockAddr& addr) {
  std::lock_guard lock(mu_);
  auto it = blocks_.find(addr);
  if (it != blocks_.end()) it->second.verified = true;
}

void BlockCache::MarkAllVerified() {
  std::lock_guard lock(mu_);
  for (auto& [addr, e] : blocks_) e.verified = true;
}

bool BlockCache::Resident(const BlockAddr& addr) {
  std::lock_guard lock(mu_);
  auto it = blocks_.find(addr);
  return it != blocks_.end() && !it->second.writing && !it->second.doomed;
}

void BlockCache::PunchHole(const BlockAddr& addr, uint64_t offset, uint32_t length) {
  int fd = open(FilePath(addr).c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                length) != 0) {
    spdlog::warn("cache: cannot punch hole in {}: {}", FilePath(addr), strerror(errno));
  }
  close(fd);
}

void BlockCache::RemoveLocked(std::map<BlockAddr, Entry>::iterator it, bool evicted) {
  const BlockAddr addr = it->first;
  index_->Delete(rocksdb::WriteOptions(), EncodeIndexKey(addr));
  removed_.push_back(addr);
  if (evicted) evictions_++;
  if (it->second.pins > 0) {
    it->second.doomed = true;  // punched by the last Unpin
    return;
  }
  PunchHole(addr, it->second.offset, it->second.length);
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

void BlockCache::EraseLocked(std::map<BlockAddr, Entry>::iterator it) {
  LruUnlink(&*it);
  blocks_.erase(it);
}

bool BlockCache::Drop(const BlockAddr& addr, uint64_t generation) {
  std::lock_guard lock(mu_);
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.writing || it->second.doomed) return false;
  if (generation != 0 && it->second.generation != generation) return false;
  RemoveLocked(it, false);
  return true;
}

BlockCache::InsertResult BlockCache::Insert(const BlockAddr& addr, uint64_t file_size,
                                            uint64_t offset, std::string_view data,
                                            uint64_t checksum) {
  const uint32_t len = static_cast<uint32_t>(data.size());
  {
    std::lock_guard lock(mu_);
    auto existing = blocks_.find(addr);
    if (existing != blocks_.end()) {
      return existing->second.writing || existing->second.doomed ? InsertResult::kNotAdmitted
                                                                 : InsertResult::kStored;
    }
    if (len > options_.capacity_bytes) {
      not_admitted_++;
      return InsertResult::kNotAdmitted;
    }
    if (used_ + len > options_.capacity_bytes) {
      const int64_t now_ms = NowMs();
      // Choose victims from the LRU end, skipping pinned and in-flight blocks.
      std::vector<std::map<BlockAddr, Entry>::iterator> victims;
      uint64_t freed = 0;
      uint32_t victim_max = 0;
      for (Node* n = lru_back_; n != nullptr && used_ + len - freed > options_.capacity_bytes;
           n = n->second.lru_prev) {
        auto v = blocks_.find(n->first);
        if (v->second.pins > 0 || v->second.writing || v->second.doomed ||
            v->second.pinned_until_ms > now_ms) {
          continue;
        }
        victims.push_back(v);
        freed += v->second.length;
        victim_max = std::max(victim_max, policy_.Frequency(PolicyHash(v->first)));
      }
      if (used_ + len - freed > options_.capacity_bytes ||
          !policy_.Admit(PolicyHash(addr), victim_max)) {
        not_admitted_++;
        return InsertResult::kNotAdmitted;
      }
      for (auto v : victims) RemoveLocked(v, true);
    }
    Entry e;
    e.writing = true;
    e.checksum = checksum;
    e.offset = offset;
    e.length = len;
    e.verified = true;  // the caller checked these bytes
    e.generation = next_generation_++;
    LruPushFront(&*blocks_.emplace(addr, e).first);
    used_ += len;
  }

  // Write the bytes outside the lock, then commit through the index.
  std::string path = FilePath(addr);
  int err = 0;
  // O_DIRECT needs aligned memory: fills use BlockBuffers; other callers' bytes go buffered.
  bool direct = direct_writes_.load(std::memory_order_relaxed) && offset % kDirectAlign == 0 &&
                reinterpret_cast<uintptr_t>(data.data()) % kDirectAlign == 0;
  int flags = O_RDWR | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0);
  int fd = open(path.c_str(), flags, 0644);
  if (fd < 0 && errno == ENOENT) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    fd = open(path.c_str(), flags, 0644);
  }
  if (fd < 0 && direct && errno == EINVAL) {
    spdlog::info("cache: {} does not take O_DIRECT; writing blocks through the page cache",
                 options_.dir);
    direct_writes_ = false;
    direct = false;
    fd = open(path.c_str(), flags & ~O_DIRECT, 0644);
  }
  if (fd < 0) {
    err = errno;
  } else {
    struct stat st;
    if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < file_size &&
        ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
      err = errno;
    }
    if (err == 0) {
      err = direct ? DirectWrite(fd, data.substr(0, len), offset)
                   : PwriteFull(fd, data.data(), len, offset);
    }
    if (err == EINVAL && direct) {  // the file system takes O_DIRECT opens but not the writes
      spdlog::info("cache: O_DIRECT writes refused under {}; writing through the page cache",
                   options_.dir);
      direct_writes_ = false;
      int fl = fcntl(fd, F_GETFL);
      err = fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0
                ? PwriteFull(fd, data.data(), len, offset)
                : errno;
    }
    if (err != 0) {
      fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), len);
    }
    close(fd);
  }
  rocksdb::Status s;
  if (err == 0) {
    s = index_->Put(rocksdb::WriteOptions(), EncodeIndexKey(addr),
                    EncodeIndexValue({addr, checksum, offset, static_cast<uint32_t>(len), 0}));
    if (!s.ok()) err = EIO;
  }

  std::lock_guard lock(mu_);
  auto it = blocks_.find(addr);
  if (err != 0) {
    used_ -= len;
    EraseLocked(it);
    not_admitted_++;
    if (err == ENOSPC || err == EDQUOT) {
      if (!disk_full_logged_) {
        spdlog::error(
            "cache: disk full under {}; serving reads without caching until space "
            "returns",
            options_.dir);
        disk_full_logged_ = true;
      }
      return InsertResult::kNoSpace;
    }
    spdlog::error("cache: cannot write block to {}: {}", path,
                  s.ok() ? strerror(err) : s.ToString());
    return InsertResult::kError;
  }
  if (disk_full_logged_) {
    // Near the edge a write can fit between failures (a failed write's pages are punched):
    // call the disk back only once there is real room, so the log says "full" once.
    struct statvfs vfs;
    if (statvfs(options_.dir.c_str(), &vfs) == 0 &&
        static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize >= 4 * len + (16u << 20)) {
      spdlog::info("cache: writing blocks again under {}", options_.dir);
      disk_full_logged_ = false;
    }
  }
  it->second.writing = false;
  added_.push_back(addr);
  return InsertResult::kStored;
}

bool BlockCache::SetPin(const BlockAddr& addr, int64_t until_unix_ms) {
  std::lock_guard lock(mu_);
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.writing || it->second.doomed) return false;
  Entry& e = it->second;
  if (e.pinned_until_ms == until_unix_ms) return true;
  e.pinned_until_ms = until_unix_ms;
  index_->Put(rocksdb::WriteOptions(), EncodeIndexKey(addr),
              EncodeIndexValue({addr, e.checksum, e.offset, e.length, until_unix_ms}));
  return true;
}

BlockCache::Stats BlockCache::GetStats() {
  std::lock_guard lock(mu_);
  Stats s;
  const int64_t now_ms = NowMs();
  for (const auto& [a, e] : blocks_) {
    if (e.pinned_until_ms > now_ms && !e.doomed) {
      s.pinned_bytes += e.length;
      s.pinned_bytes_by_dataset[a.dataset_id] += e.length;
    }
  }
  s.capacity_bytes = options_.capacity_bytes;
  s.used_bytes = used_;
  s.resident_blocks = blocks_.size();
  s.evictions = evictions_;
  s.not_admitted = not_admitted_;
  return s;
}

void BlockCache::TakeChanges(std::vector<BlockAddr>* added, std::vector<BlockAddr>* removed) {
  std::lock_guard lock(mu_);
  added->swap(added_);
  removed->swap(removed_);
  added_.clear();
  removed_.clear();
}

void BlockCache::ForEachResidentFile(
    const std::function<void(uint32_t, uint32_t, uint64_t, const std::string&)>& fn) {
  std::vector<std::tuple<uint32_t, uint32_t, uint64_t, std::string>> files;
  {
    std::lock_guard lock(mu_);
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

bool PreadFull(int fd, uint64_t offset, size_t len, char* buf) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
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
    std::lock_guard lock(mu_);
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
