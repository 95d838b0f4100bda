// cachefs/cache/: the node's local block cache. This is the folder's front door.
//
// Owns: the cache files (cache_files.h), the block index in RocksDB (block_index.h,
// index_record.h) and its recovery at start, which blocks are resident (holds, eviction,
// admission: cache_policy.h), prefetch pins with an expiry, and whether a block's bytes have been
// verified against the checksum stored with them. Also the fill buffers (block_buffer.h) whose
// bytes it writes. Must not touch: meta, peers, origins or FUSE. It knows block addresses and
// bytes, never dataset files or where bytes come from (that is fetch/).
//
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
// Holds and pins are different things. A hold (BlockHold, from Acquire) keeps one block's bytes
// and fd valid while a reply, a peer transfer or a passthrough open uses them: a held block is
// never evicted or punched, and one dropped as corrupt while held is punched when its last hold
// goes. A pin (SetPin) keeps a block from eviction until a time: prefetch `--pin`, released by
// `ember unpin`; pins are stored in the index and survive restarts.
//
// Eviction and admission: see cache_policy.h.
//
// Verification: the bytes of a block stored by this agent are trusted (the fill checked them);
// a block loaded from the index is re-read and checked once, the first time it is served
// (VerifyOnce). VerifyAll checks everything (`ember cache verify`).
//
// Thread-safe; one mutex guards the in-memory state. Block writes happen outside it; index
// deletes and hole punches of blocks that leave happen inside it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_index.h"
#include "cachefs/cache/cache_files.h"
#include "cachefs/cache/cache_policy.h"
#include "common/ids.h"

namespace ember::cachefs {

// A resident block held against eviction while this object lives (its fd stays open).
struct BlockHold {
  BlockAddr addr;
  int fd = -1;
  uint64_t offset = 0;
  uint32_t length = 0;
  uint64_t checksum = 0;
  bool verified = false;             // checked against its checksum since this agent started
  uint64_t generation = 0;           // which stored copy of the block this is
  std::shared_ptr<const void> file;  // keeps fd open (shared with other holds of the file)
};
using BlockHoldPtr = std::shared_ptr<const BlockHold>;

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

  // Opens (or creates) the cache and loads its index (recovery.cc). Blocks whose cache file is
  // missing or short, and damaged records, are forgotten; a capacity smaller than what is
  // resident evicts down to it. Returns: Ok; FailedPrecondition (dir not writable, index cannot
  // be opened).
  static absl::StatusOr<std::unique_ptr<BlockCache>> Open(const Options& options);
  ~BlockCache();

  // Records an access (hit or miss) for the policy (unless record_access is false).
  // Returns: a hold on the block, or nullptr when it is not resident.
  BlockHoldPtr Acquire(const BlockAddr& addr, bool record_access = true);
  // Records an access served from elsewhere (a copy in memory) as Acquire would, without a hold.
  void Touch(const BlockAddr& addr);
  // Checks a held block's bytes against its checksum, once per agent lifetime (verify.cc).
  // Returns: true if they are good (checked now or before); false if they are wrong: that
  // stored copy was dropped (counted in Stats::checksum_failures) and the caller fills it again.
  bool VerifyOnce(const BlockHold& hold);
  // Trusts every loaded block as verified: for an agent that took over from (or reattached after)
  // one that ran on this cache moments ago, with no writer in between. Not after a restart.
  void MarkAllVerified();

  enum class InsertResult { kStored, kNotAdmitted, kNoSpace, kError };
  // Stores a block of a file of `file_size` bytes at `offset`, whose bytes the caller checked
  // (`checksum` is theirs). Returns: kStored (also when already resident); kNotAdmitted (the
  // policy kept the resident blocks; the caller serves the bytes without caching); kNoSpace
  // (the disk is full); kError (a write or index error, logged).
  InsertResult Insert(const BlockAddr& addr, uint64_t file_size, uint64_t offset,
                      std::string_view data, uint64_t checksum);
  // Forgets a block whose bytes are wrong; its range is punched once no reader holds it.
  // With a generation, only that stored copy is dropped (not a good copy stored since).
  // Returns: true if this call dropped it.
  bool Drop(const BlockAddr& addr, uint64_t generation = 0);
  // Returns: whether the block is resident (written and not dropped).
  bool Resident(const BlockAddr& addr);
  // Pins a resident block against eviction until `until_unix_ms` (0 releases it); the pin is
  // kept in the index and survives restarts. Returns: false if the block is not resident.
  bool SetPin(const BlockAddr& addr, int64_t until_unix_ms);

  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t used_bytes = 0;
    uint64_t resident_blocks = 0;
    uint64_t evictions = 0;
    uint64_t not_admitted = 0;
    uint64_t checksum_failures = 0;  // blocks dropped because their bytes on disk were wrong
    uint64_t pinned_bytes = 0;       // prefetch pins not yet expired
    std::map<uint32_t, uint64_t> pinned_bytes_by_dataset;
  };
  Stats GetStats();

  // Blocks added and removed since the last call (for incremental reports to meta).
  void TakeChanges(std::vector<BlockAddr>* added, std::vector<BlockAddr>* removed);
  // Every file with resident blocks and its bitmap (bit i = block i), for a full report.
  void ForEachResidentFile(
      const std::function<void(uint32_t dataset_id, uint32_t version, uint64_t file_id,
                               const std::string& bitmap)>& fn);

  std::string FilePath(const BlockAddr& addr) const { return files_.FilePath(addr); }

  // Reads every resident block back and checks it against its index record (an offline check:
  // `ember cache verify`; verify.cc). With repair, damaged blocks are dropped (refetched on the
  // next read). progress(done, total) is called as it goes.
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
  using Blocks = std::map<BlockAddr, Entry>;
  struct Entry {
    uint64_t checksum = 0;
    uint64_t offset = 0;
    uint64_t generation = 0;
    int64_t pinned_until_ms = 0;  // unix ms; evictable once past
    Node* lru_prev = nullptr;     // toward the most recently used
    Node* lru_next = nullptr;     // toward the least recently used
    uint32_t length = 0;
    int32_t holds = 0;
    bool verified = false;
    bool writing = false;  // bytes being written, not yet resident
    bool doomed = false;   // dropped while held
  };

  explicit BlockCache(const Options& options);
  // Loads the index into memory (recovery.cc). Returns: how many records were forgotten.
  size_t LoadIndex() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts down to the capacity, oldest first, skipping pinned blocks (recovery.cc).
  void ShrinkToCapacity() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A read-only fd of the block's cache file, kept open across reads so the hot path does not
  // open and close the file per request. Returns: nullptr if it cannot be opened.
  std::shared_ptr<const void> OpenForRead(const BlockAddr& addr, int* fd)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The end of a hold (the deleter of BlockHoldPtr).
  void Release(const BlockAddr& addr) ABSL_LOCKS_EXCLUDED(mu_);
  void MarkVerified(const BlockAddr& addr) ABSL_LOCKS_EXCLUDED(mu_);
  // Chooses victims for `len` more bytes and evicts them, or says the block is not admitted.
  // Returns: true if there is room now.
  bool MakeRoom(const BlockAddr& addr, uint32_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the entry (index, hole punch, counters).
  void RemoveLocked(Blocks::iterator it, bool evicted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The LRU list: front = most recent.
  void LruPushFront(Node* n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruUnlink(Node* n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unlinks and erases an entry (no index or counter changes).
  void EraseLocked(Blocks::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  CacheFiles files_;
  std::unique_ptr<BlockIndex> index_;
  std::atomic<uint64_t> checksum_failures_{0};

  absl::Mutex mu_;
  Blocks blocks_ ABSL_GUARDED_BY(mu_);
  Node* lru_front_ ABSL_GUARDED_BY(mu_) = nullptr;  // most recent
  Node* lru_back_ ABSL_GUARDED_BY(mu_) = nullptr;   // least recent
  CachePolicy policy_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;  // includes blocks being written
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t not_admitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  bool disk_full_logged_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<BlockAddr> added_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockAddr> removed_ ABSL_GUARDED_BY(mu_);
  // Open read-only fds by (dataset, version, file); cache files are never unlinked, only punched,
  // so an fd stays valid. Capped; holds keep their own reference when an entry is dropped.
  std::map<std::tuple<uint32_t, uint32_t, uint64_t>, std::shared_ptr<const void>> read_fds_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::cachefs
