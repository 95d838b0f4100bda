// ReadPath: the hot path. Turns a byte range of a dataset file into cached block pins (served
// by fd, zero-copy) or freshly filled bytes, filling misses exactly once however many readers
// wait (single-flight), verifying every block, and reading ahead for sequential readers.
//
// For each block of a read:
//   1. resident -> pin it; the first time this agent serves it, re-read and check its XXH3
//      against the index (a mismatch drops the block and refills it; wrong bytes never go out);
//   2. miss -> join the fill in flight for that block, or start one: from a peer that holds it
//      (PeerFetcher; bytes must match meta's checksum), else read from the origin (which
//      refuses a file whose size, mtime or ETag changed); if a Locate told meta's checksum of
//      the block, bytes that differ are refused (the origin changed in place -> EIO); the
//      readers get the bytes; then a writer thread claims the checksum in meta for blocks
//      whose checksum was not known, many fills in one call (first writer wins), and stores
//      the block in the cache (if the policy admits it; reported to meta through the cache's
//      change log). A block whose claim conflicts is not stored, and later reads of it fail.
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "cachefs/block_cache.h"
#include "cachefs/filesystem.h"
#include "cachefs/peer_fetcher.h"
#include "meta/meta_client.h"
#include "origin/origin.h"

namespace ember::cachefs {

// A dataset file as the read path needs it.
struct FileRef {
  uint32_t dataset_id = 0;
  uint32_t version = 0;
  uint64_t file_id = 0;
  uint64_t block_size = 0;
  origin::OriginFile origin;  // root, path, size, mtime
  std::string dataset_name;
};

struct ReadStats {
  uint64_t hits = 0;  // blocks
  uint64_t misses = 0;
  uint64_t bytes_from_cache = 0;
  uint64_t bytes_from_peers = 0;
  uint64_t bytes_from_origin = 0;
  uint64_t origin_block_reads = 0;
  uint64_t checksum_failures = 0;
  uint64_t peer_fetches = 0;
  uint64_t peer_errors = 0;
};

class ReadPath {
 public:
  struct Options {
    int readahead_blocks = 4;  // blocks filled ahead of a sequential reader
    int fill_threads = 2;      // background fills (readahead)
    // The last blocks filled stay in memory (this many besides the readahead window): the
    // kernel's many small reads of a block just filled are served from there, not re-read from
    // the cache file, and a block not admitted to the cache (policy, full disk) is fetched once.
    size_t recent_blocks = 2;
  };
  // meta may be null (unit tests): checksums are then only kept locally. peers may be null: misses
  // then go straight to the origin.
  ReadPath(BlockCache* cache, origin::Origin* origin, meta::MetaClient* meta,
           const Options& options, PeerFetcher* peers = nullptr);
  ~ReadPath();

  // Returns: the segments covering [offset, offset+size) clipped to the file size; NotFound /
  // FailedPrecondition / Unavailable from the origin when a block cannot be had (as EIO).
  // `last_block` (optional, per open file): the cache policy counts a block once per visit of a
  // reader, not once per kernel request (one read of a block is 4-32 requests, which saturated
  // every block's frequency at once, so no block ever looked hotter than another).
  absl::StatusOr<ReadResult> Read(const FileRef& file, uint64_t offset, size_t size,
                                  std::atomic<uint64_t>* last_block = nullptr);
  // Queues background fills of blocks [first, first+count) that are not resident.
  void Readahead(const FileRef& file, uint64_t first, int count);

  // Where a prefetched block came from.
  enum class Source { kResident, kPeer, kOrigin };
  // Makes one block resident (prefetch). With allow_origin false only peers are asked, and
  // NotFound means no peer has it yet. `before_origin` runs before an origin read (rate limit).
  // Returns the source, or the fill's error.
  absl::StatusOr<Source> Prefetch(const FileRef& file, uint64_t index, bool allow_origin,
                                  const std::function<void(uint64_t bytes)>& before_origin);

  // Pins every block of a file that is wholly resident, verifying blocks not yet checked since
  // the agent started, for passthrough reads of its cache file. Returns the file's cache fd
  // (valid while the hold lives) and the hold; NotFound if a block is missing or was bad.
  absl::StatusOr<FileSystem::Backing> PinFile(const FileRef& file);

  ReadStats GetStats() const;
  // Checksums recorded locally while meta was unreachable; retried by the agent.
  void FlushPendingChecksums();

 private:
  struct Fill {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::Status status;
    bool cached = false;
    bool from_peer = false;
    bool peer_only = false;                   // a prefetch that may not read the origin
    std::shared_ptr<const BlockBuffer> data;  // the bytes, for readers waiting on the fill
    bool settled = false;   // the cache write after `done` finished (stored or not)
    bool conflict = false;  // meta holds another checksum for the block: not stored
    bool already = false;   // nothing to fetch: another fill stored it after the caller looked
  };
  struct BlockBytes {
    BlockCache::PinPtr pin;                   // resident, or
    std::shared_ptr<const BlockBuffer> data;  // served through
    bool filled = false;                      // this read waited for a fill
  };

  // `count`: tell the cache policy of this access (not for readahead, nor again for the block
  // a reader is already in).
  absl::StatusOr<BlockBytes> GetBlock(const FileRef& file, uint64_t index, bool count = true);
  // Single-flight: joins the fill in flight for the block, or runs one. Returns it finished.
  std::shared_ptr<Fill> FillOnce(const FileRef& file, uint64_t index, bool allow_origin,
                                 const std::function<void(uint64_t)>* before_origin);
  // Checks a pinned block's bytes once per agent lifetime. Returns false if they are wrong.
  bool VerifyPinned(const BlockCache::Pin& pin);
  // Fetches and checks the block, hands the bytes to the fill's waiters, then stores it: on a
  // writer thread when the queue has room, else here. Returns true when the fill succeeded (the
  // store then settles it and ends it in inflight_), false when it failed (the caller ends it).
  bool FillBlock(const FileRef& file, uint64_t index, const std::shared_ptr<Fill>& fill,
                 bool allow_origin = true,
                 const std::function<void(uint64_t)>* before_origin = nullptr);
  // Stores a filled block, settles its fill and removes it from inflight_.
  struct Write {
    BlockAddr addr;
    uint64_t file_size = 0;
    uint64_t offset = 0;
    std::shared_ptr<const BlockBuffer> data;
    uint64_t checksum = 0;
    std::shared_ptr<Fill> fill;
    bool claim = false;  // read from the origin with no checksum known: record it in meta first
    std::string where;   // "DATASET block N of PATH", for the log
  };
  // Claims the checksums of the writes that need it in one meta call, then stores each write
  // (or, on a conflict, remembers the block as conflicting and stores nothing).
  void StoreAll(std::vector<Write>& ws);
  void Writer();
  // Per write: whether meta holds a different checksum. Meta unreachable: none, and the
  // checksums wait in pending_checksums_ (a later conflict drops the stored block).
  std::vector<bool> ClaimChecksums(const std::vector<Write>& ws);
  bool Conflicting(const BlockAddr& addr);
  void RecentErase(const BlockAddr& addr);
  void Worker();

  BlockCache* cache_;
  origin::Origin* origin_;
  meta::MetaClient* meta_;
  Options options_;
  PeerFetcher* peers_;

  std::mutex inflight_mu_;
  std::map<BlockAddr, std::shared_ptr<Fill>> inflight_;  // GUARDED_BY(inflight_mu_)

  // A block filled lately, kept in memory (options_.recent_blocks).
  struct Recent {
    BlockAddr addr;
    std::shared_ptr<const BlockBuffer> data;
  };
  std::optional<Recent> RecentGet(const BlockAddr& addr);
  void RecentPut(Recent r);

  std::mutex recent_mu_;
  std::list<Recent> recent_;  // front = newest

  std::mutex pending_mu_;
  std::vector<std::pair<BlockAddr, uint64_t>> pending_checksums_;
  // Blocks whose origin bytes differed from meta's checksum: fills of them fail (EIO) until the
  // dataset is refreshed (a new version has new addresses).
  std::set<BlockAddr> conflicts_;  // GUARDED_BY(pending_mu_)
  std::atomic<bool> meta_down_logged_{false};

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::pair<FileRef, uint64_t>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;

  // Cache writes handed off by fills, so the reader that led a fill is answered before the write
  // (bounded: a full queue makes the fill write itself, which slows fills to the disk's pace).
  std::mutex write_mu_;
  std::condition_variable write_cv_;
  std::deque<Write> writes_;
  uint64_t queued_write_bytes_ = 0;
  bool writers_stopping_ = false;
  std::vector<std::thread> writers_;

  std::atomic<uint64_t> hits_{0}, misses_{0}, bytes_cache_{0}, bytes_origin_{0}, bytes_peers_{0},
      origin_reads_{0}, checksum_failures_{0};
};

}  // namespace ember::cachefs
