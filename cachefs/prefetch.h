// PrefetchRunner: this node's share of cluster prefetches (`ember prefetch`).
//
// Meta hands every node the prefetch jobs it takes part in with each heartbeat; every node
// computes the same block list from the job and the (immutable) manifest, and takes its part:
//   full:   every chosen node gets every block;
//   stripe: block g goes to nodes g % n, g+1 % n, ... (replicas of them).
// Block g's origin read belongs to node g % n alone; the others get it from a peer that holds it
// (peer-only fills, retried until it appears), so the cluster reads each block from the origin
// once. Should the owner never deliver (it died), a waiting node reads the origin itself after a
// grace period, so the prefetch still finishes. The cluster's --origin-rate is split evenly over
// the nodes. Blocks are pinned (BlockCache::SetPin) until the job's pin expires or is released.
// Blocks are made resident through ReadPath::MakeResident: this node's own blocks that no peer
// holds straight from the origin, others' blocks once meta says a peer holds them (located in
// batches, not per block). Jobs arrive with the heartbeat answers and, at once, through a long
// poll of meta (WatchPrefetches) on a thread of this runner. Thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_cache.h"
#include "cachefs/fetch/read_path.h"
#include "cachefs/namespace.h"
#include "meta/meta_client.h"

namespace ember::cachefs {

// A token bucket over bytes per second (0 = unlimited).
class RateLimiter {
 public:
  explicit RateLimiter(uint64_t bytes_per_second) : rate_(bytes_per_second) {}
  // Blocks until `bytes` may go.
  void Acquire(uint64_t bytes);

 private:
  const uint64_t rate_;
  absl::Mutex mu_;
  double available_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point last_ ABSL_GUARDED_BY(mu_) =
      std::chrono::steady_clock::now();
};

class PrefetchRunner {
 public:
  // Starts the watch of meta's jobs. `owner_grace`: how long a node waits for the owner of a
  // block to deliver anything (it is alive while blocks keep coming) before reading the origin
  // itself.
  PrefetchRunner(const std::string& node_id, Namespace* ns, ReadPath* read_path, BlockCache* cache,
                 meta::MetaClient* meta, std::chrono::milliseconds owner_grace = kDefaultOwnerGrace,
                 std::function<void()> report_locations = {});
  // Ends the watch (cancelling meta's watches: the client must not watch for others) and the
  // jobs.
  ~PrefetchRunner();

  // The jobs meta listed for this node: starts new ones, stops cancelled ones, releases pins.
  void Update(const std::vector<rpc::PrefetchJob>& jobs) ABSL_LOCKS_EXCLUDED(mu_);

  static constexpr std::chrono::milliseconds kDefaultOwnerGrace{15000};

 private:
  struct Running {
    rpc::PrefetchJob job;
    std::atomic<bool> cancel{false};
    std::atomic<bool> finished{false};
    std::thread thread;
    std::atomic<int64_t> pinned_until{0};  // what this node applied
  };
  struct Block {
    uint64_t file_id = 0;
    uint64_t index = 0;
    uint64_t ordinal = 0;
    uint32_t file = 0;  // the file's place in the plan's list of files
  };

  void Run(Running* r);
  // Long-polls meta for job changes and applies them (Update), until stopping_.
  void Watch() ABSL_LOCKS_EXCLUDED(mu_);
  // The job's selected files and this node's blocks of them.
  absl::StatusOr<std::shared_ptr<const DatasetView>> Plan(const rpc::PrefetchJob& job,
                                                          std::vector<Block>* mine,
                                                          std::vector<uint64_t>* files);
  void ApplyPin(const rpc::PrefetchJob& job, int64_t until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string node_id_;
  const std::chrono::milliseconds owner_grace_;
  const std::function<void()> report_locations_;  // may be empty
  Namespace* ns_;
  ReadPath* read_path_;
  BlockCache* cache_;
  meta::MetaClient* meta_;
  // Lock order: mu_ -> the namespace's and the cache's (Update applies changed pins under it).
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Running>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::Mutex stop_mu_;
  absl::CondVar stop_cv_;
  bool stopping_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread watcher_;  // last: started when everything above is ready
};

}  // namespace ember::cachefs
