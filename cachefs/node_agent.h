// cachefs/: the node agent, one node of an Ember cluster. This header is the folder's front
// door: tools/ builds a NodeAgent from flags.
//
// The agent opens the block cache (cache/), serves its blocks to peers (transport/), fills
// misses from peers before the origin (fetch/), and serves datasets through a FUSE mount
// (fuse/, over DatasetFs and the Namespace) beside writable volumes for checkpoints (volume/,
// whose inodes DatasetFs hands to VolumeFs). Besides startup wiring (this file) it reports to
// meta (agent_reports.h), exports its figures (agent_metrics.h) and hands its mount over to a
// successor (agent_handover.h). Subfolders must not include this level (dataset_fs.h,
// namespace.h, prefetch.h, node_agent.h); fuse/ sees files only through filesystem.h.
//
// Meta may come and go: the agent retries registration in the background and keeps serving what
// it can (resident blocks and origin reads of loaded manifests) meanwhile.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "cachefs/fuse/binding.h"
#include "meta/meta.pb.h"
#include "transport/block_transport.h"

namespace ember::meta {
class MetaClient;
}

namespace ember::origin {
class Origin;
}

namespace ember::cachefs {

class AgentMetrics;
class BlockCache;
class CacheBlockSource;
class BlockDirectory;
class ChecksumBook;
class DatasetFs;
class Handover;
class KernelFuse;
class ManifestCache;
class MetaReporter;
class Namespace;
class PeerFetcher;
class PrefetchRunner;
class ReadPath;
class Repairer;
class Scrubber;
class VolumeFs;
class VolumeStore;
class VolumeUploader;

struct NodeOptions {
  std::string meta_address;
  std::string listen = "127.0.0.1:7371";  // address peers reach this node's block server on
  std::string node_id;                    // default: the host name
  std::map<std::string, std::string> labels;
  uint32_t gpus = 0;
  std::string cache_dir;
  uint64_t cache_bytes = 0;
  uint64_t volume_bytes = 0;            // VolumeStore::SetLimit (0: the disk's only)
  bool direct_cache_writes = true;      // BlockCache::Options::direct_writes
  uint64_t small_file_max = 256 << 10;  // BlockCache::Options::small_file_max
  std::string mountpoint;
  MountOptions mount;
  int readahead_blocks = 8;  // the most; the window grows to it (ReadPath::Options)
  int recent_blocks = 48;    // blocks just filled kept in memory besides the readahead window
  int fill_threads = 8;
  // The scrubber's pace in bytes per second (cache/scrubber.h): -1 = a full pass per day of the
  // cache's capacity; 0 = no background pass.
  int64_t scrub_rate = -1;
  std::chrono::milliseconds report_interval{200};
  transport::TransportMode transport = transport::TransportMode::kAuto;
  uint8_t rdma_traffic_class = 0;     // RoCE GRH traffic class (--rdma-tclass)
  uint64_t rdma_memory = 512u << 20;  // registered RDMA buffers per pool (--rdma-memory)
  // Allocator memory faulted in at start and kept for blocks in flight (common/memory.h,
  // WarmAllocator; --warm-memory).
  uint64_t warm_memory = 512u << 20;
  std::string token;        // cluster token: sent to meta, and peers must prove it (--token-file)
  std::string tls_ca_file;  // set: reach meta over TLS, verifying it against this CA
  std::chrono::milliseconds prefetch_owner_grace{15000};  // see PrefetchRunner
  // Every dataset's latest manifest of at most this many entries is copied to disk ahead of use
  // (Namespace::SyncCopies), so that meta's absence hides nothing; 0 = none ahead of use.
  uint64_t manifest_copy_max_entries = 2'000'000;
  std::chrono::milliseconds manifest_copy_interval{10000};
  std::chrono::milliseconds peer_timeout{3000};  // no progress from a peer this long: next source
  std::string metrics_listen;  // HOST:PORT for HTTP /metrics (Prometheus) and /healthz; "" = off
  // With a token, HTTP paths served without it (common/http_server.h).
  std::vector<std::string> metrics_open_paths = {"/healthz"};
  std::string fuse_binding = "kernel";  // "kernel" (fuse/kernel_binding.h) or "libfuse"
  // Take the mount over from the agent running on this cache dir (fuse/takeover.h), if any.
  bool takeover = false;
  // Set by `ember node --supervise` in the agent it runs: the supervisor's end of a
  // SOCK_SEQPACKET pair (fuse/supervisor.h). The agent reattaches a mount queued there, and
  // reports its mount and opens to it.
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
  // Returns: true once a successor asked for the mount (Run() has returned for that reason).
  bool HandedOver();

  rpc::NodeStats Stats();

 private:
  NodeAgent();

  NodeOptions options_;
  std::atomic<bool> stopping_{false};
  // Copies manifests to disk ahead of use (at start, then every manifest_copy_interval).
  void CopyManifests();
  // Sends meta the blocks stored since the last report, now (a prefetch that finished here).
  void ReportLocationsNow() ABSL_LOCKS_EXCLUDED(reporter_mu_);
  absl::Notification stop_copies_;
  std::thread copier_;
  // Faults in options_.warm_memory at start, and again whenever a release took it
  // (common/memory.h, WarmAllocator), until stop_warm_.
  void KeepMemoryWarm();
  absl::Notification stop_warm_;
  std::thread warmer_;
  // In the order they are built; torn down in reverse (see ~NodeAgent).
  std::unique_ptr<meta::MetaClient> meta_;
  std::unique_ptr<BlockDirectory> directory_;
  // Refills quarantined blocks; made before the cache (whose listener it is) and destroyed after
  // it, but stopped (~NodeAgent) before the read path it fills through goes away.
  std::unique_ptr<Repairer> repairer_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<Scrubber> scrubber_;
  std::unique_ptr<origin::Origin> origin_;
  std::unique_ptr<VolumeStore> volume_store_;  // before block_source_: it serves from it
  std::unique_ptr<CacheBlockSource> block_source_;
  std::unique_ptr<transport::BlockServer> block_server_;
  int released_listener_ = -1;  // the peer port, still listening, for a successor
  std::unique_ptr<transport::BlockTransport> transport_;
  std::unique_ptr<ChecksumBook> checksums_;
  std::unique_ptr<PeerFetcher> peers_;
  std::unique_ptr<ReadPath> read_path_;
  std::unique_ptr<ManifestCache> manifests_;
  std::unique_ptr<Namespace> namespace_;
  std::unique_ptr<VolumeUploader> uploader_;  // before volume_fs_: it nudges it
  std::unique_ptr<VolumeFs> volume_fs_;
  std::unique_ptr<DatasetFs> fs_;
  std::unique_ptr<PrefetchRunner> prefetch_;
  std::unique_ptr<MountBinding> mount_;
  KernelFuse* kernel_ = nullptr;  // mount_, when it is the kernel binding
  std::unique_ptr<Handover> handover_;
  std::unique_ptr<AgentMetrics> metrics_;
  std::unique_ptr<MetaReporter> reporter_;
  // A prefetch's early location report (ReportLocationsNow) against the reporter's end.
  absl::Mutex reporter_mu_;
  bool reporter_live_ ABSL_GUARDED_BY(reporter_mu_) = true;
};

}  // namespace ember::cachefs
