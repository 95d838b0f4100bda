// cachefs/fetch/: the fill pipeline. ReadPath (this header) is the folder's front door and the
// front door of the read path: the FUSE side (DatasetFs) and prefetch call only it.
//
// Owns: turning a byte range of a dataset file into held cache blocks or freshly filled bytes;
// single-flight of fills (single_flight.h); where bytes come from and the checks they pass
// (fill_sources.h: peers via peer_fetcher.h, then the origin); meta's checksums, claims and
// conflicts (checksum_book.h); storing filled blocks after the reply (write_behind.h); the last
// blocks filled (recent_blocks.h); reading ahead of sequential readers (readahead.h). Talks to
// meta only through BlockDirectory (block_directory.h). Must not touch: FUSE, inodes or the
// namespace (it sees FileRefs), the cache's files or index (only BlockCache's API), meta's
// client directly.
//
// For each block of a read:
//   1. one of the last blocks filled, still in memory -> its bytes;
//   2. resident -> a hold on it, and its bytes copied into the reply buffer checked
//      (BlockCache::ReadVerified: from the page cache when its copy there is verified and
//      whole, else after the whole block is read and checked; a bad block is quarantined and
//      filled again, as a miss: wrong bytes never go out);
//   3. miss -> join the fill in flight for that block, or lead one: FillSources fetches and
//      checks the bytes, the readers waiting get them from memory, then WriteBehind claims the
//      checksum (if meta did not know it) and stores the block. A block whose claim conflicts is
//      not stored, and later reads of it fail.
// The reply's bytes are in memory: cached bytes copied into the caller's reply buffer (the
// kernel binding's buffer or io_uring payload), filled bytes in their fill's buffer.
//
// Thread-safe. No two of the parts' locks are held together: each part locks only its own
// state and calls the next one with its lock released.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "cachefs/cache/block_cache.h"
#include "cachefs/cache/scrubber.h"
#include "cachefs/fetch/checksum_book.h"
#include "cachefs/fetch/file_ref.h"
#include "cachefs/fetch/fill_sources.h"
#include "cachefs/fetch/peer_fetcher.h"
#include "cachefs/fetch/readahead.h"
#include "cachefs/fetch/recent_blocks.h"
#include "cachefs/fetch/single_flight.h"
#include "cachefs/fetch/write_behind.h"
#include "cachefs/filesystem.h"
#include "origin/origin.h"

namespace ember::cachefs {

struct ReadStats {
  uint64_t hits = 0;  // blocks
  uint64_t misses = 0;
  uint64_t bytes_from_cache = 0;
  uint64_t bytes_from_peers = 0;
  uint64_t bytes_from_origin = 0;
  uint64_t origin_block_reads = 0;
  uint64_t peer_fetches = 0;
  uint64_t peer_errors = 0;
};

class ReadPath {
 public:
  struct Options {
    // Blocks filled ahead of a sequential reader: a window that starts at readahead_min_blocks
    // and doubles as the reader keeps entering blocks read ahead, up to readahead_blocks.
    int readahead_blocks = 8;
    int readahead_min_blocks = 2;
    int fill_threads = 8;  // background fills (readahead)
    // The last blocks filled stay in memory (this many besides the readahead window): the
    // kernel's many small reads of a block just filled are served from there, not re-read from
    // the cache file, a block not admitted to the cache (policy, full disk) is fetched once, and
    // peers that want a block just filled (a prefetch) get it from memory.
    size_t recent_blocks = 48;
  };
  // `peers` may be null: misses then go straight to the origin; `scrubber` may be null. Everything
  // passed must outlive this.
  ReadPath(BlockCache* cache, origin::Origin* origin, ChecksumBook* checksums,
           const Options& options, PeerFetcher* peers = nullptr, Scrubber* scrubber = nullptr);
  // Ends readahead, then stores what write-behind has queued.
  ~ReadPath();

  // One open file's reading state (readahead window, block visits): see readahead.h.
  std::unique_ptr<ReadStream> OpenStream(const FileRef& file) const;
  // The small files a reader of a small file likely reads next (the files after it in its
  // folder, one block each), at most `max` of them: computed only on a miss.
  using NextSmallFiles = std::function<std::vector<FileRef>(size_t max)>;
  // Small files (at most kSmallBatchFileMax bytes) filled from the origin in one batch with a
  // missing one: up to kSmallBatch - 1 of the next ones in its folder, those neither cached nor
  // in flight, and at most kSmallBatchBytes in all.
  static constexpr size_t kSmallBatch = 32;
  static constexpr uint64_t kSmallBatchFileMax = 256 << 10;
  static constexpr uint64_t kSmallBatchBytes = 8 << 20;
  // Whether a file of `size` bytes in blocks of `block_size` goes into such batches.
  static bool Batchable(uint64_t size, uint64_t block_size) {
    return size > 0 && size <= block_size && size <= kSmallBatchFileMax;
  }
  static bool Batchable(const FileRef& f) { return Batchable(f.origin.size, f.block_size); }

  // Reads [offset, offset+size) for an open file, reading ahead of a sequential reader. `buf`:
  // room for `size` bytes, where cached bytes go (null: the result owns a buffer). `next`
  // (may be null): for a small file that no peer holds, in an origin that reads many files at
  // once (POSIX), the small files read from the origin together with it on a miss (an
  // epoch over folders of small files: one batch of origin reads, one disk notify and one wait per
  // kSmallBatch files instead of per file). Returns: the segments covering the range clipped to the
  // file size (holding what keeps them valid); the fill's error when a block cannot be had:
  // NotFound / FailedPrecondition / Unavailable from the origin, FailedPrecondition when the origin
  // changed in place.
  absl::StatusOr<ReadResult> Read(ReadStream& stream, uint64_t offset, size_t size,
                                  char* buf = nullptr, const NextSmallFiles* next = nullptr);
  // The same for a one-off read, without readahead; every block read counts as an access.
  absl::StatusOr<ReadResult> Read(const FileRef& file, uint64_t offset, size_t size,
                                  char* buf = nullptr);

  // Where a block made resident came from.
  enum class Source { kResident, kPeer, kOrigin };
  // Makes one block resident and waits until it is stored (prefetch), from where `route` says.
  // `before_origin` runs before an origin read (a rate limit). Returns: the source; NotFound when
  // peer-only and no peer has it yet; FailedPrecondition when the origin changed; the fill's error.
  absl::StatusOr<Source> MakeResident(const FileRef& file, uint64_t index, FillRoute route,
                                      const std::function<void(uint64_t bytes)>& before_origin);
  // The same without waiting for the cache write: a fetched block's fill is returned in
  // `*unsettled` (else null), and the block counts as resident once `Settled` says so. A prefetch
  // keeps many blocks' writes in flight this way instead of one per worker.
  absl::StatusOr<Source> StartResident(const FileRef& file, uint64_t index, FillRoute route,
                                       const std::function<void(uint64_t bytes)>& before_origin,
                                       std::shared_ptr<Fill>* unsettled);
  // StartResident of many blocks by FillRoute::kPeersOnly, fetched with one request per holder
  // (small files). Not kept among the recent blocks: a prefetch's others' blocks are read by no
  // one here, and their holders serve the other nodes. Returns: per block of `blocks` ((file,
  // index)), the source and the fill to settle, as StartResident's.
  struct Started {
    absl::StatusOr<Source> src;
    std::shared_ptr<Fill> fill;  // null unless fetched now
  };
  std::vector<Started> StartFromPeers(
      const std::vector<std::pair<const FileRef*, uint64_t>>& blocks);
  // The same for blocks no peer holds (a prefetch's own blocks that meta located nowhere), read
  // from the origin in one batch (Origin::ReadMany: one submission for the batch's reads, one
  // hand-off per fill) when the origin reads many at once, else one by one as StartResident by
  // FillRoute::kKnownPeersThenOrigin. `before_origin` runs once with the bytes of the blocks
  // read. Returns: per block, as StartResident's.
  std::vector<Started> StartFromOrigin(
      const std::vector<std::pair<const FileRef*, uint64_t>>& blocks,
      const std::function<void(uint64_t bytes)>& before_origin);
  // Waits for a fill StartResident returned to be stored (write-behind stops waiting for a
  // larger batch). Returns: Ok; FailedPrecondition when the origin changed.
  absl::Status Settled(const std::shared_ptr<Fill>& fill);

  // A block filled moments ago and still in memory, with its checksum (for peers).
  // Returns: its bytes, or nullptr.
  std::shared_ptr<const BlockBuffer> RecentBlock(const BlockAddr& addr, uint64_t* checksum);

  // Asks meta in one call which of `addrs` another live node holds (a prefetch plans with it).
  // Returns: per block, whether a peer holds it (all false without peers); meta's error.
  absl::StatusOr<std::vector<bool>> HeldByPeers(const std::vector<BlockAddr>& addrs);
  // Meta said moments ago that no other live node holds any block of this block's dataset
  // version (PeerFetcher::LikelyUnheld): asking about more of its blocks now is pointless.
  bool LikelyUnheldByPeers(const BlockAddr& addr);

  // Holds every block of a file that is wholly resident and checked since the agent started,
  // for passthrough reads of its cache file (a fd of its own, with readahead). Blocks not yet
  // checked are handed to the scrubber, so a later open can have passthrough. When the hold
  // ends, the page-cache copies of the file are no longer trusted (the kernel read them). With
  // verified_only false the blocks are held whether checked or not (the kernel reads the file
  // already: a takeover). Returns: the fd (valid while the hold lives) and the hold; NotFound
  // if a block is missing or not checked.
  absl::StatusOr<FileSystem::Backing> HoldFile(const FileRef& file, bool verified_only = true);

  ReadStats GetStats() const;
  // Lets go of the recent blocks nobody put or read for 30 s (a prefetch's, once it is over),
  // and gives their memory back to the system. The agent calls it with each heartbeat.
  void DropIdleRecent();
  // Retries the checksum claims that waited while meta was unreachable (the agent calls it);
  // blocks that turn out to conflict are dropped from the cache.
  void FlushPendingChecksums();

 private:
  struct BlockBytes {
    BlockHoldPtr hold;                        // resident, or
    std::shared_ptr<const BlockBuffer> data;  // served from memory
    bool filled = false;                      // this read waited for a fill
  };

  absl::StatusOr<ReadResult> ReadBlocks(const FileRef& file, uint64_t offset, size_t size,
                                        ReadStream* stream, char* buf,
                                        const NextSmallFiles* next = nullptr);
  // `count`: tell the cache policy of this access (not for readahead, nor again for the block
  // a reader is already in). `next`: as Read's.
  absl::StatusOr<BlockBytes> GetBlock(const FileRef& file, uint64_t index, bool count = true,
                                      const NextSmallFiles* next = nullptr);
  // FillOnce of a small file's only block, leading the fills of the next small files too and
  // reading all from the origin in one batch. Peers first as FillOnce when one may hold it.
  std::shared_ptr<Fill> FillSmallFiles(const FileRef& file, const NextSmallFiles& next);
  // As the leader of `fill`, just joined: when the block is resident or in memory already (a
  // fill ended since the caller looked), finishes, settles and ends it. Returns: whether it did.
  bool EndIfThere(const BlockAddr& addr, const std::shared_ptr<Fill>& fill);
  // Many blocks' fills at once (StartFromPeers, StartFromOrigin): resident ones are answered in
  // `out`; the others' fills are joined, and those this call leads are listed to be fetched.
  struct Joined {
    std::vector<std::shared_ptr<Fill>> fills;  // per block; null when resident
    std::vector<std::pair<const FileRef*, uint64_t>> lead;
    std::vector<size_t> lead_at;  // each led fill's block in `fills`
  };
  Joined JoinMany(const std::vector<std::pair<const FileRef*, uint64_t>>& blocks,
                  std::vector<Started>* out);
  // Waits for `fills` and answers each in `out` as StartResident does; a joined try (peer-only)
  // that failed goes to `after_failed_try` when set, else is answered with its error.
  void WaitMany(std::vector<std::shared_ptr<Fill>>& fills, std::vector<Started>* out,
                const std::function<void(size_t)>& after_failed_try);
  // Single-flight: joins the fill in flight for the block, or leads one. Returns: the fill,
  // done (its bytes or error handed out; maybe not yet settled).
  std::shared_ptr<Fill> FillOnce(const FileRef& file, uint64_t index, FillRoute route,
                                 const std::function<void(uint64_t)>* before_origin);
  // As the leader of `fill`: fetches the block, hands the bytes to the fill's waiters, then
  // submits the cache write. Returns: true when the fill succeeded (write-behind then settles
  // and ends it), false when it failed (settled; the caller ends it).
  bool FillBlock(const FileRef& file, uint64_t index, const std::shared_ptr<Fill>& fill,
                 FillRoute route, const std::function<void(uint64_t)>* before_origin);
  // FillBlock's second half, for bytes fetched: hands them to the fill's waiters, keeps them
  // in memory and submits the cache write. Returns as FillBlock.
  bool Deliver(const FileRef& file, uint64_t index, const std::shared_ptr<Fill>& fill,
               FillRoute route, FillSources::Fetched f);

  BlockCache* const cache_;
  ChecksumBook* const checksums_;
  PeerFetcher* const peers_;
  Scrubber* const scrubber_;
  const Options options_;
  FillSources sources_;
  SingleFlight inflight_;
  RecentBlocks recent_;
  // Destroyed first (declared last): readahead workers fill through everything above, and
  // write-behind stores into the cache.
  std::unique_ptr<WriteBehind> write_behind_;
  std::unique_ptr<Readahead> readahead_;

  std::atomic<uint64_t> hits_{0}, misses_{0}, bytes_cache_{0};
};

}  // namespace ember::cachefs
