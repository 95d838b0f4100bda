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
// peer by offset. Small files (at most `small_file_max` bytes, one block) are packed into
// segments instead (cache_files.h): no cache file per small file. They are not offered for
// passthrough (the mount's page cache serves them; nothing to set up per open). A small RocksDB
// index (`DIR/index`) records every resident block with its XXH3-64 checksum; it is the commit
// point: a block is resident only once its index record is written after its bytes, so a crash
// mid-write leaves no half block behind. Evicted blocks are freed with fallocate(PUNCH_HOLE).
//
// Holds and pins are different things. A hold (BlockHold, from Acquire) keeps one block's bytes
// and fd valid while a reply, a peer transfer or a passthrough open uses them: a held block is
// never evicted or punched, and one dropped as corrupt while held is punched when its last hold
// goes. A pin (SetPin) keeps a block from eviction until a time: prefetch `--pin`, released by
// `ember unpin`; pins are stored in the index and survive restarts.
//
// Eviction and admission: see cache_policy.h.
//
// Verification (verify.cc, scrubber.h): nothing on disk is trusted. Two facts are kept per block:
//  - `checked`: its bytes matched its checksum since this agent started (its fill checked them,
//    or a verified read, or the scrubber) and nothing has changed the file since. A file is
//    offered for passthrough only when every block is checked.
//  - `verified`: the copy in the page cache was checked and, as far as the agent can tell, has
//    stayed there unchanged. A daemon-path read copies the bytes with RWF_NOWAIT, which fails
//    when any page must come from the disk; then, or when the block is not verified, the whole
//    block is read and checked before any byte goes out (ReadVerified; concurrent readers of
//    such a block wait for the one that checks it). So a block costs one
//    checksum per stay in memory, not one per request. What could put unchecked pages into the
//    page cache behind the agent's back is kept out: its read fds have readahead off
//    (FADV_RANDOM), passthrough has its own fd and ends a file's verified bits when it closes,
//    peers are served only checked blocks, and the scrubber reads with O_DIRECT.
// Someone else writing a cache file (a stray process, a tool) changes its ctime: the agent keeps
// each file's ctime after its own last change, and a newer one clears the file's facts. While
// the agent itself writes a block into a file (a fill stored beside the blocks being read), a
// newer ctime is taken as that write's: a change by someone else in that window goes unnoticed
// (until the scrubber reads the disk), as it would once the write's ctime is recorded. A block
// found bad is quarantined: no read gets its bytes, it leaves the index (and meta's view: peers
// stop being sent to it), it is punched once no hold remains, the event is counted and logged,
// and the quarantine listener refills it (in place, when held: a passthrough open then reads
// good bytes again).
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
  bool checked = false;              // bytes checked since this agent started (see above)
  uint64_t generation = 0;           // which stored copy of the block this is
  std::shared_ptr<const void> file;  // keeps fd open (shared with other holds of the file)
  uint32_t segment = 0;              // the small-object segment holding it; 0: its own file
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
    // Files of at most this many bytes (a single block) are packed into segments; 0: none.
    uint64_t small_file_max = 0;
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

  // ---- verification (verify.cc) ----
  // Copies [pos, pos+len) of a held block (pos: an offset in its cache file, inside the block)
  // to dst, checked: from the page cache when the block's copy there is verified and still
  // whole, else after reading and checking the whole block. Returns: Ok; DataLoss (the block's
  // bytes are wrong or unreadable: it was quarantined, the caller fills it again); Unavailable
  // (the cache file kept changing while it was read).
  absl::Status ReadVerified(const BlockHold& hold, uint64_t pos, size_t len, char* dst);
  // Before a held block's bytes are sent elsewhere straight from its cache file (a peer, by
  // sendfile or an O_DIRECT read: transport's SendFromFile): checks it unless it was checked
  // since the agent started (the receiver checks what it gets too), and, when some of its pages
  // are not in the page cache, stops trusting its page-cache copy (the send reads them from the
  // disk, unchecked). Returns: Ok; DataLoss
  // (quarantined); Unavailable (the file kept changing).
  absl::Status PrepareSend(const BlockHold& hold);
  // Reads a resident block from the disk itself (O_DIRECT, not the page cache) and checks it:
  // the scrubber's step. Returns: kGood (now checked); kBad (quarantined); kGone (not resident).
  enum class ScrubResult { kGood, kBad, kGone };
  ScrubResult ScrubBlock(const BlockAddr& addr);
  // Takes a stored copy known bad out of service (see the header): for `generation` only, when
  // given. Returns: true if this call quarantined it (others saw it first otherwise).
  bool Quarantine(const BlockAddr& addr, uint64_t generation, const std::string& why);
  // Called (on the quarantining thread, no lock held) with each block quarantined.
  void SetQuarantineListener(std::function<void(const BlockAddr&)> listener);
  // The page-cache copies of a file's blocks are no longer known good (the kernel read the
  // file itself, through passthrough). Its blocks stay checked.
  void ForgetPageChecks(const BlockAddr& any_block_of_file);
  // True when every block of the held list is checked and the file is unchanged since: what
  // passthrough needs. A file someone else changed loses its facts here.
  bool AllChecked(const std::vector<std::shared_ptr<const BlockHold>>& holds);
  // A read-only fd of a block's cache file for the kernel to read directly (passthrough: normal
  // readahead, unlike the daemon's fds), shared by the file's passthrough opens. Returns: what
  // keeps it open, nullptr on error.
  std::shared_ptr<const void> OpenBacking(const BlockAddr& addr, int* fd);
  // Up to `max` resident blocks after `after` (or from the start), in address order, with their
  // generations: the scrubber's walk.
  std::vector<BlockAddr> BlocksAfter(const BlockAddr* after, size_t max);

  enum class InsertResult { kStored, kNotAdmitted, kNoSpace, kError };
  // Stores a block of a file of `file_size` bytes at `offset`, whose bytes the caller checked
  // (`checksum` is theirs). A block quarantined while still held (a passthrough open reads its
  // file) is rewritten in place and served again. Returns: kStored (also when already
  // resident); kNotAdmitted (the policy kept the resident blocks; the caller serves the bytes
  // without caching); kNoSpace (the disk is full); kError (a write or index error, logged).
  InsertResult Insert(const BlockAddr& addr, uint64_t file_size, uint64_t offset,
                      std::string_view data, uint64_t checksum);
  // Insert of many blocks at once (write-behind's batches): small objects appended to a
  // segment in one vectored write, every record in one index batch. Returns: per item, as Insert.
  struct InsertItem {
    BlockAddr addr;
    uint64_t file_size = 0;
    uint64_t offset = 0;
    std::string_view data;
    uint64_t checksum = 0;
  };
  std::vector<InsertResult> InsertMany(const std::vector<InsertItem>& items)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a block (its bytes conflict with meta's); its range is punched once no reader holds
  // it. With a generation, only that stored copy is dropped (not a good copy stored since).
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
    uint64_t checksum_failures = 0;  // blocks quarantined: their bytes on disk were wrong
    uint64_t verifications = 0;      // whole blocks checked by reads (not counting the scrubber)
    uint64_t foreign_changes = 0;    // cache files someone else changed
    std::vector<std::string> recent_corruptions;  // the last few, newest last: time, file, block
    uint64_t pinned_bytes = 0;                    // prefetch pins not yet expired
    std::map<uint32_t, uint64_t> pinned_bytes_by_dataset;
  };
  Stats GetStats();

  // Blocks added and removed since the last call (for incremental reports to meta).
  void TakeChanges(std::vector<BlockAddr>* added, std::vector<BlockAddr>* removed);
  // Every file with resident blocks and its bitmap (bit i = block i), for a full report.
  void ForEachResidentFile(
      const std::function<void(uint32_t dataset_id, uint32_t version, uint64_t file_id,
                               const std::string& bitmap)>& fn);

  // The per-file cache file of addr's file (whether or not the block is there).
  std::string FilePath(const BlockAddr& addr) const { return files_.FilePath(addr); }
  // Where a resident block's bytes are: its file's cache file or its segment ("" if absent).
  std::string PathOf(const BlockAddr& addr) ABSL_LOCKS_EXCLUDED(mu_);

  // Reads every resident block back and checks it against its index record (an offline check:
  // `ember cache verify`; verify.cc). With repair, damaged blocks are dropped (refetched on the
  // next read). progress(done, total) is called as it goes.
  struct VerifyReport {
    uint64_t blocks = 0, bytes = 0, damaged = 0;
    std::vector<std::string> damaged_files;  // cache files holding damaged blocks (first 20)
  };
  VerifyReport VerifyAll(bool repair, const std::function<void(uint64_t, uint64_t)>& progress = {});

 private:
  // One per resident block: 56 bytes, in a std::map node of 112 (with its key and the tree's
  // links; a 1,000,000-block cache holds ~112 MB of index in memory). The LRU list runs through
  // the entries themselves.
  struct Entry;
  using Node = std::pair<const BlockAddr, Entry>;
  using Blocks = std::map<BlockAddr, Entry>;
  struct Entry {
    uint64_t checksum = 0;
    uint64_t offset = 0;
    int64_t pinned_until_ms = 0;  // unix ms; evictable once past
    Node* lru_prev = nullptr;     // toward the most recently used
    Node* lru_next = nullptr;     // toward the least recently used
    uint32_t generation = 0;      // tells a re-inserted block from the one a hold saw
    uint32_t length : 27 = 0;     // <= kMaxBlockSize
    uint32_t verified : 1 = 0;    // the page cache's copy was checked (see the header)
    uint32_t verifying : 1 = 0;   // a reader is checking the whole block; others wait for it
    uint32_t checked : 1 = 0;     // the bytes were checked since this agent started
    uint32_t writing : 1 = 0;     // bytes being written, not yet resident
    uint32_t doomed : 1 = 0;      // dropped while held
    int32_t holds = 0;
    uint32_t segment = 0;  // the small-object segment holding it; 0: its file's cache file
  };
  static_assert(sizeof(Entry) == 56);
  static_assert(kMaxBlockSize < (1u << 27));

  explicit BlockCache(const Options& options);
  // An insert under way: decided at once (already resident, not admitted, no segment), or its
  // place taken (the entry is `writing`), then written, indexed and finished.
  struct Pending {
    InsertItem item;
    uint32_t len = 0;
    bool small = false;   // into a segment
    bool revive = false;  // rewriting a quarantined copy that is still held
    CacheFiles::SmallSlot slot;
    uint64_t where = 0;  // offset in its cache file or segment
    bool decided = false;
    InsertResult result = InsertResult::kError;
    int err = 0;  // of the write (EIO: of the index)
    uint64_t stamp = 0;
  };
  // Fills in each Pending's item, length and smallness, and claims the small ones' places in a
  // segment, one run (CacheFiles::ClaimSmall); all of them decided if that fails.
  void ClaimSmall(const std::vector<InsertItem>& items, std::vector<Pending>* ps)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Decides a Pending that ClaimSmall filled in, or takes its place (`writing`).
  void BeginInsert(const InsertItem& item, Pending* p) ABSL_LOCKS_EXCLUDED(mu_);
  InsertResult FinishInsert(const Pending& p, const absl::Status& indexed) ABSL_LOCKS_EXCLUDED(mu_);
  // Loads the index into memory (recovery.cc). Returns: how many records were forgotten.
  size_t LoadIndex() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts down to the capacity, oldest first, skipping pinned blocks (recovery.cc).
  void ShrinkToCapacity() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A read-only fd of the block's cache file, kept open across reads so the hot path does not
  // open and close the file per request. Returns: nullptr if it cannot be opened.
  std::shared_ptr<const void> OpenForRead(const BlockAddr& addr, uint32_t segment, int* fd)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The end of a hold (the deleter of BlockHoldPtr).
  void Release(const BlockAddr& addr) ABSL_LOCKS_EXCLUDED(mu_);
  // What the agent knows of a cache file: its ctime after the agent's own last change, and how
  // many of the agent's writes to it are under way.
  using FileKey = std::tuple<uint32_t, uint32_t, uint64_t>;
  struct FileState {
    uint64_t stamp = 0;
    uint32_t writers = 0;
    // `stamp` is of a change someone else made while the agent ran (not the agent's own write,
    // taken after it ended, nor the baseline first seen): it may belong to a write whose bytes
    // are still being copied in (the kernel changes the ctime first), so it is trusted only
    // once it is kSettleNs old.
    bool foreign = false;
  };
  static constexpr uint64_t kSettleNs = 2'000'000'000;
  // A segment's key: (kSegmentKey, 0, segment).
  static constexpr uint32_t kSegmentKey = ~0u;
  static FileKey KeyOf(const BlockAddr& a, uint32_t segment) {
    if (segment != 0) return {kSegmentKey, 0, segment};
    return {a.dataset_id, a.version, a.file_id};
  }
  // Compares `stamp` (a ctime read now) with what the agent knows. Returns: true if they agree;
  // false if unknown or stale (nothing is trusted for this read), clearing the file's facts when
  // someone else changed it.
  bool StampAgreesLocked(const BlockAddr& addr, uint32_t segment, uint64_t stamp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the agent's own change of a file (its ctime after it).
  void OwnChangeLocked(const BlockAddr& addr, uint32_t segment, uint64_t stamp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A segment lost an object: deleted once empty (the active one is kept; it is looked at again
  // when appends move on).
  void SegmentLostLocked(uint32_t segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the segment files no record refers to (recovery.cc).
  void RemoveDeadSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a held block's whole copy now and, if good, marks it checked (and verified, if the file
  // did not change meanwhile). Copies [pos, pos+len) to dst when dst is set.
  absl::Status VerifyNow(const BlockHold& hold, uint64_t before, uint64_t pos, size_t len,
                         char* dst) ABSL_LOCKS_EXCLUDED(mu_);
  // Chooses victims for `len` more bytes and evicts them, or says the block is not admitted.
  // Returns: true if there is room now.
  bool MakeRoom(const BlockAddr& addr, uint32_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the entry (index, hole punch, counters).
  void RemoveLocked(Blocks::iterator it, bool evicted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The LRU list: front = most recent.
  void LruPushFront(Node* n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruUnlink(Node* n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t NewGenerationLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint32_t g = next_generation_++;
    if (next_generation_ == 0) next_generation_ = 1;
    return g;
  }
  // Unlinks and erases an entry (no index or counter changes).
  void EraseLocked(Blocks::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  CacheFiles files_;
  std::unique_ptr<BlockIndex> index_;
  std::atomic<uint64_t> checksum_failures_{0};
  std::atomic<uint64_t> verifications_{0};
  std::atomic<uint64_t> foreign_changes_{0};
  std::function<void(const BlockAddr&)> quarantine_listener_;  // set once, before use

  absl::Mutex mu_;
  absl::CondVar verified_cv_;  // an Entry's `verifying` ended
  Blocks blocks_ ABSL_GUARDED_BY(mu_);
  Node* lru_front_ ABSL_GUARDED_BY(mu_) = nullptr;  // most recent
  Node* lru_back_ ABSL_GUARDED_BY(mu_) = nullptr;   // least recent
  CachePolicy policy_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;  // includes blocks being written
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t not_admitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;  // never 0 (0: any, to Drop)
  bool disk_full_logged_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<BlockAddr> added_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockAddr> removed_ ABSL_GUARDED_BY(mu_);
  std::map<FileKey, FileState> files_state_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> segment_objects_ ABSL_GUARDED_BY(mu_);  // segment -> live objects
  uint64_t writing_ ABSL_GUARDED_BY(mu_) = 0;  // entries whose bytes are being written
  uint32_t last_active_segment_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> corruptions_ ABSL_GUARDED_BY(mu_);  // the last 20
  // Open read-only fds by (dataset, version, file); cache files are never unlinked, only punched,
  // so an fd stays valid. Capped; holds keep their own reference when an entry is dropped.
  std::map<FileKey, std::shared_ptr<const void>> read_fds_ ABSL_GUARDED_BY(mu_);
  // The same for passthrough backings: readahead on (the kernel reads them directly).
  std::map<FileKey, std::shared_ptr<const void>> backing_fds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::cachefs
