// PeerFetcher: fills a missing block from another node before the origin is touched.
//
// Asks meta which live nodes hold the block (Locate, answers cached for a couple of seconds and
// batched for readahead), orders the holders by nearness (same `switch` label, then same `rack`,
// then the rest) and by how many fetches this node already has in flight to each, and tries them
// in turn through the BlockTransport. Any error, timeout, short read or checksum mismatch moves
// to the next holder at once, and a peer that failed is skipped for a while without waiting for
// meta to notice it is gone. Bytes are accepted only if they match meta's checksum of the block.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ids.h"
#include "meta/meta_client.h"
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
  PeerFetcher(meta::MetaClient* meta, transport::BlockTransport* transport, const Options& options);

  // Fills buf (length bytes: the whole block) from a peer. Returns the checksum it matched.
  // Returns: NotFound when no live peer holds it (or none could give correct bytes); the caller
  // then reads the origin.
  absl::StatusOr<uint64_t> Fetch(const BlockAddr& addr, uint32_t length, char* buf);
  // Looks up many blocks in one call so later Fetches find their holders cached.
  void Prefetch(const std::vector<BlockAddr>& addrs);
  // Meta said within the last locate_ttl that no other live node holds any block of this
  // block's dataset version: a fill that may read the origin need not ask (a cold first epoch
  // then costs no Locate per block; a peer that gets blocks meanwhile is seen a moment later).
  bool LikelyUnheld(const BlockAddr& addr);
  // Meta's checksum of the block from a Locate answer of the last locate_ttl, if it had one.
  std::optional<uint64_t> KnownChecksum(const BlockAddr& addr);

  uint64_t errors() const { return errors_; }
  uint64_t fetches() const { return fetches_; }

 private:
  struct Holder {
    std::string id, address, sw, rack;
  };
  struct Located {
    std::vector<Holder> holders;
    bool has_checksum = false;
    uint64_t checksum = 0;
    std::chrono::steady_clock::time_point at;
  };

  absl::Status Locate(const std::vector<BlockAddr>& addrs);
  bool UnheldLocked(const BlockAddr& addr, std::chrono::steady_clock::time_point now);
  static metrics::Counter* ErrorCounter(const char* kind);
  bool Suspect(const std::string& id);
  void MarkSuspect(const std::string& id);

  meta::MetaClient* meta_;
  transport::BlockTransport* transport_;
  Options options_;
  std::mutex mu_;
  std::map<BlockAddr, Located> located_;                                   // GUARDED_BY(mu_)
  std::map<std::string, std::chrono::steady_clock::time_point> suspects_;  // GUARDED_BY(mu_)
  std::map<std::string, int> inflight_;                                    // GUARDED_BY(mu_)
  // (dataset, version) -> when meta last said no other node holds any of it.
  std::map<std::pair<uint32_t, uint32_t>, std::chrono::steady_clock::time_point>
      unheld_;  // GUARDED_BY(mu_)
  std::atomic<uint64_t> errors_{0}, fetches_{0};
};

}  // namespace ember::cachefs
