#include "cachefs/agent_metrics.h"

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cachefs/cache/scrubber.h"
#include "cachefs/namespace.h"
#include "cachefs/repair.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {
// The prefixes of the figures registered here (they point at this agent).
constexpr const char* kPrefixes[] = {
    "ember_cache_",       "ember_read_",      "ember_origin_block_reads", "ember_checksum_failures",
    "ember_peer_fetches", "ember_fuse_opens", "ember_fuse_passthrough",   "ember_manifest_"};
}  // namespace

rpc::NodeStats CollectNodeStats(BlockCache* cache, ReadPath* read_path, KernelFuse* kernel,
                                Scrubber* scrubber, Repairer* repairer, Namespace* ns) {
  rpc::NodeStats s;
  if (ns != nullptr) {
    Namespace::Memory m = ns->GetMemory();
    s.set_manifest_entries(m.entries);
    s.set_manifest_bytes(m.bytes);
  }
  BlockCache::Stats c = cache->GetStats();
  ReadStats r = read_path->GetStats();
  s.set_fuse_binding(kernel != nullptr ? "kernel" : "libfuse");
  if (kernel != nullptr) {
    KernelFuse::Stats k = kernel->GetStats();
    s.set_passthrough(k.passthrough);
    s.set_passthrough_opens(k.passthrough_opens);
    s.set_daemon_opens(k.daemon_opens);
    s.set_passthrough_files_open(k.passthrough_files_open);
    s.set_backing_registrations(k.backing_registrations);
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
  s.set_checksum_failures(c.checksum_failures);
  s.set_peer_fetches(r.peer_fetches);
  s.set_peer_errors(r.peer_errors);
  s.set_pinned_bytes(c.pinned_bytes);
  for (const auto& [ds, b] : c.pinned_bytes_by_dataset)
    (*s.mutable_pinned_bytes_by_dataset())[ds] = b;
  s.set_verifications(c.verifications);
  s.set_foreign_changes(c.foreign_changes);
  for (const auto& event : c.recent_corruptions) s.add_corruptions(event);
  if (repairer != nullptr) s.set_repairs(repairer->repaired());
  if (scrubber != nullptr) {
    const Scrubber::Progress p = scrubber->GetProgress();
    s.set_scrub_rate(p.bytes_per_second);
    s.set_scrub_passes(p.passes);
    s.set_scrub_pass_done(p.pass_done);
    s.set_scrub_pass_total(p.pass_total);
    s.set_scrub_bytes(p.bytes);
    s.set_scrub_last_pass_unix_ms(p.last_pass_unix_ms);
  }
  return s;
}

AgentMetrics::AgentMetrics(std::function<rpc::NodeStats()> stats) : stats_(std::move(stats)) {}

rpc::NodeStats AgentMetrics::Recent() {
  absl::MutexLock lock(&mu_);
  auto now = std::chrono::steady_clock::now();
  if (now - recent_at_ > std::chrono::milliseconds(500)) {
    recent_ = stats_();
    recent_at_ = now;
  }
  return recent_;
}

absl::StatusOr<std::unique_ptr<AgentMetrics>> AgentMetrics::Start(
    const std::string& listen, const HttpAccess& access, std::function<rpc::NodeStats()> stats) {
  std::unique_ptr<AgentMetrics> m(new AgentMetrics(std::move(stats)));
  auto& r = metrics::Global();
  using Get = uint64_t (rpc::NodeStats::*)() const;
  AgentMetrics* self = m.get();
  auto add = [&](const std::string& name, const std::string& help, const std::string& type,
                 const metrics::Labels& labels, Get get) {
    r.SetCallback(name, help, type, labels,
                  [self, get] { return static_cast<double>((self->Recent().*get)()); });
  };
  add("ember_cache_capacity_bytes", "Configured cache capacity.", "gauge", {},
      &rpc::NodeStats::capacity_bytes);
  add("ember_cache_used_bytes", "Bytes of resident blocks.", "gauge", {},
      &rpc::NodeStats::used_bytes);
  add("ember_cache_resident_blocks", "Resident blocks.", "gauge", {},
      &rpc::NodeStats::resident_blocks);
  add("ember_manifest_entries", "Manifest entries held in memory (each version once).", "gauge", {},
      &rpc::NodeStats::manifest_entries);
  add("ember_manifest_memory_bytes", "Bytes of the manifests held in memory.", "gauge", {},
      &rpc::NodeStats::manifest_bytes);
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
  add("ember_cache_corrupt_blocks_total",
      "Cache blocks found with wrong bytes (by a read, a peer request or the scrubber), "
      "quarantined and refilled.",
      "counter", {}, &rpc::NodeStats::checksum_failures);
  add("ember_cache_verifications_total", "Whole blocks checked on the read path.", "counter", {},
      &rpc::NodeStats::verifications);
  add("ember_cache_repairs_total", "Quarantined blocks refilled.", "counter", {},
      &rpc::NodeStats::repairs);
  add("ember_cache_scrub_passes_total", "Full passes of the scrubber over the cache.", "counter",
      {}, &rpc::NodeStats::scrub_passes);
  add("ember_cache_scrub_pass_done_blocks", "Blocks checked in the scrubber's pass under way.",
      "gauge", {}, &rpc::NodeStats::scrub_pass_done);
  add("ember_cache_scrub_pass_total_blocks", "Blocks in the scrubber's pass under way.", "gauge",
      {}, &rpc::NodeStats::scrub_pass_total);
  add("ember_cache_scrub_rate_bytes", "The scrubber's pace (bytes per second; 0: off).", "gauge",
      {}, &rpc::NodeStats::scrub_rate);
  add("ember_peer_fetches_total", "Blocks filled from a peer.", "counter", {},
      &rpc::NodeStats::peer_fetches);
  const char* kOpens = "Files opened through the mount, by how their reads are served.";
  add("ember_fuse_opens_total", kOpens, "counter", {{"mode", "passthrough"}},
      &rpc::NodeStats::passthrough_opens);
  add("ember_fuse_opens_total", kOpens, "counter", {{"mode", "daemon"}},
      &rpc::NodeStats::daemon_opens);
  add("ember_fuse_passthrough_files_open", "Files open now with the kernel reading the cache file.",
      "gauge", {}, &rpc::NodeStats::passthrough_files_open);
  add("ember_fuse_backing_registrations_total",
      "Cache files registered with the kernel as passthrough backing files.", "counter", {},
      &rpc::NodeStats::backing_registrations);
  if (listen.empty()) return m;
  ASSIGN_OR_RETURN(m->http_, HttpServer::Start(listen, "--metrics-listen", {}, access));
  spdlog::info("node: metrics on http://{}:{}/metrics", m->http_->host(), m->http_->port());
  return m;
}

AgentMetrics::~AgentMetrics() {
  for (const char* prefix : kPrefixes) metrics::Global().RemoveCallbacks(prefix);
  http_.reset();
}

}  // namespace ember::cachefs
