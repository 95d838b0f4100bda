// ChecksumBook: what this node knows of blocks' checksums in meta. It is the one owner of that
// knowledge on the node (the cache index keeps only the checksum of the bytes it stores, as the
// record of what is on disk):
//  - meta's checksum of a block, learned from Locate answers (PeerFetcher) and trusted for `ttl`
//    like the answer it came with: a peer's bytes must match it, and origin bytes that differ
//    from it are refused before anyone gets them (the origin changed in place);
//  - claims: the checksum of a block first read from the origin with none known is recorded in
//    meta (first writer wins), many fills in one call. While meta cannot be reached the claims
//    wait here and the agent retries them (Flush); a later conflict drops the stored block;
//  - conflicts: blocks whose origin bytes differ from meta's checksum. Fills of them fail (EIO)
//    until the dataset is refreshed (a new version has new addresses).
//
// Thread-safe; one mutex, never held while calling the directory.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/fetch/block_directory.h"
#include "common/ids.h"

namespace ember::cachefs {

class ChecksumBook {
 public:
  // `directory` must outlive the book. `ttl`: how long a Locate answer's checksum is used.
  explicit ChecksumBook(BlockDirectory* directory,
                        std::chrono::milliseconds ttl = std::chrono::milliseconds(2000));

  // Meta's checksum of a block, from a Locate answer.
  void Learn(const BlockAddr& addr, uint64_t checksum);
  // Returns: meta's checksum of the block if an answer of the last `ttl` told it.
  std::optional<uint64_t> Known(const BlockAddr& addr);
  // Returns: whether the block's origin bytes were found to differ from meta's checksum.
  bool Conflicting(const BlockAddr& addr);

  // Records the claims in one directory call. Returns: per claim, whether it conflicts (the
  // block is then remembered as conflicting). With meta unreachable (or any error) nothing
  // conflicts and the claims wait for Flush.
  std::vector<bool> Claim(const std::vector<BlockDirectory::Claim>& claims);
  // Retries the claims that waited (the agent calls it after each heartbeat). Claims of a
  // dataset version removed meanwhile are dropped. Returns: the blocks that turned out to
  // conflict (remembered as conflicting; the caller drops them from the cache).
  std::vector<BlockAddr> Flush();

 private:
  struct Learned {
    uint64_t checksum = 0;
    std::chrono::steady_clock::time_point at;
  };

  BlockDirectory* const directory_;
  const std::chrono::milliseconds ttl_;
  std::atomic<bool> meta_down_logged_{false};

  absl::Mutex mu_;
  absl::flat_hash_map<BlockAddr, Learned> known_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockDirectory::Claim> pending_ ABSL_GUARDED_BY(mu_);
  std::set<BlockAddr> conflicts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::cachefs
