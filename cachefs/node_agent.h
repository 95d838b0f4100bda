// NodeAgent: one node of an Ember cluster. Opens the block cache, serves its blocks to peers
// (transport/), registers with meta (full block report, then heartbeats and incremental reports),
// and serves datasets through a FUSE mount, filling misses from peers before the origin. This is
// the front door of cachefs/: tools/ builds one from flags.
//
// Meta may come and go: the agent retries registration in the background and keeps serving what
// it can (resident blocks and origin reads of loaded manifests) meanwhile.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cachefs/block_cache.h"
#include "cachefs/dataset_fs.h"
#include "cachefs/fuse_kernel.h"
#include "cachefs/fuse_mount.h"
#include "cachefs/namespace.h"
#include "cachefs/peer_fetcher.h"
#include "cachefs/prefetch.h"
#include "cachefs/read_path.h"
#include "cachefs/takeover.h"
#include "meta/meta_client.h"
#include "origin/origin.h"
#include "transport/block_transport.h"

namespace httplib {
class Server;
}

namespace ember::cachefs {

class ManifestCache;

struct NodeOptions {
  std::string meta_address;
  std::string listen = "127.0.0.1:7371";  // address peers reach this node's block server on
  std::string node_id;                    // default: the host name
  std::map<std::string, std::string> labels;
  uint32_t gpus = 0;
  std::string cache_dir;
  uint64_t cache_bytes = 0;
  bool direct_cache_writes = true;  // BlockCache::Options::direct_writes
  std::string mountpoint;
  MountOptions mount;
  int readahead_blocks = 4;
  int fill_threads = 2;
  std::chrono::milliseconds report_interval{200};
  transport::TransportMode transport = transport::TransportMode::kAuto;
  std::string token;        // cluster token: sent to meta, and peers must prove it (--token-file)
  std::string tls_ca_file;  // set: reach meta over TLS, verifying it against this CA
  std::chrono::milliseconds peer_timeout{3000};  // no progress from a peer this long: next source
  std::string metrics_listen;  // HOST:PORT for HTTP /metrics (Prometheus) and /healthz; "" = off
  std::string fuse_binding = "kernel";  // "kernel" (fuse_kernel.h) or "libfuse" (fuse_mount.h)
  // Take the mount over from the agent running on this cache dir (takeover.h), if there is one.
  bool takeover = false;
  // Set by `ember node --supervise` in the agent it runs: the supervisor's end of a
  // SOCK_SEQPACKET pair (takeover.h). The agent reattaches a mount queued there, and reports its
  // mount and passthrough opens to it.
  int supervisor_fd = -1;
};

class NodeAgent {
 public:
  // Validates options, opens the cache and mounts. Registration with meta happens in the
  // background. Returns: InvalidArgument / NotFound / FailedPrecondition naming what is wrong.
  static absl::StatusOr<std::unique_ptr<NodeAgent>> Start(const NodeOptions& options);
  ~NodeAgent();

  // Serves the mount until Stop(); returns when it is unmounted.
  void Run();
  // Unmounts and stops background threads; safe from a signal-handling thread. After a handover
  // to a successor the mount stays (the successor serves it).
  void Stop();
  // True once a successor asked for the mount (Run() has returned for that reason).
  bool HandedOver();

  rpc::NodeStats Stats();

 private:
  NodeAgent() = default;
  void Background();
  // On the takeover listener's thread: stop serving FUSE; the rest shuts down in ~NodeAgent.
  void HandOver(int conn);
  absl::Status Register();
  absl::Status FullReport();
  absl::Status SendChanges();
  // Metrics read at scrape time, and the HTTP server for /metrics.
  absl::Status StartMetrics();
  rpc::NodeStats RecentStats();  // Stats(), at most 500 ms old

  NodeOptions options_;
  std::unique_ptr<meta::MetaClient> meta_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<origin::Origin> origin_;
  std::unique_ptr<transport::BlockSource> block_source_;
  std::unique_ptr<transport::BlockServer> block_server_;
  std::unique_ptr<transport::BlockTransport> transport_;
  std::unique_ptr<PeerFetcher> peers_;
  std::unique_ptr<ReadPath> read_path_;
  std::unique_ptr<ManifestCache> manifests_;
  std::unique_ptr<Namespace> namespace_;
  std::unique_ptr<DatasetFs> fs_;
  std::unique_ptr<PrefetchRunner> prefetch_;
  std::unique_ptr<MountBinding> mount_;
  KernelFuse* kernel_ = nullptr;  // mount_, when it is the kernel binding
  std::unique_ptr<TakeoverListener> takeover_;
  int handover_conn_ = -1;  // a successor waiting for the mount (sent once all is closed)
  KernelFuseState handover_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  std::mutex stats_mu_;
  rpc::NodeStats recent_stats_;
  std::chrono::steady_clock::time_point recent_at_{};

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread background_;
  bool registered_ = false;
  std::chrono::milliseconds heartbeat_interval_{1000};
};

}  // namespace ember::cachefs
