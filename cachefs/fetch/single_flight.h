// SingleFlight: at most one fill per block in flight; every other reader of the block joins it
// and waits for its result instead of fetching the block again.
//
// A fill has two ends. It is done when its bytes (or its error) are handed to the readers
// waiting on it; it is settled when the cache write that follows ended (stored, not admitted, or
// refused for a conflicting checksum). It stays in the table until settled, so readers arriving
// between the two join the done fill and get its bytes from memory instead of starting another.
// The leader (the caller that started the fill) finishes it; whoever settles it ends it here.
//
// Thread-safe. The table's mutex and a fill's mutex are never held together.
#pragma once

#include <map>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_buffer.h"
#include "common/ids.h"

namespace ember::cachefs {

class Fill {
 public:
  struct Result {
    absl::Status status;
    std::shared_ptr<const BlockBuffer> data;  // the bytes, when status is ok (and not already)
    bool from_peer = false;
    bool peer_only = false;  // a prefetch's try that might not read the origin
    bool already = false;    // nothing fetched: another fill stored the block just before
  };

  // Hands the result to the readers waiting on the fill (it is done).
  void Finish(Result result) ABSL_LOCKS_EXCLUDED(mu_);
  // The cache write after Finish ended; `conflict`: meta holds another checksum for the block,
  // so it was not stored.
  void Settle(bool conflict) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns: the result, once the fill is done (waits until then).
  Result WaitDone() ABSL_LOCKS_EXCLUDED(mu_);
  // Returns: whether the block conflicted, once the fill is settled (waits until then).
  bool WaitSettled() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool settled_ ABSL_GUARDED_BY(mu_) = false;
  bool conflict_ ABSL_GUARDED_BY(mu_) = false;
  Result result_ ABSL_GUARDED_BY(mu_);
};

class SingleFlight {
 public:
  // Joins the fill in flight for `addr`, or starts one. Returns: the fill, and true if the
  // caller leads it (it must then Finish it, and it or a writer must Settle and End it).
  std::pair<std::shared_ptr<Fill>, bool> Join(const BlockAddr& addr) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes `fill` from the table, if it is still the one in flight for `addr`.
  void End(const BlockAddr& addr, const std::shared_ptr<Fill>& fill) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns: whether a fill of `addr` is in flight.
  bool InFlight(const BlockAddr& addr) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<BlockAddr, std::shared_ptr<Fill>> inflight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::cachefs
