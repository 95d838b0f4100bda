// NodeAgent: startup wiring and teardown. Reports to meta: agent_reports.cc; figures and
// /metrics: agent_metrics.cc; takeover: agent_handover.cc.
#include "cachefs/node_agent.h"

#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachefs/agent_handover.h"
#include "cachefs/agent_metrics.h"
#include "cachefs/agent_reports.h"
#include "cachefs/cache/block_cache.h"
#include "cachefs/cache/scrubber.h"
#include "cachefs/dataset_fs.h"
#include "cachefs/fetch/block_directory.h"
#include "cachefs/fetch/checksum_book.h"
#include "cachefs/fetch/peer_fetcher.h"
#include "cachefs/fetch/read_path.h"
#include "cachefs/fuse/kernel_binding.h"
#include "cachefs/fuse/libfuse_binding.h"
#include "cachefs/manifest_cache.h"
#include "cachefs/namespace.h"
#include "cachefs/prefetch.h"
#include "cachefs/repair.h"
#include "cachefs/volume/volume_fs.h"
#include "cachefs/volume/volume_store.h"
#include "cachefs/volume/volume_upload.h"
#include "common/memory.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/units.h"
#include "meta/meta_client.h"
#include "origin/origin.h"

namespace ember::cachefs {

// Peers get a block just filled from memory (ReadPath's recent blocks), others straight from the
// cache files.
class CacheBlockSource final : public transport::BlockSource {
 public:
  CacheBlockSource(BlockCache* cache, VolumeStore* volumes) : cache_(cache), volumes_(volumes) {}
  // Set once the read path exists (the server starts before it); it outlives the server.
  void SetReadPath(ReadPath* read_path) { read_path_ = read_path; }
  // Set once the volumes exist; null (before they go away) waits for the calls in progress.
  void SetVolumes(VolumeFs* volumes) ABSL_LOCKS_EXCLUDED(calls_mu_) {
    absl::WriterMutexLock lock(&calls_mu_);
    volume_fs_ = volumes;
  }
  absl::StatusOr<std::string> Call(std::string_view request) override
      ABSL_LOCKS_EXCLUDED(calls_mu_) {
    absl::ReaderMutexLock lock(&calls_mu_);
    if (volume_fs_ == nullptr) return absl::UnavailableError("the node is starting or stopping");
    return volume_fs_->ServeCall(request);
  }
  std::optional<Block> Get(const BlockAddr& addr) override {
    static metrics::Counter* const from_memory = metrics::Global().GetCounter(
        "ember_peer_blocks_served_total", "Blocks sent to peers, by where they were read from.",
        {{"from", "memory"}});
    static metrics::Counter* const from_file = metrics::Global().GetCounter(
        "ember_peer_blocks_served_total", "Blocks sent to peers, by where they were read from.",
        {{"from", "cache_file"}});
    ReadPath* rp = read_path_;
    uint64_t checksum = 0;
    if (rp != nullptr) {
      if (auto recent = rp->RecentBlock(addr, &checksum)) {
        Block b;
        b.data = recent->data();
        b.length = static_cast<uint32_t>(recent->size());
        b.checksum = checksum;
        b.hold = std::move(recent);
        from_memory->Inc();
        return b;
      }
    }
    auto hold = cache_->Acquire(addr);
    if (!hold) {
      // A volume file's contents (the address's dataset id is the volume's): served from the
      // node's copy; the receiver checks every block against meta's checksums.
      auto v = volumes_->GetBlock(addr);
      if (!v) return std::nullopt;
      from_file->Inc();
      return Block{nullptr, v->whole->fd, v->offset, v->length, v->checksum, v->whole};
    }
    // Never offer a block the cache cannot vouch for: a bad one is quarantined here (NotFound
    // to the peer, which tries another holder) and refilled.
    if (!cache_->PrepareSend(*hold).ok()) return std::nullopt;
    from_file->Inc();
    return Block{nullptr, hold->fd, hold->offset, hold->length, hold->checksum, hold};
  }

 private:
  BlockCache* cache_;
  VolumeStore* volumes_;
  std::atomic<ReadPath*> read_path_{nullptr};
  absl::Mutex calls_mu_;
  VolumeFs* volume_fs_ ABSL_GUARDED_BY(calls_mu_) = nullptr;
};

namespace {

std::string Label(const std::map<std::string, std::string>& labels, const std::string& key) {
  auto it = labels.find(key);
  return it == labels.end() ? "" : it->second;
}

}  // namespace

NodeAgent::NodeAgent() = default;

absl::StatusOr<std::unique_ptr<NodeAgent>> NodeAgent::Start(const NodeOptions& options) {
  if (options.cache_dir.empty()) return absl::InvalidArgumentError("--cache-dir is required");
  if (options.mountpoint.empty()) return absl::InvalidArgumentError("--mount is required");
  if (options.cache_bytes == 0) return absl::InvalidArgumentError("--cache-size must be > 0");
  std::unique_ptr<NodeAgent> a(new NodeAgent());
  a->options_ = options;
  if (a->options_.node_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    a->options_.node_id = host;
  }
  if (options.fuse_binding != "kernel" && options.fuse_binding != "libfuse") {
    return absl::InvalidArgumentError(
        absl::StrCat("--fuse-binding '", options.fuse_binding, "': use kernel or libfuse"));
  }
  // Take over a running agent's mount first: it keeps serving while this process starts, and
  // hands over once it has closed the cache and freed its ports.
  auto inherited = InheritMount(options.supervisor_fd, options.takeover, options.fuse_binding,
                                options.cache_dir);
  if (!inherited.ok()) return inherited.status();
  // Check the mountpoint before touching anything else.
  if (!*inherited) {
    absl::Status mp = PrepareMountpoint(options.mountpoint);
    if (!mp.ok()) return mp;
  }

  BlockCache::Options co;
  co.dir = options.cache_dir;
  co.capacity_bytes = options.cache_bytes;
  co.direct_writes = options.direct_cache_writes;
  co.small_file_max = options.small_file_max;
  auto cache = BlockCache::Open(co);
  if (!cache.ok()) return cache.status();
  a->cache_ = std::move(*cache);
  // Nothing loaded from disk is trusted, also after a takeover: blocks are checked as they are
  // read (or by the scrubber) before they are served or handed to passthrough.
  a->scrubber_ = std::make_unique<Scrubber>(
      a->cache_.get(), options.scrub_rate < 0 ? Scrubber::DefaultRate(options.cache_bytes)
                                              : static_cast<uint64_t>(options.scrub_rate));
  struct statvfs vfs;
  if (statvfs(options.cache_dir.c_str(), &vfs) == 0) {
    uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    uint64_t used = a->cache_->GetStats().used_bytes;
    if (options.cache_bytes > avail + used) {
      spdlog::warn(
          "node: --cache-size {} is larger than the free space of {} ({} free); reads "
          "will be served without caching when the disk fills",
          FormatBytes(options.cache_bytes), options.cache_dir, FormatBytes(avail));
    }
  }

  a->meta_ = std::make_unique<meta::MetaClient>(
      options.meta_address, meta::MetaCredentials{options.token, options.tls_ca_file},
      std::chrono::seconds(5));
  a->directory_ = NewMetaBlockDirectory(a->meta_.get(), a->options_.node_id);
  a->origin_ = origin::NewOriginRouter();  // POSIX paths, s3://, http(s)://

  // Peers: serve our blocks, fetch theirs.
  transport::TransportOptions to;
  to.token = options.token;
  to.io_timeout = options.peer_timeout;
  to.rdma_traffic_class = options.rdma_traffic_class;
  to.rdma_memory = options.rdma_memory;
  if (*inherited) {
    // The predecessor's peer port, still listening: peers that connected meanwhile are served.
    to.listen_fd = std::exchange((*inherited)->peer_listen_fd, -1);
  }
  a->volume_store_ = std::make_unique<VolumeStore>(options.cache_dir + "/volumes");
  a->volume_store_->SetLimit(options.volume_bytes, absl::Seconds(10));
  a->block_source_ = std::make_unique<CacheBlockSource>(a->cache_.get(), a->volume_store_.get());
  auto server = transport::StartBlockServer(options.listen, a->block_source_.get(), to);
  if (!server.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--listen ", options.listen,
                     ": peers cannot reach this node: ", server.status().message()));
  }
  a->block_server_ = std::move(*server);
  std::string why;
  auto transport = transport::SelectTransport(options.transport, to, &why);
  if (!transport.ok()) return transport.status();
  a->transport_ = std::move(*transport);
  spdlog::info("node: peers served on {}{}; fetching with {}", options.listen,
               to.listen_fd >= 0 && a->block_server_->listener() == to.listen_fd
                   ? " (the predecessor's socket)"
                   : "",
               why);
  PeerFetcher::Options po;
  po.self_id = a->options_.node_id;
  po.self_switch = Label(options.labels, "switch");
  po.self_rack = Label(options.labels, "rack");
  a->checksums_ = std::make_unique<ChecksumBook>(a->directory_.get(), po.locate_ttl);
  a->peers_ = std::make_unique<PeerFetcher>(a->directory_.get(), a->transport_.get(),
                                            a->checksums_.get(), po);

  ReadPath::Options ro;
  ro.readahead_blocks = options.readahead_blocks;
  ro.recent_blocks = static_cast<size_t>(std::max(0, options.recent_blocks));
  // One fill thread per readahead block at least: a thread is busy with a block's cache write
  // after its fetch, and fewer threads than blocks in the window leaves the origin idle.
  ro.fill_threads = std::max(options.fill_threads, options.readahead_blocks);
  a->read_path_ = std::make_unique<ReadPath>(a->cache_.get(), a->origin_.get(), a->checksums_.get(),
                                             ro, a->peers_.get(), a->scrubber_.get());
  a->block_source_->SetReadPath(a->read_path_.get());
  a->manifests_ = std::make_unique<ManifestCache>(options.cache_dir + "/manifests");
  a->namespace_ = std::make_unique<Namespace>(a->meta_.get(), a->manifests_.get());
  a->repairer_ = std::make_unique<Repairer>(a->namespace_.get(), a->read_path_.get());
  a->cache_->SetQuarantineListener(
      [r = a->repairer_.get()](const BlockAddr& addr) { r->Enqueue(addr); });
  a->uploader_ =
      std::make_unique<VolumeUploader>(a->meta_.get(), a->volume_store_.get(), a->options_.node_id);
  a->volume_fs_ =
      std::make_unique<VolumeFs>(a->meta_.get(), a->volume_store_.get(), a->transport_.get(),
                                 a->options_.node_id, a->uploader_.get());
  a->block_source_->SetVolumes(a->volume_fs_.get());
  a->fs_ =
      std::make_unique<DatasetFs>(a->namespace_.get(), a->read_path_.get(), a->volume_fs_.get());
  a->prefetch_ = std::make_unique<PrefetchRunner>(
      a->options_.node_id, a->namespace_.get(), a->read_path_.get(), a->cache_.get(),
      a->meta_.get(), options.prefetch_owner_grace, [p = a.get()] { p->ReportLocationsNow(); });
  if (options.fuse_binding == "libfuse") {
    auto mount = FuseMount::Mount(a->fs_.get(), options.mountpoint, options.mount);
    if (!mount.ok()) return mount.status();
    a->mount_ = std::move(*mount);
  } else {
    auto mount = *inherited ? KernelFuse::Adopt(a->fs_.get(), std::move(**inherited), options.mount)
                            : KernelFuse::Mount(a->fs_.get(), options.mountpoint, options.mount);
    if (!mount.ok()) return mount.status();
    a->kernel_ = mount->get();
    if (options.supervisor_fd >= 0) {
      a->kernel_->SetSupervisor(options.supervisor_fd, a->block_server_->listener());
    }
    a->mount_ = std::move(*mount);
    // A successor (`ember node --takeover`) can ask for this mount (not for one served over
    // io_uring: its rings die with this process).
    if (!options.mount.fuse_uring) a->handover_ = Handover::Listen(options.cache_dir, a->kernel_);
  }
  auto stats = [p = a.get()] { return p->Stats(); };
  auto metrics = AgentMetrics::Start(options.metrics_listen,
                                     HttpAccess{options.token, options.metrics_open_paths}, stats);
  if (!metrics.ok()) return metrics.status();
  a->metrics_ = std::move(*metrics);

  MetaReporter::Options mo;
  mo.node.set_id(a->options_.node_id);
  mo.node.set_address(options.listen);
  for (const auto& [k, v] : options.labels) (*mo.node.mutable_labels())[k] = v;
  mo.node.set_gpus(options.gpus);
  mo.node.set_capacity_bytes(options.cache_bytes);
  mo.report_interval = options.report_interval;
  a->reporter_ = std::make_unique<MetaReporter>(
      mo, a->meta_.get(), a->directory_.get(), a->cache_.get(), stats,
      [p = a.get()](const rpc::HeartbeatResponse& hb) {
        p->read_path_->FlushPendingChecksums();
        p->read_path_->DropIdleRecent();
        p->prefetch_->Update({hb.prefetches().begin(), hb.prefetches().end()});
      });
  if (options.manifest_copy_max_entries > 0) {
    a->copier_ = std::thread([p = a.get()] { p->CopyManifests(); });
  }
  if (options.warm_memory == 0) {
    spdlog::info("node: memory for blocks in flight: none held from start (--warm-memory 0)");
  } else {
    a->warmer_ = std::thread([p = a.get()] { p->KeepMemoryWarm(); });
  }
  return a;
}

void NodeAgent::CopyManifests() {
  do {
    namespace_->SyncCopies(options_.manifest_copy_max_entries);
  } while (!stop_copies_.WaitForNotificationWithTimeout(
      absl::FromChrono(options_.manifest_copy_interval)));
}

void NodeAgent::KeepMemoryWarm() {
  const auto start = std::chrono::steady_clock::now();
  const size_t kept = WarmAllocator(options_.warm_memory, &stopping_);
  if (stopping_) return;
  if (kept == 0) {
    spdlog::info(
        "node: memory for blocks in flight: none held from start (this build's "
        "allocator hands freed memory back; --warm-memory does nothing)");
    return;
  }
  spdlog::info("node: memory for blocks in flight: {} MiB faulted in ({} ms)", kept >> 20,
               std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - start)
                   .count());
  // A release after a burst far beyond it (a large manifest built) takes the reserve too
  // (common/memory.h): fault it in again, in the background.
  while (!stop_warm_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
    if (WarmReserveLost()) WarmAllocator(options_.warm_memory, &stopping_);
  }
}

NodeAgent::~NodeAgent() {
  Stop();
  if (!stop_copies_.HasBeenNotified()) stop_copies_.Notify();
  if (copier_.joinable()) copier_.join();  // it uses the namespace
  if (!stop_warm_.HasBeenNotified()) stop_warm_.Notify();
  if (warmer_.joinable()) warmer_.join();
  {
    absl::MutexLock lock(&reporter_mu_);
    reporter_live_ = false;  // a prefetch finishing now skips its early report
  }
  reporter_.reset();                 // joins its thread
  metrics_.reset();                  // its callbacks point at this agent
  scrubber_.reset();                 // quarantines feed the repairer
  if (repairer_) repairer_->Stop();  // it fills through the read path
  prefetch_.reset();                 // its workers use the read path
  if (handover_) handover_->StopListening();
  mount_.reset();  // unmount (unless handed over) before the filesystem it serves goes away
  if (block_source_) block_source_->SetVolumes(nullptr);  // waits for peers' calls in progress
  if (handover_ && handover_->Requested()) {
    // Close everything the successor opens (cache index, ports), then hand the mount over.
    fs_.reset();
    volume_fs_.reset();
    uploader_.reset();
    namespace_.reset();
    read_path_.reset();
    peers_.reset();
    checksums_.reset();
    transport_.reset();
    block_server_.reset();
    block_source_.reset();
    volume_store_.reset();
    cache_.reset();
    manifests_.reset();
    directory_.reset();
    meta_.reset();
    handover_->Send(std::exchange(released_listener_, -1));
  }
}

bool NodeAgent::HandedOver() { return handover_ != nullptr && handover_->Requested(); }

void NodeAgent::Run() { mount_->Run(); }

void NodeAgent::ReportLocationsNow() {
  absl::MutexLock lock(&reporter_mu_);
  if (reporter_live_ && reporter_ != nullptr) reporter_->ReportNow();
}

void NodeAgent::Stop() {
  if (stopping_.exchange(true)) return;
  if (reporter_) reporter_->Stop();
  if (mount_) mount_->Stop();
  if (block_server_ && HandedOver()) {
    // Peers connecting from now on wait in the socket's backlog for the successor.
    released_listener_ = block_server_->ReleaseListener();
  }
  if (block_server_) block_server_->Stop();
}

rpc::NodeStats NodeAgent::Stats() {
  return CollectNodeStats(cache_.get(), read_path_.get(), kernel_, scrubber_.get(), repairer_.get(),
                          namespace_.get());
}

}  // namespace ember::cachefs
