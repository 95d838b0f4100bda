// RecentBlocks: the last blocks filled, kept in memory (the readahead window plus some). The
// kernel's many small reads of a block just filled are served from here rather than re-read from
// the cache file, and a block the cache did not admit (policy, full disk) is fetched once. Peers
// are sent a block from here while it is (a block just filled is what the other nodes of a
// prefetch want next, and its cache file was written around the page cache). Blocks this node
// fetched from the origin outlive those it got from peers: in a prefetch they are what the other
// nodes still want, and this node may be their only holder (a peer's block has another copy).
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_buffer.h"
#include "common/ids.h"

namespace ember::cachefs {

class RecentBlocks {
 public:
  // Keeps the last `keep` blocks put (0: none), of which at most `keep_unstored` that the cache
  // did not store: those are filled again once they leave, and then offered to the cache again
  // (a disk that was full may have room).
  explicit RecentBlocks(size_t keep, size_t keep_unstored = 6)
      : keep_(keep), keep_unstored_(keep_unstored) {}

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

 private:
  struct Recent {
    BlockAddr addr;
    std::shared_ptr<const BlockBuffer> data;
    uint64_t checksum = 0;
    bool unstored = false;
    bool from_origin = false;
  };
  const size_t keep_;
  const size_t keep_unstored_;
  absl::Mutex mu_;
  std::list<Recent> recent_ ABSL_GUARDED_BY(mu_);  // front = newest
};

}  // namespace ember::cachefs
