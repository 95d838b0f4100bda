// The node agent's figures: NodeStats for heartbeats and `ember status` (CollectNodeStats), the
// same figures for Prometheus (AgentMetrics: callbacks read at scrape time), and the agent's
// HTTP server for /metrics and /healthz (--metrics-listen).
//
// Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/cache/block_cache.h"
#include "cachefs/fetch/read_path.h"
#include "cachefs/fuse/kernel_binding.h"
#include "common/http_server.h"
#include "meta/meta.pb.h"

namespace ember::cachefs {

class Namespace;
class Repairer;
class Scrubber;

// The node's figures now. `kernel` is null under the libfuse binding; scrubber, repairer and ns
// may be null.
rpc::NodeStats CollectNodeStats(BlockCache* cache, ReadPath* read_path, KernelFuse* kernel,
                                Scrubber* scrubber, Repairer* repairer, Namespace* ns);

class AgentMetrics {
 public:
  // Registers the agent's figures with the process's metrics registry, read from `stats` at
  // scrape time (at most 500 ms old), and with `listen` ("HOST:PORT", port 0 picks one; "" =
  // none) serves /metrics and /healthz there, under `access` (the cluster token). `stats` must stay
  // callable until this is gone. Returns: InvalidArgument (not HOST:PORT); FailedPrecondition
  // (cannot listen there).
  static absl::StatusOr<std::unique_ptr<AgentMetrics>> Start(const std::string& listen,
                                                             const HttpAccess& access,
                                                             std::function<rpc::NodeStats()> stats);
  // Removes the figures from the registry and stops the server.
  ~AgentMetrics();

 private:
  explicit AgentMetrics(std::function<rpc::NodeStats()> stats);
  // Returns: stats_(), at most 500 ms old.
  rpc::NodeStats Recent() ABSL_LOCKS_EXCLUDED(mu_);

  const std::function<rpc::NodeStats()> stats_;
  absl::Mutex mu_;
  rpc::NodeStats recent_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point recent_at_ ABSL_GUARDED_BY(mu_){};
  std::unique_ptr<HttpServer> http_;
};

}  // namespace ember::cachefs
