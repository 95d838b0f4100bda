// RecentBlocks: the last blocks filled, kept in memory (the readahead window plus some). The
// kernel's many small reads of a block just filled are served from here rather than re-read from
// the cache file, and a block the cache did not admit (policy, full disk) is fetched once. Peers
// are sent a block from here while it is (a block just filled is what the other nodes of a
// prefetch want next, and its cache file was written around the page cache). Blocks this node
// fetched from the origin outlive those it got from peers: in a prefetch they are what the other
// nodes still want, and this node may be their only holder (a peer's block has another copy).
// The bound is in memory, not blocks: `keep` blocks of 4 MiB, so a dataset of small files keeps
// as many of its small blocks as fit (each counted as at least 8 KiB: its 4 KiB-aligned buffer
// and bookkeeping), found through an index. In a tiny-file prefetch that is ~28,000 blocks, the
// last several seconds of an owner's origin reads: most of what peers ask it for.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_buffer.h"
#include "common/ids.h"

namespace ember::cachefs {

class RecentBlocks {
 public:
  static constexpr size_t kUnitBytes = 4u << 20;  // `keep` counts blocks of this size
  static constexpr size_t kMinCost = 8u << 10;    // what the smallest block counts as
  // Keeps the last blocks put, `keep` x 4 MiB of them (0: none), of which at most
  // `keep_unstored` that the cache did not store: those are filled again once they leave, and
  // then offered to the cache again (a disk that was full may have room).
  explicit RecentBlocks(size_t keep, size_t keep_unstored = 6)
      : budget_(keep * kUnitBytes), keep_unstored_(keep_unstored) {}

  // Returns: the block's bytes (and makes it the newest), or nullptr.
  std::shared_ptr<const BlockBuffer> Get(const BlockAddr& addr) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns: the block's bytes and checksum without making it the newest; nullptr if absent.
  std::shared_ptr<const BlockBuffer> Peek(const BlockAddr& addr, uint64_t* checksum)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `checksum`: of the whole block, checked or computed by its fill. `from_origin`: the fill read
  // it from the origin (kept in preference to blocks from peers when one must leave).
  void Put(const BlockAddr& addr, std::shared_ptr<const BlockBuffer> data, uint64_t checksum,
           bool from_origin = false) ABSL_LOCKS_EXCLUDED(mu_);
  void Erase(const BlockAddr& addr) ABSL_LOCKS_EXCLUDED(mu_);
  // The cache did not store the block (policy, full disk).
  void Unstored(const BlockAddr& addr) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the blocks last put or read (Get) before `cutoff`: once a prefetch is over, its blocks
  // need not hold memory until other fills push them out. Returns: the bytes dropped.
  size_t DropUnusedSince(std::chrono::steady_clock::time_point cutoff) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Recent;
  using List = std::list<Recent>;
  struct Recent {
    BlockAddr addr;
    std::shared_ptr<const BlockBuffer> data;
    uint64_t checksum = 0;
    bool unstored = false;
    bool from_origin = false;
    bool newest = false;  // in the newest quarter of the budget
    size_t cost = 0;
    std::chrono::steady_clock::time_point used;    // last Put or Get
    std::list<List::iterator>::iterator in_peers;  // when !from_origin
  };
  void EraseAt(List::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `it` (already in the list) the newest, keeping the newest quarter's bookkeeping.
  void MoveToFront(List::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the boundary of the newest quarter after its cost changed.
  void Rebalance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The block to drop when over budget: the oldest from a peer outside the newest quarter of the
  // budget (what readers are reading now), else the oldest. O(1): the peers' blocks have their
  // own list, in the same order.
  List::iterator Victim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t budget_;  // bytes
  const size_t keep_unstored_;
  absl::Mutex mu_;
  List recent_ ABSL_GUARDED_BY(mu_);  // front = newest
  // The first block not in the newest quarter (end() when all are), and the quarter's cost.
  List::iterator boundary_ ABSL_GUARDED_BY(mu_) = recent_.end();
  size_t newest_cost_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<List::iterator> peers_ ABSL_GUARDED_BY(mu_);  // blocks from peers, newest first
  absl::flat_hash_map<BlockAddr, List::iterator> index_ ABSL_GUARDED_BY(mu_);
  size_t cost_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ember::cachefs
