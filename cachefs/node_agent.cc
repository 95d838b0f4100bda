#include "cachefs/node_agent.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cachefs/manifest_cache.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/units.h"

namespace ember::cachefs {
namespace {

rpc::BlockAddr ToProto(const BlockAddr& a) {
  rpc::BlockAddr b;
  b.set_dataset_id(a.dataset_id);
  b.set_version(a.version);
  b.set_file_id(a.file_id);
  b.set_index(a.index);
  return b;
}

constexpr size_t kReportPage = 2000;  // files (full report) or blocks (increments) per RPC

// Peers read resident blocks straight from the cache files.
class CacheBlockSource final : public transport::BlockSource {
 public:
  explicit CacheBlockSource(BlockCache* cache) : cache_(cache) {}
  std::optional<Block> Get(const BlockAddr& addr) override {
    auto pin = cache_->Acquire(addr);
    if (!pin) return std::nullopt;
    return Block{pin->fd, pin->offset, pin->length, pin->checksum, pin};
  }

 private:
  BlockCache* cache_;
};

std::string Label(const std::map<std::string, std::string>& labels, const std::string& key) {
  auto it = labels.find(key);
  return it == labels.end() ? "" : it->second;
}

}  // namespace

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
  std::optional<KernelFuseState> inherited;
  if (options.supervisor_fd >= 0) {
    inherited = TakeQueuedState(options.supervisor_fd);  // the mount of a crashed predecessor
    if (inherited)
      spdlog::info("node: reattaching {} kept by the supervisor", inherited->mountpoint);
  }
  if (options.takeover && !inherited) {
    if (options.fuse_binding != "kernel") {
      return absl::InvalidArgumentError("--takeover needs --fuse-binding kernel");
    }
    const std::string sock = TakeoverSocketPath(options.cache_dir);
    auto st = RequestTakeover(sock, std::chrono::seconds(60));
    if (st.ok()) {
      inherited = std::move(*st);
    } else if (absl::IsNotFound(st.status())) {
      spdlog::info("node: --takeover: {}; mounting afresh", std::string(st.status().message()));
    } else {
      return absl::FailedPreconditionError(absl::StrCat("--takeover: ", st.status().message()));
    }
  }
  // Check the mountpoint before touching anything else.
  if (!inherited) {
    absl::Status mp = PrepareMountpoint(options.mountpoint);
    if (!mp.ok()) return mp;
  }

  BlockCache::Options co;
  co.dir = options.cache_dir;
  co.capacity_bytes = options.cache_bytes;
  co.direct_writes = options.direct_cache_writes;
  auto cache = BlockCache::Open(co);
  if (!cache.ok()) return cache.status();
  a->cache_ = std::move(*cache);
  if (inherited) {
    // The predecessor served (and verified) these blocks until a moment ago and nothing wrote
    // the cache since: re-reading every block on first use (for passthrough: the whole file
    // inside open) would stall the readers the takeover is meant to spare.
    a->cache_->MarkAllVerified();
  }
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
  a->origin_ = origin::NewOriginRouter();  // POSIX paths, s3://, http(s)://

  // Peers: serve our blocks, fetch theirs.
  transport::TransportOptions to;
  to.token = options.token;
  to.io_timeout = options.peer_timeout;
  a->block_source_ = std::make_unique<CacheBlockSource>(a->cache_.get());
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
  spdlog::info("node: peers served on {}; fetching with {}", options.listen, why);
  PeerFetcher::Options po;
  po.self_id = a->options_.node_id;
  po.self_switch = Label(options.labels, "switch");
  po.self_rack = Label(options.labels, "rack");
  a->peers_ = std::make_unique<PeerFetcher>(a->meta_.get(), a->transport_.get(), po);

  ReadPath::Options ro;
  ro.readahead_blocks = options.readahead_blocks;
  // One fill thread per readahead block at least: a thread is busy with a block's cache write
  // after its fetch, and fewer threads than blocks in the window leaves the origin idle.
  ro.fill_threads = std::max(options.fill_threads, options.readahead_blocks);
  a->read_path_ = std::make_unique<ReadPath>(a->cache_.get(), a->origin_.get(), a->meta_.get(), ro,
                                             a->peers_.get());
  a->manifests_ = std::make_unique<ManifestCache>(options.cache_dir + "/manifests");
  a->namespace_ = std::make_unique<Namespace>(a->meta_.get(), a->manifests_.get());
  a->fs_ = std::make_unique<DatasetFs>(a->namespace_.get(), a->read_path_.get(),
                                       options.readahead_blocks);
  a->prefetch_ =
      std::make_unique<PrefetchRunner>(a->options_.node_id, a->namespace_.get(),
                                       a->read_path_.get(), a->cache_.get(), a->meta_.get());
  if (options.fuse_binding == "libfuse") {
    auto mount = FuseMount::Mount(a->fs_.get(), options.mountpoint, options.mount);
    if (!mount.ok()) return mount.status();
    a->mount_ = std::move(*mount);
  } else {
    auto mount = inherited ? KernelFuse::Adopt(a->fs_.get(), std::move(*inherited), options.mount)
                           : KernelFuse::Mount(a->fs_.get(), options.mountpoint, options.mount);
    if (!mount.ok()) return mount.status();
    a->kernel_ = mount->get();
    if (options.supervisor_fd >= 0) a->kernel_->SetSupervisor(options.supervisor_fd);
    a->mount_ = std::move(*mount);
    // A successor (`ember node --takeover`) can ask for this mount (not for one served over
    // io_uring: its rings die with this process).
    if (!options.mount.fuse_uring) {
      auto listener = TakeoverListener::Start(TakeoverSocketPath(options.cache_dir),
                                              [p = a.get()](int conn) { p->HandOver(conn); });
      if (listener.ok()) {
        a->takeover_ = std::move(*listener);
      } else {
        spdlog::warn("node: {}; restarts will remount", std::string(listener.status().message()));
      }
    }
  }
  RETURN_IF_ERROR(a->StartMetrics());
  a->background_ = std::thread([p = a.get()] { p->Background(); });
  return a;
}

rpc::NodeStats NodeAgent::RecentStats() {
  std::lock_guard lock(stats_mu_);
  auto now = std::chrono::steady_clock::now();
  if (now - recent_at_ > std::chrono::milliseconds(500)) {
    recent_stats_ = Stats();
    recent_at_ = now;
  }
  return recent_stats_;
}

absl::Status NodeAgent::StartMetrics() {
  auto& r = metrics::Global();
  using Get = uint64_t (rpc::NodeStats::*)() const;
  auto add = [&](const std::string& name, const std::string& help, const std::string& type,
                 const metrics::Labels& labels, Get get) {
    r.SetCallback(name, help, type, labels,
                  [this, get] { return static_cast<double>((RecentStats().*get)()); });
  };
  add("ember_cache_capacity_bytes", "Configured cache capacity.", "gauge", {},
      &rpc::NodeStats::capacity_bytes);
  add("ember_cache_used_bytes", "Bytes of resident blocks.", "gauge", {},
      &rpc::NodeStats::used_bytes);
  add("ember_cache_resident_blocks", "Resident blocks.", "gauge", {},
      &rpc::NodeStats::resident_blocks);
  add("ember_cache_pinned_bytes", "Bytes of blocks pinned by prefetches.", "gauge", {},
      &rpc::NodeStats::pinned_bytes);
  add("ember_cache_evictions_total", "Blocks evicted to make room.", "counter", {},
      &rpc::NodeStats::evictions);
  add("ember_cache_not_admitted_total",
      "Blocks served without caching (admission policy or a full disk).", "counter", {},
      &rpc::NodeStats::not_admitted);
  add("ember_read_hits_total", "Block reads served from the local cache.", "counter", {},
      &rpc::NodeStats::hits);
  add("ember_read_misses_total", "Block reads that needed a fill.", "counter", {},
      &rpc::NodeStats::misses);
  const char* kReadBytes = "Bytes read through the mount, by where they came from.";
  add("ember_read_bytes_total", kReadBytes, "counter", {{"source", "cache"}},
      &rpc::NodeStats::bytes_from_cache);
  add("ember_read_bytes_total", kReadBytes, "counter", {{"source", "peer"}},
      &rpc::NodeStats::bytes_from_peers);
  add("ember_read_bytes_total", kReadBytes, "counter", {{"source", "origin"}},
      &rpc::NodeStats::bytes_from_origin);
  add("ember_origin_block_reads_total", "Blocks read from the origin.", "counter", {},
      &rpc::NodeStats::origin_block_reads);
  add("ember_checksum_failures_total", "Blocks dropped because their bytes were wrong.", "counter",
      {}, &rpc::NodeStats::checksum_failures);
  add("ember_peer_fetches_total", "Blocks filled from a peer.", "counter", {},
      &rpc::NodeStats::peer_fetches);
  const char* kOpens = "Files opened through the mount, by how their reads are served.";
  add("ember_fuse_opens_total", kOpens, "counter", {{"mode", "passthrough"}},
      &rpc::NodeStats::passthrough_opens);
  add("ember_fuse_opens_total", kOpens, "counter", {{"mode", "daemon"}},
      &rpc::NodeStats::daemon_opens);
  add("ember_fuse_passthrough_files_open", "Files open now with the kernel reading the cache file.",
      "gauge", {}, &rpc::NodeStats::passthrough_files_open);
  if (options_.metrics_listen.empty()) return absl::OkStatus();
  size_t colon = options_.metrics_listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(options_.metrics_listen.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen '", options_.metrics_listen, "' must be HOST:PORT"));
  }
  std::string host = options_.metrics_listen.substr(0, colon);
  http_ = std::make_unique<httplib::Server>();
  http_->Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics::Global().Render(), "text/plain; version=0.0.4");
  });
  http_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  int bound =
      port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--metrics-listen ", options_.metrics_listen, ": cannot listen there"));
  }
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  spdlog::info("node: metrics on http://{}:{}/metrics", host, bound);
  return absl::OkStatus();
}

NodeAgent::~NodeAgent() {
  Stop();
  if (background_.joinable()) background_.join();
  for (const char* prefix :
       {"ember_cache_", "ember_read_", "ember_origin_block_reads", "ember_checksum_failures",
        "ember_peer_fetches", "ember_fuse_opens", "ember_fuse_passthrough"}) {
    metrics::Global().RemoveCallbacks(prefix);  // they point at this agent
  }
  if (http_) http_->stop();
  if (http_thread_.joinable()) http_thread_.join();
  prefetch_.reset();  // its workers use the read path
  takeover_.reset();
  mount_.reset();  // unmount (unless handed over) before the filesystem it serves goes away
  if (handover_conn_ >= 0) {
    // Close everything the successor opens (cache index, ports), then hand the mount over.
    fs_.reset();
    namespace_.reset();
    read_path_.reset();
    peers_.reset();
    transport_.reset();
    block_server_.reset();
    block_source_.reset();
    cache_.reset();
    manifests_.reset();
    meta_.reset();
    absl::Status st = SendTakeoverState(handover_conn_, handover_);
    if (st.ok()) {
      spdlog::info("takeover: mount {} handed over", handover_.mountpoint);
    } else {
      spdlog::error("takeover: {}; the mount ends with this process", std::string(st.message()));
    }
    close(handover_.fd);
  }
}

void NodeAgent::HandOver(int conn) {
  KernelFuseState state = kernel_->Quiesce();  // Run() returns in the main thread
  std::lock_guard lock(mu_);
  handover_ = std::move(state);
  handover_conn_ = conn;
}

bool NodeAgent::HandedOver() {
  std::lock_guard lock(mu_);
  return handover_conn_ >= 0;
}

void NodeAgent::Run() { mount_->Run(); }

void NodeAgent::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (mount_) mount_->Stop();
  if (block_server_) block_server_->Stop();
}

rpc::NodeStats NodeAgent::Stats() {
  rpc::NodeStats s;
  BlockCache::Stats c = cache_->GetStats();
  ReadStats r = read_path_->GetStats();
  s.set_fuse_binding(kernel_ != nullptr ? "kernel" : "libfuse");
  if (kernel_ != nullptr) {
    KernelFuse::Stats k = kernel_->GetStats();
    s.set_passthrough(k.passthrough);
    s.set_passthrough_opens(k.passthrough_opens);
    s.set_daemon_opens(k.daemon_opens);
    s.set_passthrough_files_open(k.passthrough_files_open);
  }
  s.set_capacity_bytes(c.capacity_bytes);
  s.set_used_bytes(c.used_bytes);
  s.set_resident_blocks(c.resident_blocks);
  s.set_evictions(c.evictions);
  s.set_not_admitted(c.not_admitted);
  s.set_hits(r.hits);
  s.set_misses(r.misses);
  s.set_bytes_from_cache(r.bytes_from_cache);
  s.set_bytes_from_peers(r.bytes_from_peers);
  s.set_bytes_from_origin(r.bytes_from_origin);
  s.set_origin_block_reads(r.origin_block_reads);
  s.set_checksum_failures(r.checksum_failures);
  s.set_peer_fetches(r.peer_fetches);
  s.set_peer_errors(r.peer_errors);
  s.set_pinned_bytes(c.pinned_bytes);
  for (const auto& [ds, b] : c.pinned_bytes_by_dataset)
    (*s.mutable_pinned_bytes_by_dataset())[ds] = b;
  return s;
}

absl::Status NodeAgent::Register() {
  rpc::Node n;
  n.set_id(options_.node_id);
  n.set_address(options_.listen);
  for (const auto& [k, v] : options_.labels) (*n.mutable_labels())[k] = v;
  n.set_gpus(options_.gpus);
  n.set_capacity_bytes(options_.cache_bytes);
  auto r = meta_->RegisterNode(n);
  if (!r.ok()) return r.status();
  heartbeat_interval_ =
      std::chrono::milliseconds(std::max<uint32_t>(r->heartbeat_interval_ms(), 50));
  // Changes queued before registration are covered by the full report.
  std::vector<BlockAddr> added, removed;
  cache_->TakeChanges(&added, &removed);
  absl::Status st = FullReport();
  if (!st.ok()) return st;
  spdlog::info("node: {} registered with meta at {} (heartbeat every {} ms)", options_.node_id,
               options_.meta_address, heartbeat_interval_.count());
  return absl::OkStatus();
}

absl::Status NodeAgent::FullReport() {
  rpc::ReportBlocksRequest req;
  req.set_node_id(options_.node_id);
  req.set_full_report_start(true);
  absl::Status st = absl::OkStatus();
  cache_->ForEachResidentFile([&](uint32_t ds, uint32_t ver, uint64_t file, const std::string& bm) {
    if (!st.ok()) return;
    auto* f = req.add_files();
    f->set_dataset_id(ds);
    f->set_version(ver);
    f->set_file_id(file);
    f->set_bitmap(bm);
    if (static_cast<size_t>(req.files_size()) >= kReportPage) {
      st = meta_->ReportBlocks(req);
      req.clear_files();
      req.set_full_report_start(false);
    }
  });
  if (!st.ok()) return st;
  return meta_->ReportBlocks(req);
}

absl::Status NodeAgent::SendChanges() {
  std::vector<BlockAddr> added, removed;
  cache_->TakeChanges(&added, &removed);
  size_t a = 0, r = 0;
  while (a < added.size() || r < removed.size()) {
    rpc::ReportBlocksRequest req;
    req.set_node_id(options_.node_id);
    for (; a < added.size() && req.added_size() < static_cast<int>(kReportPage); a++) {
      *req.add_added() = ToProto(added[a]);
    }
    for (; r < removed.size() && req.removed_size() < static_cast<int>(kReportPage); r++) {
      *req.add_removed() = ToProto(removed[r]);
    }
    absl::Status st = meta_->ReportBlocks(req);
    if (!st.ok()) return st;  // the next registration's full report covers what is lost here
  }
  return absl::OkStatus();
}

void NodeAgent::Background() {
  auto last_heartbeat = std::chrono::steady_clock::time_point{};
  bool meta_down_logged = false;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    absl::Status st = absl::OkStatus();
    if (!registered_) {
      st = Register();
      registered_ = st.ok();
    } else {
      st = SendChanges();
      if (st.ok() && std::chrono::steady_clock::now() - last_heartbeat >= heartbeat_interval_) {
        auto hb = meta_->Heartbeat(options_.node_id, Stats());
        if (hb.ok()) {
          last_heartbeat = std::chrono::steady_clock::now();
          if (hb->reregister()) registered_ = false;
          read_path_->FlushPendingChecksums();
          prefetch_->Update({hb->prefetches().begin(), hb->prefetches().end()});
        } else {
          st = hb.status();
        }
      }
      if (!st.ok()) registered_ = false;  // re-register (with a full report) when meta is back
    }
    if (!st.ok() && !meta_down_logged) {
      spdlog::warn("node: meta at {}: {}; serving on and retrying", options_.meta_address,
                   std::string(st.message()));
      meta_down_logged = true;
    } else if (st.ok() && meta_down_logged) {
      spdlog::info("node: meta at {} is back", options_.meta_address);
      meta_down_logged = false;
    }
    lock.lock();
    cv_.wait_for(lock, st.ok() ? options_.report_interval : std::chrono::milliseconds(500),
                 [&] { return stopping_; });
  }
}

}  // namespace ember::cachefs
