// PeerFetcher: fills a missing block from another node before the origin is touched.
//
// Asks the directory (meta) which live nodes hold the block (Locate; answers cached for a
// couple of seconds, and batched for readahead: LocateAhead), orders the holders by nearness
// (same `switch` label, then same `rack`, then the rest) and by how many fetches this node
// already has in flight to each, and tries them in turn through the BlockTransport. Any error,
// timeout, short read or checksum mismatch moves to the next holder at once, and a peer that
// failed is skipped for a while without waiting for meta to notice it is gone. Bytes are
// accepted only if they match meta's checksum of the block, which a Locate answer brings and the
// ChecksumBook keeps; this keeps only holders.
//
// Thread-safe; one mutex, never held while calling the directory, the book or the transport.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/fetch/block_directory.h"
#include "cachefs/fetch/checksum_book.h"
#include "common/ids.h"
#include "transport/block_transport.h"

namespace ember::metrics {
class Counter;
}

namespace ember::cachefs {

class PeerFetcher {
 public:
  struct Options {
    std::string self_id;
    std::string self_switch;
    std::string self_rack;
    std::chrono::milliseconds locate_ttl{2000};
    std::chrono::milliseconds suspect_for{10'000};
  };
  // The directory, transport and book must outlive this.
  PeerFetcher(BlockDirectory* directory, transport::BlockTransport* transport,
              ChecksumBook* checksums, const Options& options);

  // Fills buf (length bytes: the whole block) from a peer. With `locate` false, only holders
  // already located (within locate_ttl) are tried: no call to meta.
  // Returns: the checksum it matched; NotFound when no live peer holds it, meta's checksum is
  // not known, or no holder gave correct bytes (the caller then reads the origin).
  absl::StatusOr<uint64_t> Fetch(const BlockAddr& addr, uint32_t length, char* buf,
                                 bool locate = true);
  // One block of a FetchMany: `length` bytes (the whole block) into buf.
  struct Want {
    BlockAddr addr;
    uint32_t length = 0;
    char* buf = nullptr;
    absl::StatusOr<uint64_t> result = absl::UnknownError("not fetched");  // out: as Fetch's
  };
  // Fetches many blocks, one pipelined request per holder for all the blocks it is the first
  // choice for; blocks not located lately are located first in one call; a block that fails at
  // its first holder tries the others as Fetch does. Small files: one round trip for dozens.
  void FetchMany(std::span<Want> wants);
  // Asks meta now, in one call, which of `addrs` another live node holds (remembered for the
  // Fetches that follow, with meta's checksums).
  // Returns: per block, whether another node holds it; the directory's error.
  absl::StatusOr<std::vector<bool>> Holders(const std::vector<BlockAddr>& addrs);
  // Locates many blocks in one call (a readahead window) so later Fetches find their holders,
  // and fills of them find meta's checksum, known.
  void LocateAhead(const std::vector<BlockAddr>& addrs);
  // Meta said within the last locate_ttl that no other live node holds any block of this
  // block's dataset version: a fill that may read the origin need not ask (a cold first epoch
  // then costs no Locate per block; a peer that gets blocks meanwhile is seen a moment later).
  bool LikelyUnheld(const BlockAddr& addr);

  uint64_t errors() const { return errors_; }
  uint64_t fetches() const { return fetches_; }

 private:
  using Holder = BlockDirectory::Holder;
  // Other nodes than this one; never empty. Shared by the blocks one answer names the same
  // holders for (a prefetch locates hundreds of thousands of blocks of the same few owners).
  using HolderSet = std::shared_ptr<const std::vector<Holder>>;
  struct Located {
    HolderSet holders;
    std::chrono::steady_clock::time_point at;
  };

  // Asks the directory; remembers holders and unheld versions, and tells the book meta's
  // checksums. Returns: the directory's error.
  absl::Status Locate(const std::vector<BlockAddr>& addrs) ABSL_LOCKS_EXCLUDED(mu_);
  bool UnheldLocked(const BlockAddr& addr, std::chrono::steady_clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static metrics::Counter* ErrorCounter(const char* kind);
  // The holders not suspected, nearest first, then least loaded by this node's fetches.
  std::vector<Holder> Order(const std::vector<Holder>& holders) ABSL_LOCKS_EXCLUDED(mu_);
  // Tries the holders in turn until one gives bytes that match `checksum`.
  // Returns: the checksum; NotFound when none did.
  absl::StatusOr<uint64_t> TryHolders(std::span<const Holder> order, const BlockAddr& addr,
                                      uint32_t length, char* buf, uint64_t checksum)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a holder's failure to give `addr` (s: its error; Ok: bytes that failed the checksum),
  // and suspects it or forgets the stale location.
  void Failed(const Holder& h, const BlockAddr& addr, const absl::Status& s)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool SuspectLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkSuspect(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  BlockDirectory* const directory_;
  transport::BlockTransport* const transport_;
  ChecksumBook* const checksums_;
  const Options options_;
  absl::Mutex mu_;
  absl::flat_hash_map<BlockAddr, Located> located_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::chrono::steady_clock::time_point> suspects_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> inflight_ ABSL_GUARDED_BY(mu_);
  // (dataset, version) -> when meta last said no other node holds any of it.
  std::map<std::pair<uint32_t, uint32_t>, std::chrono::steady_clock::time_point> unheld_
      ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> errors_{0}, fetches_{0};
};

}  // namespace ember::cachefs
