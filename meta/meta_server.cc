#include "meta/meta_server.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <unordered_map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/metrics.h"
#include "common/secret.h"
#include "common/status.h"
#include "meta/extender.h"
#include "meta/manifest.h"
#include "meta/meta.grpc.pb.h"
#include "meta/meta_client.h"
#include "meta/scheduler.h"
#include "meta/status_json.h"
#include "meta/status_page.h"
#include "meta/store.h"
#include "origin/origin.h"

namespace ember::meta {
namespace {

using Clock = std::chrono::steady_clock;
using FileKey = MetaStore::FileKey;

constexpr uint32_t kMaxManifestPage = 10'000;
constexpr int kMaxBatch = 100'000;  // blocks per checksum / locate / report call

// Per-RPC latency (its count is the call rate) for /metrics, looked up once per handler.
#define EMBER_RPC(name)                                                                       \
  static metrics::Histogram* const rpc_histogram = metrics::Global().GetHistogram(            \
      "ember_meta_rpc_seconds", "gRPC calls served by meta, by method.", {{"method", name}}); \
  metrics::Timer rpc_timer(rpc_histogram)

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

BlockAddr FromProto(const rpc::BlockAddr& b) {
  return BlockAddr{b.dataset_id(), b.version(), b.file_id(), b.index()};
}

bool TestBit(const std::string& bitmap, uint64_t i) {
  return i / 8 < bitmap.size() && (static_cast<uint8_t>(bitmap[i / 8]) >> (i % 8)) & 1;
}

void SetBit(std::string* bitmap, uint64_t i, bool on) {
  if (i / 8 >= bitmap->size()) {
    if (!on) return;
    bitmap->resize(i / 8 + 1, '\0');
  }
  uint8_t b = static_cast<uint8_t>((*bitmap)[i / 8]);
  b = on ? (b | (1u << (i % 8))) : (b & ~(1u << (i % 8)));
  (*bitmap)[i / 8] = static_cast<char>(b);
  while (!bitmap->empty() && bitmap->back() == '\0') bitmap->pop_back();
}

// Pulls entries of a stored manifest version in id order (= ComparePaths order), with paths.
class StoredStream {
 public:
  StoredStream(MetaStore* store, uint32_t ds, uint32_t ver) : store_(store), ds_(ds), ver_(ver) {}
  bool Next(std::string* path, rpc::FileEntry* e) {
    if (pos_ == page_.size()) {
      if (done_) return false;
      auto page = store_->ReadManifest(ds_, ver_, after_, 4096);
      if (!page.ok() || page->empty()) {
        done_ = true;
        return false;
      }
      page_ = std::move(*page);
      pos_ = 0;
      after_ = page_.back().file_id();
    }
    *e = page_[pos_++];
    auto parent = dirs_.find(e->parent_id());
    *path = parent == dirs_.end() || parent->second.empty()
                ? e->name()
                : absl::StrCat(parent->second, "/", e->name());
    if (e->type() == rpc::FileEntry::DIR) dirs_[e->file_id()] = *path;
    return true;
  }

 private:
  MetaStore* store_;
  uint32_t ds_, ver_;
  uint64_t after_ = 0;
  std::vector<rpc::FileEntry> page_;
  size_t pos_ = 0;
  bool done_ = false;
  std::unordered_map<uint64_t, std::string> dirs_;
};

}  // namespace

class MetaServiceImpl final : public rpc::Meta::Service {
 public:
  MetaServiceImpl(std::unique_ptr<MetaStore> store, const MetaOptions& options)
      : store_(std::move(store)), options_(options) {}

  // Every RPC starts here: with a cluster token configured, the caller must send it as
  // `authorization: Bearer TOKEN`. Refusals are logged, at most once a second with a count.
  grpc::Status Authorize(grpc::ServerContext* ctx) {
    if (options_.token.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find(kAuthMetadataKey);
    bool ok = false;
    if (it != md.end()) {
      std::string_view got(it->second.data(), it->second.size());
      ok = TokenEqual(got, absl::StrCat(kBearerPrefix, options_.token));
    }
    if (ok) return grpc::Status::OK;
    uint64_t n = ++refused_;
    auto now = Clock::now();
    std::lock_guard lock(refused_log_mu_);
    if (now - refused_logged_at_ >= std::chrono::seconds(1)) {
      refused_logged_at_ = now;
      spdlog::warn("meta: refused a call from {}: {} cluster token ({} refused so far)",
                   ctx->peer(), it == md.end() ? "no" : "wrong", n);
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        it == md.end() ? "meta requires the cluster token (--token-file)"
                                       : "meta refused the cluster token (--token-file)");
  }

  absl::Status Load() {
    ASSIGN_OR_RETURN(std::vector<rpc::Node> nodes, store_->ListNodes());
    Clock::time_point now = Clock::now();
    for (auto& n : nodes) {
      // After a restart every known node gets one lease to check in.
      std::string id = n.id();
      nodes_[id] = NodeEntry{std::move(n), now};
    }
    size_t locations = 0;
    RETURN_IF_ERROR(store_->ForEachLocation(
        [&](const FileKey& key, const std::string& node, const std::string& bitmap) {
          locations_[key][node] = bitmap;
          node_files_[node].insert(key);
          locations++;
        }));
    ASSIGN_OR_RETURN(auto jobs, store_->ListPrefetches());
    for (auto& j : jobs) {
      uint64_t n = 0;
      if (j.id().size() > 3 && absl::SimpleAtoi(j.id().substr(3), &n)) {
        next_prefetch_ = std::max(next_prefetch_, n + 1);
      }
      std::string id = j.id();
      prefetches_[id] = std::move(j);
    }
    ASSIGN_OR_RETURN(auto stored_jobs, store_->ListJobs());
    for (auto& j : stored_jobs) {
      uint64_t n = 0;
      if (j.id().size() > 4 && absl::SimpleAtoi(j.id().substr(4), &n)) {
        next_job_ = std::max(next_job_, n + 1);
      }
      if (j.state() == rpc::Job::QUEUED) queue_.Push(j.id());
      if (j.state() == rpc::Job::RUNNING || j.state() == rpc::Job::WARMING) {
        for (const auto& w : j.workers()) gpus_used_[w.node_id()] += j.spec().gpus_per_worker();
      }
      if (!j.spec().dataset().empty()) {
        auto ds = store_->GetDataset(j.spec().dataset());
        if (ds.ok()) {
          dataset_ids_[ds->name()] = ds->id();
          block_sizes_[ds->id()] = ds->block_size();
        }
      }
      std::string id = j.id();
      jobs_[id] = std::move(j);
    }
    spdlog::info("meta: loaded {} nodes, {} file location records, {} prefetches, {} jobs",
                 nodes_.size(), locations, prefetches_.size(), jobs_.size());
    return absl::OkStatus();
  }

  // ---- datasets ----

  grpc::Status AddDataset(grpc::ServerContext* ctx, const rpc::AddDatasetRequest* req,
                          grpc::ServerWriter<rpc::DatasetProgress>* writer) override {
    EMBER_RPC("AddDataset");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoAdd(*req, writer));
  }

  grpc::Status RefreshDataset(grpc::ServerContext* ctx, const rpc::RefreshDatasetRequest* req,
                              grpc::ServerWriter<rpc::DatasetProgress>* writer) override {
    EMBER_RPC("RefreshDataset");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoRefresh(req->name(), writer));
  }

  grpc::Status ListDatasets(grpc::ServerContext* ctx, const rpc::ListDatasetsRequest*,
                            rpc::ListDatasetsResponse* resp) override {
    EMBER_RPC("ListDatasets");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    auto all = store_->ListDatasets();
    if (!all.ok()) return ToGrpc(all.status());
    for (auto& ds : *all) *resp->add_datasets() = std::move(ds);
    return grpc::Status::OK;
  }

  grpc::Status GetDataset(grpc::ServerContext* ctx, const rpc::GetDatasetRequest* req,
                          rpc::Dataset* resp) override {
    EMBER_RPC("GetDataset");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    auto ds = Resolve(*req);
    if (!ds.ok()) return ToGrpc(ds.status());
    *resp = std::move(*ds);
    return grpc::Status::OK;
  }

  grpc::Status RemoveDataset(grpc::ServerContext* ctx, const rpc::RemoveDatasetRequest* req,
                             rpc::RemoveDatasetResponse*) override {
    EMBER_RPC("RemoveDataset");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoRemove(*req));
  }

  grpc::Status ListManifest(grpc::ServerContext* ctx, const rpc::ListManifestRequest* req,
                            rpc::ListManifestResponse* resp) override {
    EMBER_RPC("ListManifest");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoListManifest(*req, resp));
  }

  // ---- checksums ----

  grpc::Status RecordChecksums(grpc::ServerContext* ctx, const rpc::RecordChecksumsRequest* req,
                               rpc::RecordChecksumsResponse* resp) override {
    EMBER_RPC("RecordChecksums");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoRecordChecksums(*req, resp));
  }

  grpc::Status GetChecksums(grpc::ServerContext* ctx, const rpc::GetChecksumsRequest* req,
                            rpc::GetChecksumsResponse* resp) override {
    EMBER_RPC("GetChecksums");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    if (req->blocks_size() > kMaxBatch) return ToGrpc(TooMany(req->blocks_size()));
    for (const auto& b : req->blocks()) {
      auto sum = store_->GetChecksum(FromProto(b));
      if (!sum.ok()) return ToGrpc(sum.status());
      resp->add_checksums(sum->value_or(0));
      resp->add_present(sum->has_value());
    }
    return grpc::Status::OK;
  }

  // ---- nodes and locations ----

  grpc::Status RegisterNode(grpc::ServerContext* ctx, const rpc::RegisterNodeRequest* req,
                            rpc::RegisterNodeResponse* resp) override {
    EMBER_RPC("RegisterNode");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoRegister(*req, resp));
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const rpc::HeartbeatRequest* req,
                         rpc::HeartbeatResponse* resp) override {
    EMBER_RPC("Heartbeat");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    std::unique_lock lock(state_mu_);
    auto it = nodes_.find(req->node_id());
    if (it == nodes_.end()) {
      resp->set_reregister(true);
      return grpc::Status::OK;
    }
    if (!Alive(it->second)) spdlog::info("meta: node {} is back", req->node_id());
    it->second.last_heartbeat = Clock::now();
    it->second.node.set_last_heartbeat_unix_ms(NowUnixMs());
    *it->second.node.mutable_stats() = req->stats();
    lock.unlock();
    JobsForNode(req->node_id(), resp);
    return grpc::Status::OK;
  }

  // ---- prefetch and locality ----

  grpc::Status StartPrefetch(grpc::ServerContext* ctx, const rpc::PrefetchSpec* req,
                             rpc::PrefetchJob* resp) override {
    EMBER_RPC("StartPrefetch");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoStartPrefetch(*req, resp));
  }

  grpc::Status GetPrefetch(grpc::ServerContext* ctx, const rpc::PrefetchId* req,
                           rpc::PrefetchJob* resp) override {
    EMBER_RPC("GetPrefetch");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    auto alive = AliveNodes();
    std::lock_guard lock(prefetch_mu_);
    auto it = prefetches_.find(req->id());
    if (it == prefetches_.end()) {
      return ToGrpc(absl::NotFoundError(absl::StrCat("unknown prefetch '", req->id(), "'")));
    }
    Settle(&it->second, alive);
    *resp = it->second;
    return grpc::Status::OK;
  }

  grpc::Status ListPrefetches(grpc::ServerContext* ctx, const rpc::ListPrefetchesRequest*,
                              rpc::ListPrefetchesResponse* resp) override {
    EMBER_RPC("ListPrefetches");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    auto alive = AliveNodes();
    std::lock_guard lock(prefetch_mu_);
    for (auto& [id, job] : prefetches_) {
      Settle(&job, alive);
      *resp->add_jobs() = job;
    }
    return grpc::Status::OK;
  }

  grpc::Status CancelPrefetch(grpc::ServerContext* ctx, const rpc::PrefetchId* req,
                              rpc::PrefetchJob* resp) override {
    EMBER_RPC("CancelPrefetch");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    std::lock_guard lock(prefetch_mu_);
    auto it = prefetches_.find(req->id());
    if (it == prefetches_.end()) {
      return ToGrpc(absl::NotFoundError(absl::StrCat("unknown prefetch '", req->id(), "'")));
    }
    if (it->second.state() == rpc::PrefetchJob::RUNNING) {
      it->second.set_state(rpc::PrefetchJob::CANCELLED);
      it->second.set_finished_unix_ms(NowUnixMs());
    }
    it->second.set_pin_until_unix_ms(0);  // a cancelled prefetch holds nothing
    (void)store_->PutPrefetch(it->second);
    *resp = it->second;
    return grpc::Status::OK;
  }

  grpc::Status Unpin(grpc::ServerContext* ctx, const rpc::UnpinRequest* req,
                     rpc::UnpinResponse* resp) override {
    EMBER_RPC("Unpin");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    if (req->dataset().empty() && req->prefetch_id().empty()) {
      return ToGrpc(absl::InvalidArgumentError("name a dataset or a prefetch id to unpin"));
    }
    if (!req->dataset().empty()) {
      auto ds = store_->GetDataset(req->dataset());
      if (!ds.ok()) return ToGrpc(ds.status());
    }
    std::lock_guard lock(prefetch_mu_);
    uint32_t n = 0;
    for (auto& [id, job] : prefetches_) {
      bool match = req->dataset().empty() ? id == req->prefetch_id()
                                          : job.spec().dataset() == req->dataset();
      if (match && job.pin_until_unix_ms() > 0) {
        job.set_pin_until_unix_ms(0);
        (void)store_->PutPrefetch(job);
        n++;
      }
    }
    if (!req->prefetch_id().empty() && !prefetches_.count(req->prefetch_id())) {
      return ToGrpc(
          absl::NotFoundError(absl::StrCat("unknown prefetch '", req->prefetch_id(), "'")));
    }
    resp->set_unpinned(n);
    return grpc::Status::OK;
  }

  grpc::Status ReportPrefetch(grpc::ServerContext* ctx, const rpc::ReportPrefetchRequest* req,
                              rpc::ReportPrefetchResponse*) override {
    EMBER_RPC("ReportPrefetch");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    auto alive = AliveNodes();
    std::lock_guard lock(prefetch_mu_);
    auto it = prefetches_.find(req->job_id());
    if (it == prefetches_.end()) {
      return ToGrpc(absl::NotFoundError(absl::StrCat("unknown prefetch '", req->job_id(), "'")));
    }
    for (auto& n : *it->second.mutable_nodes()) {
      if (n.node_id() == req->progress().node_id()) n = req->progress();
    }
    Settle(&it->second, alive);
    return grpc::Status::OK;
  }

  grpc::Status Locality(grpc::ServerContext* ctx, const rpc::LocalityRequest* req,
                        rpc::LocalityResponse* resp) override {
    EMBER_RPC("Locality");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoLocality(*req, resp));
  }

  // ---- scheduler ----

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const rpc::JobSpec* req,
                         rpc::Job* resp) override {
    EMBER_RPC("SubmitJob");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoSubmit(*req, resp));
  }

  grpc::Status GetJob(grpc::ServerContext* ctx, const rpc::JobRef* req, rpc::Job* resp) override {
    EMBER_RPC("GetJob");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    std::lock_guard lock(jobs_mu_);
    auto* j = FindJob(req->id());
    if (j == nullptr) return ToGrpc(UnknownJob(req->id()));
    *resp = *j;
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext* ctx, const rpc::ListJobsRequest*,
                        rpc::ListJobsResponse* resp) override {
    EMBER_RPC("ListJobs");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    std::lock_guard lock(jobs_mu_);
    for (const auto& [id, j] : jobs_) *resp->add_jobs() = j;
    resp->set_queue_length(static_cast<uint32_t>(queue_.jobs().size()));
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext* ctx, const rpc::JobRef* req,
                         rpc::Job* resp) override {
    EMBER_RPC("CancelJob");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(EndJob(req->id(), rpc::Job::CANCELLED, resp));
  }

  grpc::Status CompleteJob(grpc::ServerContext* ctx, const rpc::JobRef* req,
                           rpc::Job* resp) override {
    EMBER_RPC("CompleteJob");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(EndJob(req->id(), rpc::Job::COMPLETED, resp));
  }

  // The kube-scheduler extender's view of Ember.
  // ---- status page (/api/status) ----

  // Cluster totals every 5 s for the page's "last minutes" charts (10 minutes kept).
  void SampleHistory() {
    auto now = Clock::now();
    if (now - last_sample_ < std::chrono::seconds(5)) return;
    last_sample_ = now;
    uint64_t hits = 0, misses = 0, cache = 0, peers = 0, origin = 0;
    {
      std::lock_guard lock(state_mu_);
      for (const auto& [id, e] : nodes_) {
        const auto& st = e.node.stats();
        hits += st.hits();
        misses += st.misses();
        cache += st.bytes_from_cache();
        peers += st.bytes_from_peers();
        origin += st.bytes_from_origin();
      }
    }
    nlohmann::json t = {{"t_ms", NowUnixMs()},       {"hits", hits},
                        {"misses", misses},          {"bytes_from_cache", cache},
                        {"bytes_from_peers", peers}, {"bytes_from_origin", origin}};
    std::lock_guard lock(history_mu_);
    history_.push_back(std::move(t));
    while (history_.size() > 120) history_.pop_front();
  }

  std::string StatusJson() {
    nlohmann::json nodes = nlohmann::json::array();
    {
      rpc::ListNodesResponse all;
      (void)ListNodesLocked(&all);
      for (const auto& n : all.nodes()) nodes.push_back(NodeJson(n));
    }
    nlohmann::json datasets = nlohmann::json::array();
    if (auto all = store_->ListDatasets(); all.ok()) {
      for (const auto& ds : *all) {
        rpc::LocalityRequest req;
        req.set_dataset(ds.name());
        rpc::LocalityResponse loc;
        if (!DoLocality(req, &loc).ok()) continue;
        nlohmann::json fr = nlohmann::json::object();
        for (const auto& n : loc.nodes()) fr[n.node_id()] = n.fraction();
        datasets.push_back({{"name", ds.name()},
                            {"version", loc.version()},
                            {"bytes", loc.dataset_bytes()},
                            {"fractions", fr},
                            {"anywhere", loc.dataset_bytes() > 0
                                             ? static_cast<double>(loc.resident_anywhere_bytes()) /
                                                   static_cast<double>(loc.dataset_bytes())
                                             : 0.0}});
      }
    }
    nlohmann::json prefetches = nlohmann::json::array();
    {
      std::lock_guard lock(prefetch_mu_);
      for (const auto& [id, j] : prefetches_) {
        uint64_t done = 0, total = 0;
        for (const auto& n : j.nodes()) {
          done += n.blocks_done();
          total += n.blocks_total();
        }
        prefetches.push_back({{"id", id},
                              {"dataset", j.spec().dataset()},
                              {"state", rpc::PrefetchJob::State_Name(j.state())},
                              {"blocks_done", done},
                              {"blocks_total", total},
                              {"nodes", std::vector<std::string>(j.spec().nodes().begin(),
                                                                 j.spec().nodes().end())}});
      }
    }
    nlohmann::json jobs = nlohmann::json::array();
    {
      std::lock_guard lock(jobs_mu_);
      for (const auto& [id, j] : jobs_) {
        std::vector<std::string> workers;
        for (const auto& w : j.workers())
          workers.push_back(absl::StrCat(w.index(), "@", w.node_id()));
        jobs.push_back({{"name", j.spec().name().empty() ? id : j.spec().name()},
                        {"state", rpc::Job::State_Name(j.state())},
                        {"dataset", j.spec().dataset()},
                        {"workers", workers}});
      }
    }
    nlohmann::json history = nlohmann::json::array();
    {
      std::lock_guard lock(history_mu_);
      for (const auto& h : history_) history.push_back(h);
    }
    return nlohmann::json{{"meta", options_.listen},  {"nodes", nodes}, {"datasets", datasets},
                          {"prefetches", prefetches}, {"jobs", jobs},   {"history", history}}
        .dump();
  }

  ExtenderContext Extender() {
    ExtenderContext c;
    c.fractions = [this](const std::string& name) -> std::optional<std::map<std::string, double>> {
      auto ds = store_->GetDataset(name);
      if (!ds.ok()) return std::nullopt;
      std::lock_guard lock(state_mu_);
      block_sizes_[ds->id()] = ds->block_size();
      const std::vector<double>& fr = Fractions(ds->id(), ds->latest_version());
      std::map<std::string, double> out;
      for (const auto& n : sched_) {
        if (n.slot < fr.size() && fr[n.slot] > 0) out[n.id] = fr[n.slot];
      }
      return out;
    };
    c.known = [this](const std::string& node) {
      std::lock_guard lock(state_mu_);
      return nodes_.count(node) > 0;
    };
    return c;
  }

  // Recovery, warm-up checks and the queue, every 200 ms until Stop().
  // Meta's own figures for /metrics, read at scrape time.
  void RegisterMetrics() {
    auto& r = metrics::Global();
    // Families that only count events: declared now so they show (as 0) before the first one.
    r.GetCounter("ember_meta_lease_expiries_total",
                 "Nodes declared dead because their lease ran out.");
    r.GetHistogram("ember_scheduler_placement_seconds",
                   "Time to place (or fail to place) one gang.");
    r.SetCollector("ember_meta_nodes", "Registered nodes by lease state.", "gauge", [this] {
      std::lock_guard lock(state_mu_);
      double alive = 0, dead = 0;
      for (const auto& [id, e] : nodes_) (Alive(e) ? alive : dead) += 1;
      return metrics::Registry::Samples{{{{"state", "alive"}}, alive}, {{{"state", "dead"}}, dead}};
    });
    r.SetCallback("ember_meta_datasets", "Datasets.", "gauge", {}, [this] {
      auto all = store_->ListDatasets();
      return all.ok() ? static_cast<double>(all->size()) : 0.0;
    });
    r.SetCallback("ember_scheduler_queue_length", "Jobs waiting for GPUs.", "gauge", {}, [this] {
      std::lock_guard lock(jobs_mu_);
      return static_cast<double>(queue_.jobs().size());
    });
    r.SetCollector("ember_scheduler_jobs", "Jobs by state.", "gauge", [this] {
      std::lock_guard lock(jobs_mu_);
      std::map<std::string, double> by;
      for (const auto& [id, j] : jobs_) by[rpc::Job::State_Name(j.state())] += 1;
      metrics::Registry::Samples out;
      for (const auto& [state, n] : by) out.push_back({{{"state", state}}, n});
      return out;
    });
    r.SetCollector("ember_prefetch_done_ratio", "Running prefetches: blocks done / blocks to do.",
                   "gauge", [this] {
                     std::lock_guard lock(prefetch_mu_);
                     metrics::Registry::Samples out;
                     for (const auto& [id, j] : prefetches_) {
                       if (j.state() != rpc::PrefetchJob::RUNNING) continue;
                       double done = 0, total = 0;
                       for (const auto& n : j.nodes()) {
                         done += static_cast<double>(n.blocks_done());
                         total += static_cast<double>(n.blocks_total());
                       }
                       out.push_back({{{"job", id}, {"dataset", j.spec().dataset()}},
                                      total > 0 ? done / total : 0.0});
                     }
                     return out;
                   });
  }

  // Counts nodes whose lease ran out since the last pass (and logs each once).
  void SweepLeases() {
    static metrics::Counter* const expiries = metrics::Global().GetCounter(
        "ember_meta_lease_expiries_total", "Nodes declared dead because their lease ran out.");
    std::lock_guard lock(state_mu_);
    for (const auto& [id, e] : nodes_) {
      bool alive = Alive(e);
      auto [it, fresh] = was_alive_.emplace(id, alive);
      if (!fresh && it->second && !alive) {
        expiries->Inc();
        spdlog::warn("meta: node {} missed its lease; its blocks are hidden until it returns", id);
      }
      it->second = alive;
    }
  }

  void StartSchedulerLoop() {
    RegisterMetrics();
    loop_ = std::thread([this] {
      std::unique_lock lock(loop_mu_);
      while (!loop_stop_) {
        loop_cv_.wait_for(lock, std::chrono::milliseconds(200));
        if (loop_stop_) break;
        lock.unlock();
        SweepLeases();
        SampleHistory();
        SchedulePass();
        lock.lock();
      }
    });
  }

  void StopSchedulerLoop() {
    for (const char* prefix : {"ember_meta_", "ember_scheduler_", "ember_prefetch_"}) {
      metrics::Global().RemoveCallbacks(prefix);  // they point at this service
    }
    {
      std::lock_guard lock(loop_mu_);
      loop_stop_ = true;
    }
    loop_cv_.notify_all();
    if (loop_.joinable()) loop_.join();
  }

  grpc::Status ListNodes(grpc::ServerContext* ctx, const rpc::ListNodesRequest*,
                         rpc::ListNodesResponse* resp) override {
    EMBER_RPC("ListNodes");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ListNodesLocked(resp);
  }

  // Takes state_mu_.
  grpc::Status ListNodesLocked(rpc::ListNodesResponse* resp) {
    std::lock_guard lock(state_mu_);
    for (auto& [id, entry] : nodes_) {
      rpc::Node* n = resp->add_nodes();
      *n = entry.node;
      n->set_state(Alive(entry) ? rpc::Node::ALIVE : rpc::Node::DEAD);
    }
    return grpc::Status::OK;
  }

  grpc::Status ReportBlocks(grpc::ServerContext* ctx, const rpc::ReportBlocksRequest* req,
                            rpc::ReportBlocksResponse*) override {
    EMBER_RPC("ReportBlocks");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    return ToGrpc(DoReport(*req));
  }

  grpc::Status Locate(grpc::ServerContext* ctx, const rpc::LocateRequest* req,
                      rpc::LocateResponse* resp) override {
    EMBER_RPC("Locate");
    if (auto denied = Authorize(ctx); !denied.ok()) return denied;
    if (req->blocks_size() > kMaxBatch) return ToGrpc(TooMany(req->blocks_size()));
    {
      std::lock_guard lock(state_mu_);
      std::map<std::pair<uint32_t, uint32_t>, bool> unheld;  // per dataset version asked about
      for (const auto& b : req->blocks()) {
        rpc::Holders* h = resp->add_holders();
        auto it = locations_.find(FileKey{b.dataset_id(), b.version(), b.file_id()});
        if (it == locations_.end() || it->second.empty()) {
          auto key = std::make_pair(b.dataset_id(), b.version());
          auto u = unheld.find(key);
          if (u == unheld.end()) {
            u = unheld.emplace(key, !HeldByOthersLocked(key.first, key.second, req->node_id()))
                    .first;
          }
          h->set_dataset_unheld(u->second);
          continue;
        }
        for (const auto& [node_id, bitmap] : it->second) {
          if (!TestBit(bitmap, b.index())) continue;
          auto n = nodes_.find(node_id);
          if (n == nodes_.end() || !Alive(n->second)) continue;
          const auto& labels = n->second.node.labels();
          h->add_node_ids(node_id);
          h->add_addresses(n->second.node.address());
          h->add_switches(labels.count("switch") ? labels.at("switch") : "");
          h->add_racks(labels.count("rack") ? labels.at("rack") : "");
        }
      }
    }
    // Checksums let the caller verify what a peer sends, or what it reads from the origin
    // when no peer holds the block any more.
    for (int i = 0; i < req->blocks_size(); i++) {
      rpc::Holders* h = resp->mutable_holders(i);
      auto sum = store_->GetChecksum(FromProto(req->blocks(i)));
      if (sum.ok() && sum->has_value()) {
        h->set_has_checksum(true);
        h->set_checksum(**sum);
      }
    }
    return grpc::Status::OK;
  }

 private:
  struct NodeEntry {
    rpc::Node node;
    Clock::time_point last_heartbeat;
  };

  static absl::Status TooMany(int n) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", n, " blocks is over the limit of ", kMaxBatch));
  }

  bool Alive(const NodeEntry& e) const { return Clock::now() - e.last_heartbeat <= options_.lease; }

  // ---- bounds of block addresses callers send ----
  // A block address must name an existing dataset version, a file id of it, and an index below
  // the version's block count. This keeps bad or hostile input from writing checksums for blocks
  // that cannot exist or from growing a location bitmap without bound.
  struct VersionBounds {
    uint64_t max_file_id = 0;
    uint64_t max_blocks = 0;  // ceil(version bytes / block size): no file can have more
  };

  absl::Status CheckBlock(const rpc::BlockAddr& b) {
    auto bounds = BoundsOf(b.dataset_id(), b.version());
    if (!bounds.ok()) return bounds.status();
    if (b.file_id() == 0 || b.file_id() > bounds->max_file_id) {
      return absl::InvalidArgumentError(absl::StrCat("block ", b.dataset_id(), "/", b.version(),
                                                     "/", b.file_id(), "/", b.index(),
                                                     ": no such file id"));
    }
    if (b.index() >= bounds->max_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("block ", b.dataset_id(), "/", b.version(),
                                                     "/", b.file_id(), "/", b.index(),
                                                     ": index beyond the dataset's size"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<VersionBounds> BoundsOf(uint32_t dataset_id, uint32_t version) {
    std::lock_guard lock(bounds_mu_);
    for (int attempt = 0; attempt < 2; attempt++) {
      auto it = bounds_.find({dataset_id, version});
      if (it != bounds_.end()) return it->second;
      if (attempt == 1) break;
      // Unknown here: datasets may have changed since the last build.
      ASSIGN_OR_RETURN(auto all, store_->ListDatasets());
      bounds_.clear();
      for (const auto& ds : all) {
        for (const auto& v : ds.versions()) {
          uint64_t bs = std::max<uint64_t>(ds.block_size(), 1);
          bounds_[{ds.id(), v.version()}] = {v.max_file_id(),
                                             std::max<uint64_t>(1, (v.bytes() + bs - 1) / bs)};
        }
      }
    }
    return absl::NotFoundError(absl::StrCat("no dataset version ", dataset_id, "/", version,
                                            " (removed, or never added)"));
  }

  void InvalidateBounds() {
    std::lock_guard lock(bounds_mu_);
    bounds_.clear();
  }

  absl::StatusOr<rpc::Dataset> Resolve(const rpc::GetDatasetRequest& req) {
    if (!req.name().empty()) return store_->GetDataset(req.name());
    ASSIGN_OR_RETURN(auto all, store_->ListDatasets());
    for (auto& ds : all) {
      if (ds.id() == req.id()) return ds;
    }
    return absl::NotFoundError(absl::StrCat("unknown dataset id ", req.id()));
  }

  // Scans `origin` into (dataset_id, version), streaming progress. Returns the version info.
  absl::StatusOr<rpc::VersionInfo> ScanVersion(const std::string& origin, uint32_t dataset_id,
                                               uint32_t version,
                                               grpc::ServerWriter<rpc::DatasetProgress>* writer) {
    MetaStore::ManifestWriter mw(store_.get(), dataset_id, version);
    auto sink = [&](const rpc::FileEntry& e, std::string_view) { return mw.Add(e); };
    auto progress = [&](const ScanStats& s) {
      rpc::DatasetProgress p;
      p.set_entries_scanned(s.entries);
      p.set_bytes_scanned(s.bytes);
      writer->Write(p);
    };
    absl::StatusOr<ScanStats> stats = ScanOrigin(origin, sink, progress);
    absl::Status fin = stats.ok() ? mw.Finish() : stats.status();
    if (!fin.ok()) {
      (void)store_->DeleteVersionData(dataset_id, version);
      return fin;
    }
    rpc::VersionInfo v;
    v.set_version(version);
    v.set_files(stats->files);
    v.set_dirs(stats->dirs);
    v.set_symlinks(stats->symlinks);
    v.set_bytes(stats->bytes);
    v.set_fingerprint(stats->fingerprint);
    v.set_created_unix_ms(NowUnixMs());
    v.set_max_file_id(stats->max_file_id);
    v.set_skipped(stats->skipped);
    return v;
  }

  absl::Status DoAdd(const rpc::AddDatasetRequest& req,
                     grpc::ServerWriter<rpc::DatasetProgress>* writer) {
    RETURN_IF_ERROR(ValidateDatasetName(req.name()));
    // Object stores: larger default blocks (fewer, larger ranged GETs; requests are what they
    // charge and what costs their servers CPU). See docs/benchmarks.md, "Remote origins".
    uint64_t block_size = req.block_size() != 0                   ? req.block_size()
                          : origin::IsRemoteOrigin(req.origin()) ? 4 * kDefaultBlockSize
                                                                  : kDefaultBlockSize;
    RETURN_IF_ERROR(ValidateBlockSize(block_size));
    ASSIGN_OR_RETURN(std::string origin, origin::NormalizeOrigin(req.origin()));
    std::lock_guard lock(datasets_mu_);
    auto existing = store_->GetDataset(req.name());
    if (existing.ok()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "dataset '", req.name(), "' already exists (origin ", existing->origin(), ")"));
    }
    if (!absl::IsNotFound(existing.status())) return existing.status();
    ASSIGN_OR_RETURN(uint32_t id, store_->AllocateDatasetId());
    ASSIGN_OR_RETURN(rpc::VersionInfo v, ScanVersion(origin, id, 1, writer));
    rpc::Dataset ds;
    ds.set_name(req.name());
    ds.set_id(id);
    ds.set_origin(origin);
    ds.set_block_size(block_size);
    ds.set_latest_version(1);
    ds.set_created_unix_ms(NowUnixMs());
    *ds.add_versions() = v;
    RETURN_IF_ERROR(store_->PutDataset(ds));
    spdlog::info("meta: added dataset {} (id {}) from {}: {} files, {} bytes", ds.name(), id,
                 origin, v.files(), v.bytes());
    rpc::DatasetProgress done;
    done.set_done(true);
    done.set_changed(true);
    done.set_entries_scanned(v.files() + v.dirs() + v.symlinks());
    done.set_bytes_scanned(v.bytes());
    done.set_added(done.entries_scanned());
    *done.mutable_dataset() = ds;
    writer->Write(done);
    return absl::OkStatus();
  }

  absl::Status DoRefresh(const std::string& name,
                         grpc::ServerWriter<rpc::DatasetProgress>* writer) {
    std::lock_guard lock(datasets_mu_);
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(name));
    RETURN_IF_ERROR(origin::NormalizeOrigin(ds.origin()).status());
    uint32_t latest = ds.latest_version();
    uint32_t next = latest + 1;
    ASSIGN_OR_RETURN(rpc::VersionInfo v, ScanVersion(ds.origin(), ds.id(), next, writer));
    const rpc::VersionInfo* prev = nullptr;
    for (const auto& pv : ds.versions()) {
      if (pv.version() == latest) prev = &pv;
    }
    rpc::DatasetProgress done;
    done.set_done(true);
    done.set_entries_scanned(v.files() + v.dirs() + v.symlinks());
    done.set_bytes_scanned(v.bytes());
    if (prev != nullptr && prev->fingerprint() == v.fingerprint() &&
        prev->max_file_id() == v.max_file_id()) {
      RETURN_IF_ERROR(store_->DeleteVersionData(ds.id(), next));
      done.set_changed(false);
    } else {
      StoredStream old_s(store_.get(), ds.id(), latest), new_s(store_.get(), ds.id(), next);
      DiffCounts d =
          DiffManifests([&](std::string* p, rpc::FileEntry* e) { return old_s.Next(p, e); },
                        [&](std::string* p, rpc::FileEntry* e) { return new_s.Next(p, e); });
      ds.set_latest_version(next);
      *ds.add_versions() = v;
      RETURN_IF_ERROR(store_->PutDataset(ds));
      done.set_changed(true);
      done.set_added(d.added);
      done.set_removed(d.removed);
      done.set_modified(d.modified);
      spdlog::info("meta: dataset {} version {}: +{} -{} ~{}", name, next, d.added, d.removed,
                   d.modified);
    }
    *done.mutable_dataset() = ds;
    writer->Write(done);
    return absl::OkStatus();
  }

  absl::Status DoRemove(const rpc::RemoveDatasetRequest& req) {
    std::lock_guard lock(datasets_mu_);
    InvalidateBounds();
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(req.name()));
    if (req.version() == 0) {
      RETURN_IF_ERROR(store_->DeleteDataset(ds));
      DropLocations(ds.id(), 0);
      spdlog::info("meta: removed dataset {}", ds.name());
      return absl::OkStatus();
    }
    if (req.version() == ds.latest_version()) {
      return absl::FailedPreconditionError(absl::StrCat("version ", req.version(),
                                                        " is the latest of '", ds.name(),
                                                        "'; remove the whole dataset instead"));
    }
    rpc::Dataset updated = ds;
    updated.clear_versions();
    bool found = false;
    for (const auto& v : ds.versions()) {
      if (v.version() == req.version()) {
        found = true;
      } else {
        *updated.add_versions() = v;
      }
    }
    if (!found) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", ds.name(), "' has no version ", req.version()));
    }
    RETURN_IF_ERROR(store_->PutDataset(updated));
    RETURN_IF_ERROR(store_->DeleteVersionData(ds.id(), req.version()));
    DropLocations(ds.id(), req.version());
    return absl::OkStatus();
  }

  // Whether a live node other than `self` holds any block of the dataset version: a lookup in
  // each node's ordered file set, O(nodes * log files).
  bool HeldByOthersLocked(uint32_t ds, uint32_t version, const std::string& self) {
    for (const auto& [node, files] : node_files_) {
      if (node == self || files.empty()) continue;
      auto n = nodes_.find(node);
      if (n == nodes_.end() || !Alive(n->second)) continue;
      auto f = files.lower_bound(FileKey{ds, version, 0});
      if (f != files.end() && f->dataset_id == ds && f->version == version) return true;
    }
    return false;
  }

  // Forgets in-memory locations of a dataset (version 0 = all versions).
  void DropLocations(uint32_t ds, uint32_t version) {
    std::lock_guard lock(state_mu_);
    location_generation_++;
    for (auto it = locations_.begin(); it != locations_.end();) {
      if (it->first.dataset_id == ds && (version == 0 || it->first.version == version)) {
        for (auto& [node, bitmap] : it->second) node_files_[node].erase(it->first);
        it = locations_.erase(it);
      } else {
        ++it;
      }
    }
  }

  absl::Status DoListManifest(const rpc::ListManifestRequest& req,
                              rpc::ListManifestResponse* resp) {
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(req.name()));
    uint32_t version = req.version() == 0 ? ds.latest_version() : req.version();
    bool found = false;
    for (const auto& v : ds.versions()) found |= v.version() == version;
    if (!found) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", ds.name(), "' has no version ", version));
    }
    uint32_t max =
        req.max_entries() == 0 ? kMaxManifestPage : std::min(req.max_entries(), kMaxManifestPage);
    ASSIGN_OR_RETURN(auto entries,
                     store_->ReadManifest(ds.id(), version, req.after_file_id(), max));
    resp->set_dataset_id(ds.id());
    resp->set_version(version);
    if (entries.size() == max) resp->set_next_after_file_id(entries.back().file_id());
    for (auto& e : entries) *resp->add_entries() = std::move(e);
    return absl::OkStatus();
  }

  absl::Status DoRecordChecksums(const rpc::RecordChecksumsRequest& req,
                                 rpc::RecordChecksumsResponse* resp) {
    if (req.checksums_size() > kMaxBatch) return TooMany(req.checksums_size());
    for (const auto& c : req.checksums()) RETURN_IF_ERROR(CheckBlock(c.block()));
    std::lock_guard lock(checksum_mu_);
    std::vector<std::pair<BlockAddr, uint64_t>> to_write;
    std::map<BlockAddr, uint64_t> in_batch;
    for (const auto& c : req.checksums()) {
      BlockAddr addr = FromProto(c.block());
      std::optional<uint64_t> have;
      if (auto it = in_batch.find(addr); it != in_batch.end()) {
        have = it->second;
      } else {
        ASSIGN_OR_RETURN(have, store_->GetChecksum(addr));
      }
      rpc::BlockChecksum* out = resp->add_recorded();
      *out->mutable_block() = c.block();
      if (!have) {
        to_write.emplace_back(addr, c.checksum());
        in_batch[addr] = c.checksum();
        out->set_checksum(c.checksum());
        resp->add_conflict(false);
      } else {
        out->set_checksum(*have);
        resp->add_conflict(*have != c.checksum());
        if (*have != c.checksum()) {
          spdlog::warn("meta: checksum conflict for block {}/{}/{}/{}: held {:016x}, got {:016x}",
                       addr.dataset_id, addr.version, addr.file_id, addr.index, *have,
                       c.checksum());
        }
      }
    }
    if (!to_write.empty()) RETURN_IF_ERROR(store_->PutChecksums(to_write));
    return absl::OkStatus();
  }

  absl::Status DoRegister(const rpc::RegisterNodeRequest& req, rpc::RegisterNodeResponse* resp) {
    const rpc::Node& in = req.node();
    if (in.id().empty()) return absl::InvalidArgumentError("node id is empty");
    if (in.address().empty()) return absl::InvalidArgumentError("node address is empty");
    rpc::Node n = in;
    n.set_registered_unix_ms(NowUnixMs());
    n.set_last_heartbeat_unix_ms(NowUnixMs());
    n.set_state(rpc::Node::ALIVE);
    RETURN_IF_ERROR(store_->PutNode(n));
    {
      std::lock_guard lock(state_mu_);
      nodes_[n.id()] = NodeEntry{n, Clock::now()};
      nodes_version_++;
    }
    spdlog::info("meta: node {} registered at {} ({} GPUs, capacity {} bytes)", n.id(), n.address(),
                 n.gpus(), n.capacity_bytes());
    uint32_t lease = static_cast<uint32_t>(options_.lease.count());
    resp->set_lease_ms(lease);
    resp->set_heartbeat_interval_ms(std::max<uint32_t>(lease / 3, 50));
    return absl::OkStatus();
  }

  absl::Status DoReport(const rpc::ReportBlocksRequest& req) {
    if (req.added_size() + req.removed_size() > kMaxBatch) {
      return TooMany(req.added_size() + req.removed_size());
    }
    // Blocks of removed dataset versions are skipped (a node may still hold them); addresses
    // beyond a known version's bounds refuse the whole call.
    auto keep = [&](const rpc::BlockAddr& b) -> absl::StatusOr<bool> {
      absl::Status st = CheckBlock(b);
      if (absl::IsNotFound(st)) return false;
      RETURN_IF_ERROR(st);
      return true;
    };
    std::vector<const rpc::BlockAddr*> added, removed;
    std::vector<const rpc::FileBlocks*> files;
    for (const auto& b : req.added()) {
      ASSIGN_OR_RETURN(bool k, keep(b));
      if (k) added.push_back(&b);
    }
    for (const auto& b : req.removed()) {
      ASSIGN_OR_RETURN(bool k, keep(b));
      if (k) removed.push_back(&b);
    }
    for (const auto& f : req.files()) {
      rpc::BlockAddr first;
      first.set_dataset_id(f.dataset_id());
      first.set_version(f.version());
      first.set_file_id(f.file_id());
      ASSIGN_OR_RETURN(bool k, keep(first));
      if (!k) continue;
      ASSIGN_OR_RETURN(VersionBounds b, BoundsOf(f.dataset_id(), f.version()));
      if (f.bitmap().size() > (b.max_blocks + 7) / 8) {
        return absl::InvalidArgumentError(
            absl::StrCat("bitmap of file ", f.dataset_id(), "/", f.version(), "/", f.file_id(),
                         " is ", f.bitmap().size(), " bytes, beyond the dataset's size"));
      }
      files.push_back(&f);
    }
    std::lock_guard lock(state_mu_);
    if (!nodes_.count(req.node_id())) {
      return absl::FailedPreconditionError(
          absl::StrCat("unknown node '", req.node_id(), "'; register first"));
    }
    const std::string& node = req.node_id();
    std::set<FileKey> touched;
    if (req.full_report_start()) {
      for (const FileKey& k : node_files_[node]) {
        auto it = locations_.find(k);
        if (it != locations_.end()) {
          it->second.erase(node);
          if (it->second.empty()) locations_.erase(it);
        }
        RETURN_IF_ERROR(store_->PutLocation(k, node, ""));
      }
      node_files_[node].clear();
    }
    for (const rpc::FileBlocks* fp : files) {
      const rpc::FileBlocks& f = *fp;
      FileKey k{f.dataset_id(), f.version(), f.file_id()};
      std::string bitmap = f.bitmap();
      while (!bitmap.empty() && bitmap.back() == '\0') bitmap.pop_back();
      locations_[k][node] = bitmap;
      touched.insert(k);
    }
    auto apply = [&](const rpc::BlockAddr& b, bool on) {
      FileKey k{b.dataset_id(), b.version(), b.file_id()};
      SetBit(&locations_[k][node], b.index(), on);
      touched.insert(k);
    };
    for (const rpc::BlockAddr* b : added) apply(*b, true);
    for (const rpc::BlockAddr* b : removed) apply(*b, false);
    if (!touched.empty() || req.full_report_start()) location_generation_++;
    for (const FileKey& k : touched) {
      auto it = locations_.find(k);
      std::string bitmap = it->second[node];
      if (bitmap.empty()) {
        it->second.erase(node);
        if (it->second.empty()) locations_.erase(it);
        node_files_[node].erase(k);
      } else {
        node_files_[node].insert(k);
      }
      RETURN_IF_ERROR(store_->PutLocation(k, node, bitmap));
    }
    return absl::OkStatus();
  }

  // Nodes alive now.
  std::set<std::string> AliveNodes() {
    std::lock_guard lock(state_mu_);
    std::set<std::string> out;
    for (const auto& [id, e] : nodes_) {
      if (Alive(e)) out.insert(id);
    }
    return out;
  }

  // REQUIRES: prefetch_mu_ held. Marks nodes that died mid-prefetch and finishes the job when
  // every node is finished or dead.
  void Settle(rpc::PrefetchJob* job, const std::set<std::string>& alive) {
    if (job->state() != rpc::PrefetchJob::RUNNING) return;
    bool all = true;
    for (auto& n : *job->mutable_nodes()) {
      if (!n.finished() && !alive.count(n.node_id())) {
        n.set_finished(true);
        n.set_note("node died before finishing");
        n.set_blocks_failed(n.blocks_total() > n.blocks_done() ? n.blocks_total() - n.blocks_done()
                                                               : 0);
      }
      all = all && n.finished();
    }
    if (all) {
      job->set_state(rpc::PrefetchJob::DONE);
      job->set_finished_unix_ms(NowUnixMs());
      (void)store_->PutPrefetch(*job);
      spdlog::info("meta: prefetch {} of {} done", job->id(), job->spec().dataset());
    }
  }

  // Running jobs a node takes part in, plus recent ones so it can release their pins.
  void JobsForNode(const std::string& node_id, rpc::HeartbeatResponse* resp) {
    std::lock_guard lock(prefetch_mu_);
    int64_t now = NowUnixMs();
    for (const auto& [id, job] : prefetches_) {
      bool member = false;
      for (const auto& n : job.spec().nodes()) member |= n == node_id;
      bool recent = job.finished_unix_ms() == 0 || now - job.finished_unix_ms() < 600'000;
      if (member &&
          (job.state() == rpc::PrefetchJob::RUNNING || job.pin_until_unix_ms() > now || recent)) {
        *resp->add_prefetches() = job;
      }
    }
  }

  struct Selection {
    uint64_t bytes = 0;
    uint64_t files = 0;
  };

  // Sums the files under the selected paths of a version. Returns: NotFound for a path that is
  // not in the manifest, InvalidArgument for '..' or empty components.
  absl::StatusOr<Selection> SelectPaths(const rpc::Dataset& ds, uint32_t version,
                                        const std::vector<std::string>& raw) {
    std::vector<std::string> paths;
    for (std::string p : raw) {
      while (!p.empty() && p.front() == '/') p.erase(0, 1);
      while (!p.empty() && p.back() == '/') p.pop_back();
      if (p.find("..") != std::string::npos || p.find("//") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("path '", p, "' is not a plain path"));
      }
      paths.push_back(p);
    }
    std::vector<bool> seen(paths.size(), false);
    std::unordered_map<uint64_t, std::string> dirs;
    Selection sel;
    absl::Status st = store_->ForEachEntry(ds.id(), version, [&](const rpc::FileEntry& e) {
      auto parent = dirs.find(e.parent_id());
      std::string path = parent == dirs.end() || parent->second.empty()
                             ? e.name()
                             : absl::StrCat(parent->second, "/", e.name());
      if (e.type() == rpc::FileEntry::DIR) dirs[e.file_id()] = path;
      bool in = paths.empty();
      for (size_t i = 0; i < paths.size(); i++) {
        if (path == paths[i]) seen[i] = true;
        if (paths[i].empty() || path == paths[i] ||
            (path.size() > paths[i].size() && path.compare(0, paths[i].size(), paths[i]) == 0 &&
             path[paths[i].size()] == '/')) {
          in = true;
        }
      }
      if (in && e.type() == rpc::FileEntry::FILE) {
        sel.bytes += e.size();
        sel.files++;
      }
      return true;
    });
    RETURN_IF_ERROR(st);
    for (size_t i = 0; i < paths.size(); i++) {
      if (!seen[i] && !paths[i].empty()) {
        return absl::NotFoundError(absl::StrCat("no path '", paths[i], "' in dataset '", ds.name(),
                                                "' version ", version));
      }
    }
    return sel;
  }

  absl::Status DoStartPrefetch(const rpc::PrefetchSpec& in, rpc::PrefetchJob* out) {
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(in.dataset()));
    uint32_t version = in.version() == 0 ? ds.latest_version() : in.version();
    bool has = false;
    for (const auto& v : ds.versions()) has |= v.version() == version;
    if (!has) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", ds.name(), "' has no version ", version));
    }
    // Chosen nodes: named ones must be known and alive.
    std::vector<std::string> nodes;
    std::map<std::string, rpc::Node> info;
    {
      std::lock_guard lock(state_mu_);
      if (in.all_nodes() || in.nodes().empty()) {
        for (const auto& [id, e] : nodes_) {
          if (Alive(e)) nodes.push_back(id);
        }
      } else {
        for (const auto& id : in.nodes()) {
          auto it = nodes_.find(id);
          if (it == nodes_.end())
            return absl::NotFoundError(absl::StrCat("unknown node '", id, "'"));
          if (!Alive(it->second)) {
            return absl::FailedPreconditionError(absl::StrCat("node '", id, "' is dead"));
          }
          nodes.push_back(id);
        }
      }
      for (const auto& id : nodes) info[id] = nodes_[id].node;
    }
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    if (nodes.empty()) return absl::FailedPreconditionError("no live nodes to prefetch to");
    uint32_t replicas = in.mode() == rpc::PrefetchSpec::STRIPE ? in.replicas() : nodes.size();
    if (in.mode() == rpc::PrefetchSpec::STRIPE && (replicas == 0 || replicas > nodes.size())) {
      return absl::InvalidArgumentError(absl::StrCat("--replicas ", in.replicas(),
                                                     " must be between 1 and the ", nodes.size(),
                                                     " chosen node(s)"));
    }
    ASSIGN_OR_RETURN(Selection sel,
                     SelectPaths(ds, version, {in.paths().begin(), in.paths().end()}));
    // A pin must fit before any work starts.
    if (in.pin_ms() > 0) {
      uint64_t per_node =
          in.mode() == rpc::PrefetchSpec::FULL
              ? sel.bytes
              : (sel.bytes * replicas + nodes.size() - 1) / nodes.size() + ds.block_size();
      for (const auto& id : nodes) {
        const rpc::Node& n = info[id];
        uint64_t pinned = n.stats().pinned_bytes();
        uint64_t room = n.capacity_bytes() > pinned ? n.capacity_bytes() - pinned : 0;
        if (per_node > room) {
          return absl::FailedPreconditionError(
              absl::StrCat("cannot pin: node '", id, "' would need ", per_node,
                           " bytes pinned but has room for ", room, " (capacity ",
                           n.capacity_bytes(), ", already pinned ", pinned, ")"));
        }
      }
    }
    rpc::PrefetchJob job;
    {
      std::lock_guard lock(prefetch_mu_);
      job.set_id(absl::StrCat("pf-", next_prefetch_++));
    }
    *job.mutable_spec() = in;
    job.mutable_spec()->set_version(version);
    job.mutable_spec()->clear_nodes();
    for (const auto& id : nodes) job.mutable_spec()->add_nodes(id);
    job.mutable_spec()->set_replicas(replicas);
    job.set_dataset_id(ds.id());
    job.set_state(rpc::PrefetchJob::RUNNING);
    job.set_created_unix_ms(NowUnixMs());
    if (in.pin_ms() > 0) job.set_pin_until_unix_ms(NowUnixMs() + static_cast<int64_t>(in.pin_ms()));
    job.set_dataset_bytes(sel.bytes);
    job.set_dataset_files(sel.files);
    for (const auto& id : nodes) job.add_nodes()->set_node_id(id);
    RETURN_IF_ERROR(store_->PutPrefetch(job));
    {
      std::lock_guard lock(prefetch_mu_);
      prefetches_[job.id()] = job;
    }
    spdlog::info("meta: prefetch {} of {} version {} to {} node(s), {} bytes", job.id(), ds.name(),
                 version, nodes.size(), sel.bytes);
    *out = job;
    return absl::OkStatus();
  }

  // File sizes of a version, by file id, loaded once.
  absl::StatusOr<std::shared_ptr<const std::vector<uint64_t>>> FileSizes(uint32_t ds,
                                                                         uint32_t version) {
    std::lock_guard lock(sizes_mu_);
    auto it = sizes_.find({ds, version});
    if (it != sizes_.end()) return it->second;
    auto sizes = std::make_shared<std::vector<uint64_t>>();
    RETURN_IF_ERROR(store_->ForEachEntry(ds, version, [&](const rpc::FileEntry& e) {
      if (sizes->size() <= e.file_id()) sizes->resize(e.file_id() + 1, 0);
      (*sizes)[e.file_id()] = e.type() == rpc::FileEntry::FILE ? e.size() : 0;
      return true;
    }));
    sizes_[{ds, version}] = sizes;
    return std::shared_ptr<const std::vector<uint64_t>>(sizes);
  }

  absl::Status DoLocality(const rpc::LocalityRequest& req, rpc::LocalityResponse* resp) {
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(req.dataset()));
    uint32_t version = req.version() == 0 ? ds.latest_version() : req.version();
    bool has = false;
    for (const auto& v : ds.versions()) has |= v.version() == version;
    if (!has) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", ds.name(), "' has no version ", version));
    }
    ASSIGN_OR_RETURN(auto sizes, FileSizes(ds.id(), version));
    const uint64_t bs = ds.block_size();
    uint64_t total_bytes = 0, total_blocks = 0;
    for (uint64_t sz : *sizes) {
      total_bytes += sz;
      total_blocks += (sz + bs - 1) / bs;
    }
    resp->set_dataset(ds.name());
    resp->set_version(version);
    resp->set_dataset_bytes(total_bytes);
    resp->set_dataset_blocks(total_blocks);
    auto block_len = [&](uint64_t file, uint64_t index) -> uint64_t {
      uint64_t sz = file < sizes->size() ? (*sizes)[file] : 0;
      if (index * bs >= sz) return 0;
      return std::min(bs, sz - index * bs);
    };
    std::lock_guard lock(state_mu_);
    std::map<std::string, rpc::NodeLocality> per_node;
    for (const auto& [id, e] : nodes_) {
      rpc::NodeLocality& n = per_node[id];
      n.set_node_id(id);
      n.set_address(e.node.address());
      n.set_state(Alive(e) ? rpc::Node::ALIVE : rpc::Node::DEAD);
      for (const auto& [k, v] : e.node.labels()) (*n.mutable_labels())[k] = v;
      auto pin = e.node.stats().pinned_bytes_by_dataset().find(ds.id());
      if (pin != e.node.stats().pinned_bytes_by_dataset().end()) n.set_pinned_bytes(pin->second);
    }
    std::vector<uint64_t> histogram(1, 0);
    uint64_t anywhere_bytes = 0, anywhere_blocks = 0;
    auto begin = locations_.lower_bound(FileKey{ds.id(), version, 0});
    for (auto it = begin;
         it != locations_.end() && it->first.dataset_id == ds.id() && it->first.version == version;
         ++it) {
      const uint64_t file = it->first.file_id;
      std::map<uint64_t, int> holders;  // block -> live holders
      for (const auto& [node, bitmap] : it->second) {
        auto pn = per_node.find(node);
        bool live = pn != per_node.end() && pn->second.state() == rpc::Node::ALIVE;
        for (uint64_t i = 0; i < bitmap.size() * 8; i++) {
          if (!TestBit(bitmap, i) || block_len(file, i) == 0) continue;
          if (pn != per_node.end()) {
            pn->second.set_resident_bytes(pn->second.resident_bytes() + block_len(file, i));
            pn->second.set_resident_blocks(pn->second.resident_blocks() + 1);
          }
          if (live) holders[i]++;
        }
      }
      for (const auto& [i, k] : holders) {
        if (histogram.size() <= static_cast<size_t>(k)) histogram.resize(k + 1, 0);
        histogram[k]++;
        anywhere_blocks++;
        anywhere_bytes += block_len(file, i);
      }
    }
    histogram[0] = total_blocks - anywhere_blocks;
    for (auto& [id, n] : per_node) {
      n.set_fraction(total_bytes == 0 ? 0 : static_cast<double>(n.resident_bytes()) / total_bytes);
      *resp->add_nodes() = n;
    }
    resp->set_resident_anywhere_bytes(anywhere_bytes);
    resp->set_resident_anywhere_blocks(anywhere_blocks);
    for (uint64_t h : histogram) resp->add_replicas_histogram(h);
    return absl::OkStatus();
  }

  static absl::Status UnknownJob(const std::string& id) {
    return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  }

  // REQUIRES: jobs_mu_. By id, or by name (the newest job of that name).
  rpc::Job* FindJob(const std::string& ref) {
    auto it = jobs_.find(ref);
    if (it != jobs_.end()) return &it->second;
    rpc::Job* best = nullptr;
    for (auto& [id, j] : jobs_) {
      if (j.spec().name() == ref &&
          (best == nullptr || j.submitted_unix_ms() >= best->submitted_unix_ms())) {
        best = &j;
      }
    }
    return best;
  }

  static void Event(rpc::Job* j, const std::string& what) {
    j->add_events(absl::StrCat(NowUnixMs(), " ", what));
  }

  // Resident fraction of a dataset version per node slot (see Snapshot), from the location
  // bitmaps; cached until locations or nodes change. REQUIRES: state_mu_.
  const std::vector<double>& Fractions(uint32_t ds, uint32_t version) {
    Snapshot();
    auto& cached = fractions_[{ds, version}];
    if (cached.valid && cached.generation == location_generation_ &&
        cached.nodes_version == sched_version_) {
      return cached.by_slot;
    }
    cached.valid = true;
    cached.generation = location_generation_;
    cached.nodes_version = sched_version_;
    cached.by_slot.assign(sched_.size(), 0.0);
    auto sizes = FileSizes(ds, version);
    uint64_t bs = block_sizes_.count(ds) ? block_sizes_[ds] : kDefaultBlockSize;
    if (!sizes.ok()) return cached.by_slot;
    uint64_t total = 0;
    for (uint64_t sz : **sizes) total += sz;
    if (total == 0) return cached.by_slot;
    std::map<std::string, uint64_t> bytes;
    for (auto it = locations_.lower_bound(FileKey{ds, version, 0});
         it != locations_.end() && it->first.dataset_id == ds && it->first.version == version;
         ++it) {
      uint64_t sz = it->first.file_id < (*sizes)->size() ? (**sizes)[it->first.file_id] : 0;
      for (const auto& [node, bitmap] : it->second) {
        for (uint64_t i = 0; i < bitmap.size() * 8 && i * bs < sz; i++) {
          if (TestBit(bitmap, i)) bytes[node] += std::min(bs, sz - i * bs);
        }
      }
    }
    for (const auto& [node, b] : bytes) {
      auto slot = sched_slot_.find(node);
      if (slot != sched_slot_.end()) {
        cached.by_slot[slot->second] = static_cast<double>(b) / total;
      }
    }
    return cached.by_slot;
  }

  // REQUIRES: state_mu_ and jobs_mu_ (or state_mu_ alone when only reading). The nodes as the
  // scheduler sees them, kept between calls: rebuilt when nodes register, otherwise only their
  // liveness is refreshed. GPUs in use are updated in place through AddUsed().
  std::vector<SchedNode>& Snapshot() {
    if (sched_version_ != nodes_version_) {
      sched_.clear();
      sched_entries_.clear();
      sched_slot_.clear();
      std::map<std::string, int> sw_ids, rack_ids;
      for (const auto& [id, e] : nodes_) {
        const auto& labels = e.node.labels();
        SchedNode n;
        n.id = id;
        n.sw = labels.count("switch") ? labels.at("switch") : "";
        n.rack = labels.count("rack") ? labels.at("rack") : "";
        n.sw_id = sw_ids.emplace(n.sw, sw_ids.size()).first->second;
        n.rack_id = rack_ids.emplace(n.rack, rack_ids.size()).first->second;
        n.gpus = e.node.gpus();
        auto u = gpus_used_.find(id);
        n.used = u == gpus_used_.end() ? 0 : u->second;
        n.slot = sched_.size();
        sched_slot_[id] = n.slot;
        sched_.push_back(std::move(n));
        sched_entries_.push_back(&e);
      }
      sched_version_ = nodes_version_;
    }
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < sched_.size(); i++) {
      sched_[i].alive = now - sched_entries_[i]->last_heartbeat <= options_.lease;
    }
    return sched_;
  }

  // REQUIRES: state_mu_ and jobs_mu_.
  void AddUsed(const std::string& node, int64_t gpus) {
    gpus_used_[node] = static_cast<uint32_t>(static_cast<int64_t>(gpus_used_[node]) + gpus);
    auto slot = sched_slot_.find(node);
    if (slot != sched_slot_.end()) sched_[slot->second].used = gpus_used_[node];
  }

  static Topology ParseTopology(const std::string& t) {
    return t == "same-switch" ? Topology::kSameSwitch
           : t == "same-rack" ? Topology::kSameRack
                              : Topology::kNone;
  }

  absl::Status DoSubmit(const rpc::JobSpec& in, rpc::Job* out) {
    if (in.name().empty()) return absl::InvalidArgumentError("job name is empty");
    if (in.workers() == 0 || in.workers() > 100'000) {
      return absl::InvalidArgumentError("workers must be between 1 and 100000");
    }
    if (in.gpus_per_worker() == 0 || in.gpus_per_worker() > 1024) {
      return absl::InvalidArgumentError("gpus per worker must be between 1 and 1024");
    }
    if (!in.data_mode().empty() && in.data_mode() != "preferred" && in.data_mode() != "required") {
      return absl::InvalidArgumentError(
          absl::StrCat("data mode '", in.data_mode(), "' must be preferred or required"));
    }
    if (!in.topology().empty() && in.topology() != "same-switch" && in.topology() != "same-rack" &&
        in.topology() != "none") {
      return absl::InvalidArgumentError(
          absl::StrCat("topology '", in.topology(), "' must be same-switch, same-rack or none"));
    }
    rpc::Job job;
    *job.mutable_spec() = in;
    if (!in.dataset().empty()) {
      ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(in.dataset()));
      uint32_t v = in.version() == 0 ? ds.latest_version() : in.version();
      job.mutable_spec()->set_version(v);
      std::lock_guard lock(state_mu_);
      block_sizes_[ds.id()] = ds.block_size();
      dataset_ids_[ds.name()] = ds.id();
    } else if (in.data_mode() == "required") {
      return absl::InvalidArgumentError("data mode required needs a dataset");
    }
    if (job.spec().data_mode().empty()) job.mutable_spec()->set_data_mode("preferred");
    {
      // A gang that cannot fit even the empty cluster would wait forever: refuse it now.
      std::lock_guard slock(state_mu_);
      std::lock_guard lock(jobs_mu_);
      // Workers each live node could take with all its GPUs free, summed per domain.
      const std::vector<SchedNode>& nodes = Snapshot();
      uint32_t live = 0;
      uint64_t total = 0;
      std::map<int, uint64_t> per_switch, per_rack;
      Topology topo = ParseTopology(in.topology());
      for (const auto& n : nodes) {
        if (!n.alive) continue;
        live += n.gpus;
        uint64_t k = n.gpus / in.gpus_per_worker();
        total += k;
        if (topo == Topology::kSameSwitch) per_switch[n.sw_id] += k;
        if (topo == Topology::kSameRack) per_rack[n.rack_id] += k;
      }
      uint64_t best = total;
      if (topo != Topology::kNone) {
        best = 0;
        for (const auto& [id, k] : topo == Topology::kSameSwitch ? per_switch : per_rack) {
          best = std::max(best, k);
        }
      }
      if (best < in.workers()) {
        return absl::FailedPreconditionError(
            absl::StrCat("job needs ", in.workers(), " x ", in.gpus_per_worker(), " GPUs",
                         topo == Topology::kNone ? "" : " under one " + in.topology().substr(5),
                         "; the live cluster has ", live, " GPUs and could never fit it"));
      }
    }
    {
      std::lock_guard lock(jobs_mu_);
      job.set_id(absl::StrCat("job-", next_job_++));
      job.set_state(rpc::Job::QUEUED);
      job.set_submitted_unix_ms(NowUnixMs());
      Event(&job, "submitted");
      jobs_[job.id()] = job;
      queue_.Push(job.id());
    }
    SchedulePass(/*full=*/false);  // place it now if it fits
    std::lock_guard lock(jobs_mu_);
    *out = jobs_[job.id()];
    (void)store_->PutJob(*out);
    return absl::OkStatus();
  }

  absl::Status EndJob(const std::string& ref, rpc::Job::State state, rpc::Job* out) {
    {
      std::lock_guard slock(state_mu_);
      std::lock_guard lock(jobs_mu_);
      rpc::Job* j = FindJob(ref);
      if (j == nullptr) return UnknownJob(ref);
      if (j->state() == rpc::Job::COMPLETED || j->state() == rpc::Job::CANCELLED) {
        return absl::FailedPreconditionError(absl::StrCat("job '", ref, "' has already ended"));
      }
      for (const auto& w : j->workers()) {
        AddUsed(w.node_id(), -static_cast<int64_t>(j->spec().gpus_per_worker()));
      }
      queue_.Remove(j->id());
      j->set_state(state);
      Event(j, state == rpc::Job::COMPLETED ? "completed" : "cancelled");
      (void)store_->PutJob(*j);
      *out = *j;
    }
    SchedulePass(/*full=*/false);  // freed GPUs may let queued jobs start
    return absl::OkStatus();
  }

  // REQUIRES: state_mu_ and jobs_mu_. Places a queued job if its gang fits.
  bool TryPlace(rpc::Job* j, std::vector<std::string>* prefetches) {
    GangRequest req;
    req.workers = j->spec().workers();
    req.gpus_per_worker = j->spec().gpus_per_worker();
    req.topology = ParseTopology(j->spec().topology());
    const std::vector<double>* fr = nullptr;
    if (!j->spec().dataset().empty()) {
      fr = &Fractions(dataset_ids_[j->spec().dataset()], j->spec().version());
    }
    auto locality = [&](const SchedNode& n) {
      return fr != nullptr && n.slot < fr->size() ? (*fr)[n.slot] : 0.0;
    };
    std::vector<SchedNode>& nodes = Snapshot();
    static metrics::Histogram* const placement = metrics::Global().GetHistogram(
        "ember_scheduler_placement_seconds", "Time to place (or fail to place) one gang.");
    std::vector<Placement> placements;
    {
      metrics::Timer timer(placement);
      placements = PlaceGang(req, nodes, locality, 2);
    }
    if (placements.empty()) return false;
    const Placement& best = placements[0];
    j->clear_workers();
    for (size_t i = 0; i < best.nodes.size(); i++) {
      const std::string& id = best.nodes[i];
      AddUsed(id, req.gpus_per_worker);
      const SchedNode& n = nodes[sched_slot_[id]];
      auto* w = j->add_workers();
      w->set_index(static_cast<uint32_t>(i));
      w->set_node_id(id);
      w->set_locality(locality(n));
      w->set_switch_label(n.sw);
      w->set_rack(n.rack);
      w->set_free_gpus_after(n.gpus - n.used);
    }
    auto summarize = [](const Placement& p, rpc::CandidateSummary* c) {
      c->set_domain(p.domain);
      for (const auto& n : p.nodes) c->add_nodes(n);
      c->set_locality(p.score.locality);
      c->set_switches(p.score.switches);
      c->set_racks(p.score.racks);
      c->set_leftover_gpus(p.score.leftover_gpus);
    };
    summarize(best, j->mutable_chosen());
    j->clear_runners_up();
    for (size_t i = 1; i < placements.size(); i++) summarize(placements[i], j->add_runners_up());
    j->set_placed_unix_ms(NowUnixMs());
    if (j->spec().data_mode() == "required" && best.score.locality < 0.999) {
      j->set_state(rpc::Job::WARMING);
      Event(j, absl::StrCat("placed on ", best.domain, " (locality ", best.score.locality,
                            "); warming the dataset there"));
      prefetches->push_back(j->id());
    } else {
      j->set_state(rpc::Job::RUNNING);
      j->set_started_unix_ms(NowUnixMs());
      Event(j, absl::StrCat("placed on ", best.domain, " (locality ", best.score.locality,
                            "); running"));
    }
    return true;
  }

  // One scheduler pass: recover workers of dead nodes and start warmed jobs (full passes, from
  // the loop), and place queued jobs.
  void SchedulePass(bool full = true) {
    std::vector<std::string> need_prefetch;
    std::vector<std::pair<std::string, std::string>> check_warm;  // job id, prefetch id
    {
      std::lock_guard slock(state_mu_);
      std::lock_guard lock(jobs_mu_);
      std::vector<SchedNode>& nodes = Snapshot();
      for (auto& [id, j] : jobs_) {
        if (!full) break;
        if (j.state() != rpc::Job::RUNNING && j.state() != rpc::Job::WARMING) continue;
        if (j.state() == rpc::Job::WARMING && !j.prefetch_id().empty()) {
          check_warm.emplace_back(id, j.prefetch_id());
        }
        for (auto& w : *j.mutable_workers()) {
          auto slot = sched_slot_.find(w.node_id());
          const SchedNode* old = slot == sched_slot_.end() ? nullptr : &nodes[slot->second];
          if (old != nullptr && old->alive) continue;
          // The node died: move this worker to the best live node with room.
          const std::vector<double>* fr =
              j.spec().dataset().empty()
                  ? nullptr
                  : &Fractions(dataset_ids_[j.spec().dataset()], j.spec().version());
          auto locality = [&](const SchedNode& n) {
            return fr != nullptr && n.slot < fr->size() ? (*fr)[n.slot] : 0.0;
          };
          auto target = PlaceOne(j.spec().gpus_per_worker(), nodes, locality, old);
          if (!target) continue;  // no room yet; try again next pass
          AddUsed(w.node_id(), -static_cast<int64_t>(j.spec().gpus_per_worker()));
          AddUsed(*target, j.spec().gpus_per_worker());
          int64_t died =
              nodes_.count(w.node_id())
                  ? nodes_[w.node_id()].node.last_heartbeat_unix_ms() + options_.lease.count()
                  : NowUnixMs();
          Event(&j, absl::StrCat("worker ", w.index(), " moved from ", w.node_id(), " (dead) to ",
                                 *target, "; ", NowUnixMs() - died,
                                 " ms after the node's lease expired"));
          spdlog::info("meta: job {} worker {} re-placed from {} to {}", id, w.index(), w.node_id(),
                       *target);
          w.set_node_id(*target);
          w.set_locality(locality(nodes[sched_slot_[*target]]));
          (void)store_->PutJob(j);
        }
      }
      queue_.Schedule([&](const std::string& id) {
        auto it = jobs_.find(id);
        if (it == jobs_.end()) return true;  // gone: drop from the queue
        bool placed = TryPlace(&it->second, &need_prefetch);
        if (placed) (void)store_->PutJob(it->second);
        return placed;
      });
    }
    // Outside the locks: start prefetches for required-mode jobs, and start warmed ones.
    for (const auto& id : need_prefetch) {
      rpc::PrefetchSpec spec;
      {
        std::lock_guard lock(jobs_mu_);
        const rpc::Job& j = jobs_[id];
        spec.set_dataset(j.spec().dataset());
        spec.set_version(j.spec().version());
        std::set<std::string> nodes;
        for (const auto& w : j.workers()) nodes.insert(w.node_id());
        for (const auto& n : nodes) spec.add_nodes(n);
        spec.set_mode(rpc::PrefetchSpec::FULL);
      }
      rpc::PrefetchJob pj;
      absl::Status st = DoStartPrefetch(spec, &pj);
      std::lock_guard lock(jobs_mu_);
      rpc::Job& j = jobs_[id];
      if (st.ok()) {
        j.set_prefetch_id(pj.id());
        Event(&j, absl::StrCat("prefetch ", pj.id(), " started"));
      } else {
        Event(&j, absl::StrCat("prefetch failed: ", st.message(), "; starting anyway"));
        j.set_state(rpc::Job::RUNNING);
        j.set_started_unix_ms(NowUnixMs());
      }
      (void)store_->PutJob(j);
    }
    for (const auto& [job_id, pf] : check_warm) {
      rpc::PrefetchJob::State st;
      {
        std::lock_guard lock(prefetch_mu_);
        auto it = prefetches_.find(pf);
        if (it == prefetches_.end()) continue;
        st = it->second.state();
      }
      if (st == rpc::PrefetchJob::RUNNING) continue;
      std::lock_guard lock(jobs_mu_);
      rpc::Job& j = jobs_[job_id];
      if (j.state() != rpc::Job::WARMING) continue;
      j.set_state(rpc::Job::RUNNING);
      j.set_started_unix_ms(NowUnixMs());
      Event(&j, absl::StrCat("dataset warm (prefetch ", pf, "); running"));
      (void)store_->PutJob(j);
    }
  }

  std::unique_ptr<MetaStore> store_;
  MetaOptions options_;
  std::mutex bounds_mu_;
  std::map<std::pair<uint32_t, uint32_t>, VersionBounds> bounds_;
  std::atomic<uint64_t> refused_{0};
  std::mutex refused_log_mu_;
  Clock::time_point refused_logged_at_{};
  std::mutex jobs_mu_;                    // after state_mu_ when both are held
  std::map<std::string, rpc::Job> jobs_;  // GUARDED_BY(jobs_mu_)
  JobQueue queue_;                        // GUARDED_BY(jobs_mu_)
  uint64_t next_job_ = 1;
  std::map<std::string, uint32_t> gpus_used_;  // GUARDED_BY(state_mu_ + jobs_mu_)
  struct FractionCache {
    uint64_t generation = 0;
    uint64_t nodes_version = 0;
    bool valid = false;
    std::vector<double> by_slot;
  };
  std::vector<SchedNode> sched_;                        // GUARDED_BY(state_mu_), see Snapshot()
  std::vector<const NodeEntry*> sched_entries_;         // GUARDED_BY(state_mu_)
  std::unordered_map<std::string, size_t> sched_slot_;  // GUARDED_BY(state_mu_)
  uint64_t nodes_version_ = 1, sched_version_ = 0;      // GUARDED_BY(state_mu_)
  std::map<std::pair<uint32_t, uint32_t>, FractionCache> fractions_;  // GUARDED_BY(state_mu_)
  std::map<uint32_t, uint64_t> block_sizes_;                          // GUARDED_BY(state_mu_)
  std::map<std::string, uint32_t> dataset_ids_;                       // GUARDED_BY(state_mu_)
  uint64_t location_generation_ = 1;                                  // GUARDED_BY(state_mu_)
  std::thread loop_;
  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool loop_stop_ = false;
  std::mutex prefetch_mu_;                              // after state_mu_ when both are held
  std::map<std::string, rpc::PrefetchJob> prefetches_;  // GUARDED_BY(prefetch_mu_)
  uint64_t next_prefetch_ = 1;
  std::mutex sizes_mu_;
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<const std::vector<uint64_t>>> sizes_;
  std::mutex datasets_mu_;  // serializes dataset add / refresh / remove
  std::mutex checksum_mu_;  // serializes checksum check-and-set
  std::mutex state_mu_;     // guards nodes_, locations_, node_files_, was_alive_
  std::map<std::string, bool> was_alive_;
  std::mutex history_mu_;
  std::deque<nlohmann::json> history_;  // GUARDED_BY(history_mu_)
  Clock::time_point last_sample_{};     // scheduler loop only
  std::map<std::string, NodeEntry> nodes_;
  std::map<FileKey, std::map<std::string, std::string>> locations_;
  std::map<std::string, std::set<FileKey>> node_files_;
};

absl::StatusOr<std::unique_ptr<MetaServer>> MetaServer::Start(const MetaOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir is required");
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create data dir '", options.data_dir, "': ", ec.message()));
  }
  ASSIGN_OR_RETURN(auto store, MetaStore::Open(options.data_dir + "/meta.rocksdb"));
  std::unique_ptr<MetaServer> server(new MetaServer());
  server->service_ = std::make_unique<MetaServiceImpl>(std::move(store), options);
  RETURN_IF_ERROR(server->service_->Load());
  server->service_->StartSchedulerLoop();
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
      return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
    }
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    ASSIGN_OR_RETURN(pair.private_key, ReadSmallFile(options.tls_key_file, "--tls-key"));
    ASSIGN_OR_RETURN(pair.cert_chain, ReadSmallFile(options.tls_cert_file, "--tls-cert"));
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, creds, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(16 << 20);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", options.listen,
                                               "' (in use, or not an address of this host)"));
  }
  spdlog::info("meta: serving on {} (port {}, {}, {}), data in {}", options.listen, server->port_,
               options.tls_cert_file.empty() ? "plaintext" : "TLS",
               options.token.empty() ? "no token" : "token required", options.data_dir);
  if (!options.http_listen.empty()) {
    std::string host;
    int port = 0;
    size_t colon = options.http_listen.rfind(':');
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(options.http_listen.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http '", options.http_listen, "' must be HOST:PORT"));
    }
    host = options.http_listen.substr(0, colon);
    auto* svc = server->service_.get();
    server->http_ = std::make_unique<httplib::Server>();
    auto& http = *server->http_;
    http.Post("/scheduler/filter", [svc](const httplib::Request& req, httplib::Response& res) {
      res.set_content(ExtenderFilter(req.body, svc->Extender()), "application/json");
    });
    http.Post("/scheduler/prioritize", [svc](const httplib::Request& req, httplib::Response& res) {
      res.set_content(ExtenderPrioritize(req.body, svc->Extender()), "application/json");
    });
    http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(StatusPageHtml(), "text/html; charset=utf-8");
    });
    http.Get("/api/status", [svc](const httplib::Request&, httplib::Response& res) {
      res.set_content(svc->StatusJson(), "application/json");
    });
    http.Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics::Global().Render(), "text/plain; version=0.0.4");
    });
    server->http_port_ =
        port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
    if (server->http_port_ <= 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on --http ", options.http_listen));
    }
    server->http_thread_ = std::thread([&http] { http.listen_after_bind(); });
    spdlog::info("meta: HTTP (scheduler extender) on {}:{}", host, server->http_port_);
  }
  return server;
}

MetaServer::~MetaServer() { Shutdown(); }

void MetaServer::Wait() {
  if (server_) server_->Wait();
}

void MetaServer::Shutdown() {
  if (http_) http_->stop();
  if (http_thread_.joinable()) http_thread_.join();
  if (service_) service_->StopSchedulerLoop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace ember::meta
