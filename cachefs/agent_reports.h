// MetaReporter: the node agent's reports to meta, on one background thread.
//
// Registers the node (id, address, labels, GPUs, capacity) with a full block report, then every
// `report_interval` sends the blocks stored and lost since (through the BlockDirectory; every
// `busy_report_interval` while blocks are arriving, so peers and prefetches see them soon), and a
// heartbeat with the node's figures at the interval meta asked for. After each heartbeat meta
// answered, `on_heartbeat` runs: the agent retries the checksum claims that waited
// (ReadPath::FlushPendingChecksums) and hands the prefetch jobs to PrefetchRunner. Meta may come
// and go: the agent keeps serving, this logs once, and registers again (with a full report)
// when meta is back.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_cache.h"
#include "cachefs/fetch/block_directory.h"
#include "meta/meta_client.h"

namespace ember::cachefs {

class MetaReporter {
 public:
  struct Options {
    rpc::Node node;  // id, address, labels, GPUs, capacity
    std::chrono::milliseconds report_interval{200};
    std::chrono::milliseconds busy_report_interval{20};  // after a report that carried changes
  };
  using StatsFn = std::function<rpc::NodeStats()>;
  using HeartbeatFn = std::function<void(const rpc::HeartbeatResponse&)>;

  // Everything passed must outlive this. Starts the thread.
  MetaReporter(const Options& options, meta::MetaClient* meta, BlockDirectory* directory,
               BlockCache* cache, StatsFn stats, HeartbeatFn on_heartbeat);
  // Stops and joins the thread.
  ~MetaReporter();
  // Ends the loop (it returns within the current report). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends the blocks stored and lost since the last report now, from the caller's thread (a
  // prefetch about to say it finished: meta's locality then counts every block it made
  // resident). Nothing when the node is not registered (its registration reports everything).
  void ReportNow() ABSL_LOCKS_EXCLUDED(send_mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Returns: Ok; meta's error.
  absl::Status Register();
  absl::Status FullReport();
  // Sets *sent to whether there were changes to send.
  absl::Status SendChanges(bool* sent);

  const Options options_;
  meta::MetaClient* const meta_;
  BlockDirectory* const directory_;
  BlockCache* const cache_;
  const StatsFn stats_;
  const HeartbeatFn on_heartbeat_;
  // Reports are sent one at a time, in order (a block added then removed must not arrive as
  // removed then added).
  absl::Mutex send_mu_;
  std::atomic<bool> registered_{false};
  // Only the loop's thread uses this.
  std::chrono::milliseconds heartbeat_interval_{1000};

  absl::Mutex mu_;
  absl::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ember::cachefs
