#include "meta/job_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/units.h"

namespace ember::meta {
namespace {

void Event(rpc::Job* j, const std::string& what) {
  j->add_events(absl::StrCat(NowUnixMs(), " ", what));
}

absl::Status UnknownJob(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
}

Topology ParseTopology(const std::string& t) {
  return t == "same-switch" ? Topology::kSameSwitch
         : t == "same-rack" ? Topology::kSameRack
                            : Topology::kNone;
}

bool Active(const rpc::Job& j) {
  return j.state() == rpc::Job::RUNNING || j.state() == rpc::Job::WARMING;
}

absl::Status ValidateSpec(const rpc::JobSpec& in) {
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
  if (in.dataset().empty() && in.data_mode() == "required") {
    return absl::InvalidArgumentError("data mode required needs a dataset");
  }
  return absl::OkStatus();
}

}  // namespace

JobService::JobService(MetaStore* store, DatasetCatalog* catalog, NodeRegistry* nodes,
                       LocationIndex* locations, PrefetchJobs* prefetches)
    : store_(store),
      catalog_(catalog),
      nodes_(nodes),
      locations_(locations),
      prefetches_(prefetches) {}

absl::Status JobService::Load() {
  ASSIGN_OR_RETURN(auto stored, store_->ListJobs());
  std::map<std::string, uint32_t> ids;
  for (const auto& j : stored) {
    if (j.spec().dataset().empty()) continue;
    if (auto ds = catalog_->Get(j.spec().dataset()); ds.ok()) ids[ds->name()] = ds->id();
  }
  absl::MutexLock lock(&mu_);
  dataset_ids_ = std::move(ids);
  for (auto& j : stored) {
    uint64_t n = 0;
    if (j.id().size() > 4 && absl::SimpleAtoi(j.id().substr(4), &n)) {
      next_job_ = std::max(next_job_, n + 1);
    }
    if (j.state() == rpc::Job::QUEUED) queue_.Push(j.id());
    if (Active(j)) {
      for (const auto& w : j.workers()) gpus_used_[w.node_id()] += j.spec().gpus_per_worker();
    }
    std::string id = j.id();
    jobs_[id] = std::move(j);
  }
  spdlog::info("meta: loaded {} jobs", jobs_.size());
  return absl::OkStatus();
}

std::vector<double> JobService::FractionsOf(uint32_t dataset_id, uint32_t version,
                                            const NodeView& view) {
  const uint64_t generation = locations_->generation();
  {
    absl::MutexLock lock(&mu_);
    auto it = fractions_.find({dataset_id, version});
    if (it != fractions_.end() && it->second.generation == generation &&
        it->second.members_version == view.members->version) {
      return it->second.by_slot;
    }
  }
  std::vector<double> by_slot(view.members->nodes.size(), 0.0);
  rpc::GetDatasetRequest by_id;
  by_id.set_id(dataset_id);
  auto ds = catalog_->Resolve(by_id);
  auto sizes = catalog_->Sizes(dataset_id, version);
  if (!ds.ok() || !sizes.ok()) return by_slot;  // removed meanwhile: nothing is resident
  LocationIndex::Residency r =
      locations_->Resident(dataset_id, version, **sizes, ds->block_size(), view);
  if (r.total_bytes > 0) {
    for (const auto& [node, nr] : r.by_node) {
      auto slot = view.members->slot.find(node);
      if (slot != view.members->slot.end()) {
        by_slot[slot->second] = static_cast<double>(nr.bytes) / static_cast<double>(r.total_bytes);
      }
    }
  }
  absl::MutexLock lock(&mu_);
  fractions_[{dataset_id, version}] = Fraction{r.generation, view.members->version, by_slot};
  return by_slot;
}

std::vector<SchedNode>& JobService::SnapshotLocked(const NodeView& view) {
  if (sched_version_ != view.members->version) {
    sched_.clear();
    std::map<std::string, int> sw_ids, rack_ids;
    for (const NodeInfo& info : view.members->nodes) {
      SchedNode n;
      n.id = info.id;
      n.sw = info.sw;
      n.rack = info.rack;
      n.sw_id = sw_ids.emplace(n.sw, sw_ids.size()).first->second;
      n.rack_id = rack_ids.emplace(n.rack, rack_ids.size()).first->second;
      n.gpus = info.gpus;
      auto u = gpus_used_.find(info.id);
      n.used = u == gpus_used_.end() ? 0 : u->second;
      n.slot = sched_.size();
      sched_.push_back(std::move(n));
    }
    sched_version_ = view.members->version;
  }
  for (size_t i = 0; i < sched_.size(); i++) sched_[i].alive = view.alive[i];
  return sched_;
}

void JobService::AddUsedLocked(const std::string& node, int64_t gpus) {
  gpus_used_[node] = static_cast<uint32_t>(static_cast<int64_t>(gpus_used_[node]) + gpus);
  for (SchedNode& n : sched_) {
    if (n.id == node) n.used = gpus_used_[node];
  }
}

rpc::Job* JobService::FindLocked(const std::string& ref) {
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

absl::Status JobService::CommitLocked(rpc::Job* j, rpc::Job next) {
  RETURN_IF_ERROR(store_->PutJob(next));
  *j = std::move(next);
  return absl::OkStatus();
}

absl::StatusOr<rpc::Job> JobService::Submit(const rpc::JobSpec& in, const std::string& request_id) {
  if (!request_id.empty()) {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, j] : jobs_) {
      if (j.request_id() == request_id) return j;
    }
  }
  RETURN_IF_ERROR(ValidateSpec(in));
  rpc::Job job;
  *job.mutable_spec() = in;
  uint32_t dataset_id = 0;
  if (!in.dataset().empty()) {
    ASSIGN_OR_RETURN(auto dv, catalog_->ResolveVersion(in.dataset(), in.version()));
    job.mutable_spec()->set_version(dv.second);
    dataset_id = dv.first.id();
  }
  if (job.spec().data_mode().empty()) job.mutable_spec()->set_data_mode("preferred");
  const NodeView view = nodes_->View();
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    if (!in.dataset().empty()) dataset_ids_[in.dataset()] = dataset_id;
    // A gang that cannot fit even the empty cluster would wait forever: refuse it now. Workers
    // each live node could take with all its GPUs free, summed per domain.
    const std::vector<SchedNode>& nodes = SnapshotLocked(view);
    uint32_t live = 0;
    uint64_t total = 0;
    std::map<int, uint64_t> per_switch, per_rack;
    const Topology topo = ParseTopology(in.topology());
    for (const auto& n : nodes) {
      if (!n.alive) continue;
      live += n.gpus;
      const uint64_t k = n.gpus / in.gpus_per_worker();
      total += k;
      if (topo == Topology::kSameSwitch) per_switch[n.sw_id] += k;
      if (topo == Topology::kSameRack) per_rack[n.rack_id] += k;
    }
    uint64_t best = total;
    if (topo != Topology::kNone) {
      best = 0;
      for (const auto& [d, k] : topo == Topology::kSameSwitch ? per_switch : per_rack) {
        best = std::max(best, k);
      }
    }
    if (best < in.workers()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job needs ", in.workers(), " x ", in.gpus_per_worker(), " GPUs",
                       topo == Topology::kNone ? "" : " under one " + in.topology().substr(5),
                       "; the live cluster has ", live, " GPUs and could never fit it"));
    }
    job.set_id(absl::StrCat("job-", next_job_++));
    job.set_state(rpc::Job::QUEUED);
    job.set_submitted_unix_ms(NowUnixMs());
    job.set_request_id(request_id);
    Event(&job, "submitted");
    RETURN_IF_ERROR(store_->PutJob(job));
    id = job.id();
    jobs_[id] = job;
    queue_.Push(id);
  }
  Pass(/*full=*/false);  // place it now if it fits
  absl::MutexLock lock(&mu_);
  return jobs_[id];
}

absl::StatusOr<rpc::Job> JobService::Get(const std::string& ref) {
  absl::MutexLock lock(&mu_);
  rpc::Job* j = FindLocked(ref);
  if (j == nullptr) return UnknownJob(ref);
  return *j;
}

rpc::ListJobsResponse JobService::List() {
  absl::MutexLock lock(&mu_);
  rpc::ListJobsResponse resp;
  for (const auto& [id, j] : jobs_) *resp.add_jobs() = j;
  resp.set_queue_length(static_cast<uint32_t>(queue_.jobs().size()));
  return resp;
}

absl::StatusOr<rpc::Job> JobService::End(const std::string& ref, rpc::Job::State state,
                                         const std::string& request_id) {
  rpc::Job out;
  {
    absl::MutexLock lock(&mu_);
    rpc::Job* j = FindLocked(ref);
    if (j == nullptr) return UnknownJob(ref);
    if (j->state() == rpc::Job::COMPLETED || j->state() == rpc::Job::CANCELLED) {
      if (!request_id.empty() && j->end_request_id() == request_id) return *j;
      return absl::FailedPreconditionError(absl::StrCat("job '", ref, "' has already ended"));
    }
    rpc::Job next = *j;
    next.set_state(state);
    next.set_end_request_id(request_id);
    Event(&next, state == rpc::Job::COMPLETED ? "completed" : "cancelled");
    RETURN_IF_ERROR(CommitLocked(j, std::move(next)));
    for (const auto& w : j->workers()) {
      AddUsedLocked(w.node_id(), -static_cast<int64_t>(j->spec().gpus_per_worker()));
    }
    queue_.Remove(j->id());
    out = *j;
  }
  Pass(/*full=*/false);  // freed GPUs may let queued jobs start
  return out;
}

bool JobService::TryPlaceLocked(rpc::Job* j, const FractionMap& fractions) {
  GangRequest req;
  req.workers = j->spec().workers();
  req.gpus_per_worker = j->spec().gpus_per_worker();
  req.topology = ParseTopology(j->spec().topology());
  const std::vector<double>* fr = nullptr;
  if (!j->spec().dataset().empty()) {
    auto f = fractions.find({dataset_ids_[j->spec().dataset()], j->spec().version()});
    if (f != fractions.end()) fr = f->second;
  }
  auto locality = [&](const SchedNode& n) {
    return fr != nullptr && n.slot < fr->size() ? (*fr)[n.slot] : 0.0;
  };
  std::vector<SchedNode>& nodes = sched_;
  static metrics::Histogram* const placement = metrics::Global().GetHistogram(
      "ember_scheduler_placement_seconds", "Time to place (or fail to place) one gang.");
  std::vector<Placement> placements;
  {
    metrics::Timer timer(placement);
    placements = PlaceGang(req, nodes, locality, 2);
  }
  if (placements.empty()) return false;
  const Placement& best = placements[0];
  rpc::Job next = *j;
  next.clear_workers();
  std::map<std::string, uint32_t> taken;  // GPUs this placement takes per node
  for (size_t i = 0; i < best.nodes.size(); i++) {
    const std::string& id = best.nodes[i];
    taken[id] += req.gpus_per_worker;
    const SchedNode* n = nullptr;
    for (const SchedNode& s : nodes) {
      if (s.id == id) n = &s;
    }
    auto* w = next.add_workers();
    w->set_index(static_cast<uint32_t>(i));
    w->set_node_id(id);
    w->set_locality(locality(*n));
    w->set_switch_label(n->sw);
    w->set_rack(n->rack);
    w->set_free_gpus_after(n->gpus - n->used - taken[id]);
  }
  auto summarize = [](const Placement& p, rpc::CandidateSummary* c) {
    c->set_domain(p.domain);
    for (const auto& n : p.nodes) c->add_nodes(n);
    c->set_locality(p.score.locality);
    c->set_switches(p.score.switches);
    c->set_racks(p.score.racks);
    c->set_leftover_gpus(p.score.leftover_gpus);
  };
  summarize(best, next.mutable_chosen());
  next.clear_runners_up();
  for (size_t i = 1; i < placements.size(); i++) summarize(placements[i], next.add_runners_up());
  next.set_placed_unix_ms(NowUnixMs());
  if (next.spec().data_mode() == "required" && best.score.locality < 0.999) {
    next.set_state(rpc::Job::WARMING);
    Event(&next, absl::StrCat("placed on ", best.domain, " (locality ", best.score.locality,
                              "); warming the dataset there"));
  } else {
    next.set_state(rpc::Job::RUNNING);
    next.set_started_unix_ms(NowUnixMs());
    Event(&next, absl::StrCat("placed on ", best.domain, " (locality ", best.score.locality,
                              "); running"));
  }
  if (absl::Status st = CommitLocked(j, std::move(next)); !st.ok()) {
    spdlog::warn("meta: job {} not placed: {}; trying again", j->id(), std::string(st.message()));
    return false;
  }
  for (const auto& [id, gpus] : taken) AddUsedLocked(id, gpus);
  return true;
}

void JobService::Pass(bool full) {
  const NodeView view = nodes_->View();
  // The fractions this pass may need, computed before the lock is taken.
  std::set<std::pair<uint32_t, uint32_t>> wanted;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, j] : jobs_) {
      if (j.spec().dataset().empty()) continue;
      if (j.state() == rpc::Job::QUEUED || (full && Active(j))) {
        wanted.insert({dataset_ids_[j.spec().dataset()], j.spec().version()});
      }
    }
  }
  std::map<std::pair<uint32_t, uint32_t>, std::vector<double>> computed;
  FractionMap fractions;
  for (const auto& key : wanted) {
    computed[key] = FractionsOf(key.first, key.second, view);
    fractions[key] = &computed[key];
  }
  std::vector<std::string> need_prefetch;
  std::vector<std::pair<std::string, std::string>> check_warm;  // job id, prefetch id
  {
    absl::MutexLock lock(&mu_);
    std::vector<SchedNode>& nodes = SnapshotLocked(view);
    for (auto& [id, j] : jobs_) {
      if (!full) break;
      if (!Active(j)) continue;
      if (j.state() == rpc::Job::WARMING && !j.prefetch_id().empty()) {
        check_warm.emplace_back(id, j.prefetch_id());
      }
      for (int wi = 0; wi < j.workers_size(); wi++) {
        const rpc::WorkerPlacement& w = j.workers(wi);
        auto slot = view.members->slot.find(w.node_id());
        const SchedNode* old = slot == view.members->slot.end() ? nullptr : &nodes[slot->second];
        if (old != nullptr && old->alive) continue;
        // The node died: move this worker to the best live node with room.
        const std::vector<double>* fr = nullptr;
        if (!j.spec().dataset().empty()) {
          auto f = fractions.find({dataset_ids_[j.spec().dataset()], j.spec().version()});
          if (f != fractions.end()) fr = f->second;
        }
        auto locality = [&](const SchedNode& n) {
          return fr != nullptr && n.slot < fr->size() ? (*fr)[n.slot] : 0.0;
        };
        auto target = PlaceOne(j.spec().gpus_per_worker(), nodes, locality, old);
        if (!target) continue;  // no room yet; try again next pass
        const int64_t died =
            old != nullptr ? view.last_heartbeat_unix_ms[old->slot] + view.lease_ms : NowUnixMs();
        const std::string from = w.node_id();
        const uint32_t index = w.index();
        rpc::Job next = j;
        rpc::WorkerPlacement* nw = next.mutable_workers(wi);
        Event(&next, absl::StrCat("worker ", index, " moved from ", from, " (dead) to ", *target,
                                  "; ", NowUnixMs() - died, " ms after the node's lease expired"));
        nw->set_node_id(*target);
        nw->set_locality(locality(nodes[view.members->slot.at(*target)]));
        if (absl::Status st = CommitLocked(&j, std::move(next)); !st.ok()) {
          spdlog::warn("meta: job {} worker not moved: {}", id, std::string(st.message()));
          continue;
        }
        AddUsedLocked(from, -static_cast<int64_t>(j.spec().gpus_per_worker()));
        AddUsedLocked(*target, j.spec().gpus_per_worker());
        spdlog::info("meta: job {} worker {} re-placed from {} to {}", id, index, from, *target);
      }
    }
    // The queue calls back synchronously, inside this scope (mu_ held): the analysis cannot see
    // through the std::function, so it is told.
    queue_.Schedule([&](const std::string& id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      auto it = jobs_.find(id);
      if (it == jobs_.end()) return true;  // gone: drop from the queue
      return TryPlaceLocked(&it->second, fractions);
    });
    // Warming jobs without a prefetch yet: just placed, or one whose start could not be stored.
    for (const auto& [id, j] : jobs_) {
      if (j.state() == rpc::Job::WARMING && j.prefetch_id().empty()) need_prefetch.push_back(id);
    }
  }
  // Outside the lock: start prefetches for required-mode jobs, and start warmed ones.
  for (const auto& id : need_prefetch) {
    rpc::PrefetchSpec spec;
    {
      absl::MutexLock lock(&mu_);
      const rpc::Job& j = jobs_[id];
      spec.set_dataset(j.spec().dataset());
      spec.set_version(j.spec().version());
      std::set<std::string> on;
      for (const auto& w : j.workers()) on.insert(w.node_id());
      for (const auto& n : on) spec.add_nodes(n);
      spec.set_mode(rpc::PrefetchSpec::FULL);
    }
    absl::StatusOr<rpc::PrefetchJob> pj = prefetches_->Start(spec);
    absl::MutexLock lock(&mu_);
    rpc::Job& j = jobs_[id];
    rpc::Job next = j;
    if (pj.ok()) {
      next.set_prefetch_id(pj->id());
      Event(&next, absl::StrCat("prefetch ", pj->id(), " started"));
    } else {
      Event(&next, absl::StrCat("prefetch failed: ", pj.status().message(), "; starting anyway"));
      next.set_state(rpc::Job::RUNNING);
      next.set_started_unix_ms(NowUnixMs());
    }
    if (absl::Status st = CommitLocked(&j, std::move(next)); !st.ok()) {
      spdlog::warn("meta: job {}: {}", id, std::string(st.message()));
    }
  }
  for (const auto& [job_id, pf] : check_warm) {
    std::optional<rpc::PrefetchJob::State> st = prefetches_->State(pf);
    if (!st || *st == rpc::PrefetchJob::RUNNING) continue;
    absl::MutexLock lock(&mu_);
    rpc::Job& j = jobs_[job_id];
    if (j.state() != rpc::Job::WARMING) continue;
    rpc::Job next = j;
    next.set_state(rpc::Job::RUNNING);
    next.set_started_unix_ms(NowUnixMs());
    Event(&next, absl::StrCat("dataset warm (prefetch ", pf, "); running"));
    if (absl::Status s = CommitLocked(&j, std::move(next)); !s.ok()) {
      spdlog::warn("meta: job {}: {}", job_id, std::string(s.message()));
    }
  }
}

std::optional<std::map<std::string, double>> JobService::Fractions(const std::string& dataset) {
  auto ds = catalog_->Get(dataset);
  if (!ds.ok()) return std::nullopt;
  const NodeView view = nodes_->View();
  const std::vector<double> fr = FractionsOf(ds->id(), ds->latest_version(), view);
  std::map<std::string, double> out;
  for (size_t i = 0; i < fr.size() && i < view.members->nodes.size(); i++) {
    if (fr[i] > 0) out[view.members->nodes[i].id] = fr[i];
  }
  return out;
}

size_t JobService::QueueLength() {
  absl::MutexLock lock(&mu_);
  return queue_.jobs().size();
}

std::map<std::string, uint64_t> JobService::CountByState() {
  absl::MutexLock lock(&mu_);
  std::map<std::string, uint64_t> by;
  for (const auto& [id, j] : jobs_) by[rpc::Job::State_Name(j.state())]++;
  return by;
}

}  // namespace ember::meta
