// BlockCache: dataset blocks on the node's local disk, under a hard capacity limit.
//
// Layout: one sparse file per dataset file and version, `DIR/blocks/<dataset>/<version>/<file>`,
// with each block written in place at its natural offset. So a fully resident file is a plain
// copy of the original (the kernel can read it directly later), and any block can be sent to a
// peer by offset. A small RocksDB index (`DIR/index`) records every resident block with its
// XXH3-64 checksum; it is the commit point: a block is resident only once its index record is
// written after its bytes, so a crash mid-write leaves no half block behind. Evicted blocks are
// freed with fallocate(PUNCH_HOLE).
//
// Eviction and admission: see cache_policy.h. Blocks being served (pinned) are never evicted or
// punched; a block dropped as corrupt while pinned is punched when its last pin goes.
//
// Thread-safe; one mutex guards the in-memory state, disk writes happen outside it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "cachefs/cache_policy.h"
#include "common/ids.h"

namespace rocksdb {
class DB;
}

namespace ember::cachefs {

// Reads exactly len bytes at offset (retrying short reads and EINTR). False on error or EOF.
bool PreadFull(int fd, uint64_t offset, size_t len, char* buf);

class BlockCache {
 public:
  struct Options {
    std::string dir;
    uint64_t capacity_bytes = 0;
    uint64_t expected_block_size = kDefaultBlockSize;  // sizes the frequency sketch
    // Writes blocks with O_DIRECT (the 4 KiB-aligned part of each, when the caller's bytes are
    // 4 KiB-aligned in memory, as BlockBuffers are): no page-cache copy and no
    // dirty pages on the fill path; the bytes reach the page cache when first read. Falls back
    // to buffered writes where the file system refuses O_DIRECT.
    bool direct_writes = true;
  };

  // Opens (or creates) the cache and loads its index. Blocks whose cache file is missing are
  // forgotten. Returns: Ok; FailedPrecondition (dir not writable); the index's error.
  static absl::StatusOr<std::unique_ptr<BlockCache>> Open(const Options& options);
  ~BlockCache();

  // A resident block, held against eviction while this object lives (its fd stays open).
  struct Pin {
    BlockAddr addr;
    int fd = -1;
    uint64_t offset = 0;
    uint32_t length = 0;
    uint64_t checksum = 0;
    bool verified = false;             // checked against its checksum since this agent started
    uint64_t generation = 0;           // which stored copy of the block this is
    std::shared_ptr<const void> file;  // keeps fd open (shared with other pins of the file)
  };
  using PinPtr = std::shared_ptr<const Pin>;

  // Records an access (hit or miss) for the policy; returns the pinned block or nullptr.
  PinPtr Acquire(const BlockAddr& addr, bool record_access = true);
  // Records an access served from elsewhere (a copy in memory) as Acquire would, without a pin.
  void Touch(const BlockAddr& addr);
  void MarkVerified(const BlockAddr& addr);
  // Trusts every loaded block as verified: for an agent that took over from (or reattached after)
  // one that ran on this cache moments ago, with no writer in between. Not after a restart.
  void MarkAllVerified();

  enum class InsertResult { kStored, kNotAdmitted, kNoSpace, kError };
  // Stores a block of a file of `file_size` bytes at `offset`. kNotAdmitted: the policy kept the
  // resident blocks (the caller serves the bytes without caching); kNoSpace: the disk is full.
  InsertResult Insert(const BlockAddr& addr, uint64_t file_size, uint64_t offset,
                      std::string_view data, uint64_t checksum);
  // Forgets a block whose bytes are wrong; its range is punched once no reader holds it.
  // With a generation, only that stored copy is dropped (not a good copy stored since).
  // Returns true if this call dropped it.
  bool Drop(const BlockAddr& addr, uint64_t generation = 0);
  bool Resident(const BlockAddr& addr);
  // Keeps a resident block from eviction until `until_unix_ms` (0 releases it). Pins survive
  // restarts. Returns false if the block is not resident.
  bool SetPin(const BlockAddr& addr, int64_t until_unix_ms);

  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t used_bytes = 0;
    uint64_t resident_blocks = 0;
    uint64_t evictions = 0;
    uint64_t not_admitted = 0;
    uint64_t pinned_bytes = 0;
    std::map<uint32_t, uint64_t> pinned_bytes_by_dataset;
  };
  Stats GetStats();

  // Blocks added and removed since the last call (for incremental reports to meta).
  void TakeChanges(std::vector<BlockAddr>* added, std::vector<BlockAddr>* removed);
  // Every file with resident blocks and its bitmap (bit i = block i), for a full report.
  void ForEachResidentFile(
      const std::function<void(uint32_t dataset_id, uint32_t version, uint64_t file_id,
                               const std::string& bitmap)>& fn);

  std::string FilePath(const BlockAddr& addr) const;

  // Reads every resident block back and checks it against its index record (an offline check:
  // `ember cache verify`). With repair, damaged blocks are dropped (refetched on the next read).
  // progress(done, total) is called as it goes.
  struct VerifyReport {
    uint64_t blocks = 0, bytes = 0, damaged = 0;
    std::vector<std::string> damaged_files;  // cache files holding damaged blocks (first 20)
  };
  VerifyReport VerifyAll(bool repair, const std::function<void(uint64_t, uint64_t)>& progress = {});

 private:
  // One per resident block: 64 bytes, in a std::map node of 128 (a 1,000,000-block cache holds
  // ~130 MB of index in memory). The LRU list runs through the entries themselves.
  struct Entry;
  using Node = std::pair<const BlockAddr, Entry>;
  struct Entry {
    uint64_t checksum = 0;
    uint64_t offset = 0;
    uint64_t generation = 0;
    int64_t pinned_until_ms = 0;  // unix ms; evictable once past
    Node* lru_prev = nullptr;     // toward the most recently used
    Node* lru_next = nullptr;     // toward the least recently used
    uint32_t length = 0;
    int32_t pins = 0;
    bool verified = false;
    bool writing = false;  // bytes being written, not yet resident
    bool doomed = false;   // dropped while pinned
  };

  explicit BlockCache(const Options& options);
  // REQUIRES: mu_ held. A read-only fd of the block's cache file, kept open across reads so the
  // hot path does not open and close the file per request. nullptr if it cannot be opened.
  std::shared_ptr<const void> OpenForRead(const BlockAddr& addr, int* fd);
  void Unpin(const BlockAddr& addr);
  // REQUIRES: mu_ held. Removes the entry (index, hole punch, counters).
  void RemoveLocked(std::map<BlockAddr, Entry>::iterator it, bool evicted);
  // REQUIRES: mu_ held. The LRU list: front = most recent.
  void LruPushFront(Node* n);
  void LruUnlink(Node* n);
  // REQUIRES: mu_ held. Unlinks and erases an entry (no index or counter changes).
  void EraseLocked(std::map<BlockAddr, Entry>::iterator it);
  void PunchHole(const BlockAddr& addr, uint64_t offset, uint32_t length);

  Options options_;
  std::atomic<bool> direct_writes_;  // cleared when the file system refuses O_DIRECT
  std::unique_ptr<rocksdb::DB> index_;
  std::mutex mu_;
  std::map<BlockAddr, Entry> blocks_;  // GUARDED_BY(mu_)
  Node* lru_front_ = nullptr;          // GUARDED_BY(mu_), most recent
  Node* lru_back_ = nullptr;           // GUARDED_BY(mu_), least recent
  CachePolicy policy_;                 // GUARDED_BY(mu_)
  uint64_t used_ = 0;                  // GUARDED_BY(mu_), includes blocks being written
  uint64_t evictions_ = 0, not_admitted_ = 0;
  uint64_t next_generation_ = 1;
  bool disk_full_logged_ = false;
  std::vector<BlockAddr> added_, removed_;  // GUARDED_BY(mu_)
  // Open read-only fds by (dataset, version, file); cache files are never unlinked, only punched,
  // so an fd stays valid. Capped; pins keep their own reference when an entry is dropped.
  std::map<std::tuple<uint32_t, uint32_t, uint64_t>, std::shared_ptr<const void>> read_fds_;
};

}  // namespace ember::cachefs
