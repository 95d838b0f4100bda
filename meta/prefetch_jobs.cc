#include "meta/prefetch_jobs.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/units.h"

namespace ember::meta {
namespace {

absl::Status Unknown(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("unknown prefetch '", id, "'"));
}

}  // namespace

PrefetchJobs::PrefetchJobs(MetaStore* store, DatasetCatalog* catalog, NodeRegistry* nodes)
    : store_(store), catalog_(catalog), nodes_(nodes) {}

absl::Status PrefetchJobs::Load() {
  ASSIGN_OR_RETURN(auto stored, store_->ListPrefetches());
  absl::MutexLock lock(&mu_);
  for (auto& j : stored) {
    uint64_t n = 0;
    if (j.id().size() > 3 && absl::SimpleAtoi(j.id().substr(3), &n)) {
      next_id_ = std::max(next_id_, n + 1);
    }
    std::string id = j.id();
    jobs_[id] = std::move(j);
  }
  return absl::OkStatus();
}

void PrefetchJobs::SettleLocked(rpc::PrefetchJob* job, const NodeView& view) {
  if (job->state() != rpc::PrefetchJob::RUNNING) return;
  rpc::PrefetchJob next = *job;
  bool all = true;
  for (auto& n : *next.mutable_nodes()) {
    if (!n.finished() && !view.Alive(n.node_id())) {
      n.set_finished(true);
      n.set_note("node died before finishing");
      n.set_blocks_failed(n.blocks_total() > n.blocks_done() ? n.blocks_total() - n.blocks_done()
                                                             : 0);
    }
    all = all && n.finished();
  }
  if (all) {
    next.set_state(rpc::PrefetchJob::DONE);
    next.set_finished_unix_ms(NowUnixMs());
    absl::Status st = store_->PutPrefetch(next);
    if (!st.ok()) {
      spdlog::warn("meta: prefetch {} is done but cannot be stored ({}); it shows as running",
                   job->id(), std::string(st.message()));
      return;
    }
    spdlog::info("meta: prefetch {} of {} done", job->id(), job->spec().dataset());
  }
  *job = std::move(next);
}

absl::StatusOr<rpc::PrefetchJob> PrefetchJobs::Start(const rpc::PrefetchSpec& in,
                                                     const std::string& request_id) {
  if (!request_id.empty()) {
    const NodeView view = nodes_->View();
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) {
      if (job.request_id() != request_id) continue;
      SettleLocked(&job, view);
      return job;
    }
  }
  ASSIGN_OR_RETURN(auto dv, catalog_->ResolveVersion(in.dataset(), in.version()));
  const auto& [ds, version] = dv;
  // Chosen nodes: named ones must be known and alive.
  const NodeView view = nodes_->View();
  std::vector<std::string> chosen;
  if (in.all_nodes() || in.nodes().empty()) {
    for (size_t i = 0; i < view.members->nodes.size(); i++) {
      if (view.alive[i]) chosen.push_back(view.members->nodes[i].id);
    }
  } else {
    for (const auto& id : in.nodes()) {
      if (view.Find(id) == nullptr)
        return absl::NotFoundError(absl::StrCat("unknown node '", id, "'"));
      if (!view.Alive(id)) {
        return absl::FailedPreconditionError(absl::StrCat("node '", id, "' is dead"));
      }
      chosen.push_back(id);
    }
  }
  std::sort(chosen.begin(), chosen.end());
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  if (chosen.empty()) return absl::FailedPreconditionError("no live nodes to prefetch to");
  const uint32_t replicas =
      in.mode() == rpc::PrefetchSpec::STRIPE ? in.replicas() : static_cast<uint32_t>(chosen.size());
  if (in.mode() == rpc::PrefetchSpec::STRIPE && (replicas == 0 || replicas > chosen.size())) {
    return absl::InvalidArgumentError(absl::StrCat("--replicas ", in.replicas(),
                                                   " must be between 1 and the ", chosen.size(),
                                                   " chosen node(s)"));
  }
  ASSIGN_OR_RETURN(DatasetCatalog::Selection sel,
                   catalog_->SelectPaths(ds, version, {in.paths().begin(), in.paths().end()}));
  // A pin must fit before any work starts.
  if (in.pin_ms() > 0) {
    const uint64_t per_node =
        in.mode() == rpc::PrefetchSpec::FULL
            ? sel.bytes
            : (sel.bytes * replicas + chosen.size() - 1) / chosen.size() + ds.block_size();
    std::map<std::string, rpc::Node> info;
    for (auto& n : nodes_->List()) info[n.id()] = std::move(n);
    for (const auto& id : chosen) {
      const rpc::Node& n = info[id];
      const uint64_t pinned = n.stats().pinned_bytes();
      const uint64_t room = n.capacity_bytes() > pinned ? n.capacity_bytes() - pinned : 0;
      if (per_node > room) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot pin: node '", id, "' would need ", per_node, " bytes pinned but has room for ",
            room, " (capacity ", n.capacity_bytes(), ", already pinned ", pinned, ")"));
      }
    }
  }
  rpc::PrefetchJob job;
  {
    absl::MutexLock lock(&mu_);
    job.set_id(absl::StrCat("pf-", next_id_++));  // an id a failed store burns is never reused
  }
  *job.mutable_spec() = in;
  job.mutable_spec()->set_version(version);
  job.mutable_spec()->clear_nodes();
  for (const auto& id : chosen) job.mutable_spec()->add_nodes(id);
  job.mutable_spec()->set_replicas(replicas);
  job.set_dataset_id(ds.id());
  job.set_state(rpc::PrefetchJob::RUNNING);
  job.set_created_unix_ms(NowUnixMs());
  if (in.pin_ms() > 0) job.set_pin_until_unix_ms(NowUnixMs() + static_cast<int64_t>(in.pin_ms()));
  job.set_dataset_bytes(sel.bytes);
  job.set_dataset_files(sel.files);
  job.set_request_id(request_id);
  for (const auto& id : chosen) job.add_nodes()->set_node_id(id);
  RETURN_IF_ERROR(store_->PutPrefetch(job));
  {
    absl::MutexLock lock(&mu_);
    jobs_[job.id()] = job;
    epoch_++;
  }
  spdlog::info("meta: prefetch {} of {} version {} to {} node(s), {} bytes", job.id(), ds.name(),
               version, chosen.size(), sel.bytes);
  return job;
}

absl::StatusOr<rpc::PrefetchJob> PrefetchJobs::Get(const std::string& id) {
  const NodeView view = nodes_->View();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return Unknown(id);
  SettleLocked(&it->second, view);
  return it->second;
}

std::vector<rpc::PrefetchJob> PrefetchJobs::List() {
  const NodeView view = nodes_->View();
  absl::MutexLock lock(&mu_);
  std::vector<rpc::PrefetchJob> out;
  for (auto& [id, job] : jobs_) {
    SettleLocked(&job, view);
    out.push_back(job);
  }
  return out;
}

absl::StatusOr<rpc::PrefetchJob> PrefetchJobs::Cancel(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return Unknown(id);
  rpc::PrefetchJob next = it->second;
  if (next.state() == rpc::PrefetchJob::RUNNING) {
    next.set_state(rpc::PrefetchJob::CANCELLED);
    next.set_finished_unix_ms(NowUnixMs());
  }
  next.set_pin_until_unix_ms(0);  // a cancelled prefetch holds nothing
  RETURN_IF_ERROR(store_->PutPrefetch(next));
  it->second = next;
  epoch_++;
  return next;
}

absl::StatusOr<uint32_t> PrefetchJobs::Unpin(const std::string& dataset,
                                             const std::string& prefetch_id) {
  if (dataset.empty() && prefetch_id.empty()) {
    return absl::InvalidArgumentError("name a dataset or a prefetch id to unpin");
  }
  if (!dataset.empty()) RETURN_IF_ERROR(catalog_->Get(dataset).status());
  absl::MutexLock lock(&mu_);
  if (!prefetch_id.empty() && !jobs_.count(prefetch_id)) return Unknown(prefetch_id);
  uint32_t n = 0;
  for (auto& [id, job] : jobs_) {
    const bool match = dataset.empty() ? id == prefetch_id : job.spec().dataset() == dataset;
    if (!match || job.pin_until_unix_ms() <= 0) continue;
    rpc::PrefetchJob next = job;
    next.set_pin_until_unix_ms(0);
    RETURN_IF_ERROR(store_->PutPrefetch(next));
    job = std::move(next);
    n++;
    epoch_++;
  }
  return n;
}

absl::Status PrefetchJobs::Report(const std::string& job_id,
                                  const rpc::PrefetchNodeProgress& progress) {
  const NodeView view = nodes_->View();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return Unknown(job_id);
  for (auto& n : *it->second.mutable_nodes()) {
    if (n.node_id() == progress.node_id()) n = progress;
  }
  SettleLocked(&it->second, view);
  return absl::OkStatus();
}

std::vector<rpc::PrefetchJob> PrefetchJobs::ForNode(const std::string& node_id) {
  const int64_t now = NowUnixMs();
  absl::MutexLock lock(&mu_);
  std::vector<rpc::PrefetchJob> out;
  for (const auto& [id, job] : jobs_) {
    bool member = false;
    for (const auto& n : job.spec().nodes()) member |= n == node_id;
    const bool recent = job.finished_unix_ms() == 0 || now - job.finished_unix_ms() < 600'000;
    if (member &&
        (job.state() == rpc::PrefetchJob::RUNNING || job.pin_until_unix_ms() > now || recent)) {
      out.push_back(job);
    }
  }
  return out;
}

uint64_t PrefetchJobs::WaitForChange(uint64_t known_epoch, absl::Time deadline) {
  mu_.AssertNotHeld();
  auto changed = [this, known_epoch]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return epoch_ != known_epoch; };
  mu_.LockWhenWithDeadline(absl::Condition(&changed), deadline);
  const uint64_t epoch = epoch_;
  mu_.Unlock();
  return epoch;
}

std::optional<rpc::PrefetchJob::State> PrefetchJobs::State(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.state();
}

}  // namespace ember::meta
