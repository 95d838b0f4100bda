// Repairer: refills blocks the cache quarantined (bad bytes on disk, found by a read, a peer
// request or the scrubber), from a peer or the origin, through the read path, so a bad block is
// replaced before anyone asks for it again. A block still held by a passthrough open is
// rewritten in place (BlockCache::Insert), and that open reads good bytes again.
//
// Thread-safe; one thread of its own, one mutex for its queue. Enqueue never blocks on a fill
// (the cache calls it from the thread that found the bad block).
#pragma once

#include <deque>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/fetch/read_path.h"
#include "cachefs/namespace.h"
#include "common/ids.h"

namespace ember::cachefs {

class Repairer {
 public:
  // REQUIRES: ns and read_path outlive Stop().
  Repairer(Namespace* ns, ReadPath* read_path);
  ~Repairer();  // Stop()s

  void Enqueue(const BlockAddr& addr);
  // Ends the thread; later Enqueues do nothing. Idempotent.
  void Stop();

  uint64_t repaired() const { return repaired_; }

 private:
  void Run();
  void Repair(const BlockAddr& addr);

  Namespace* const ns_;
  ReadPath* const read_path_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<BlockAddr> queue_ ABSL_GUARDED_BY(mu_);
  std::set<BlockAddr> queued_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> repaired_{0};
  std::thread thread_;
};

}  // namespace ember::cachefs
