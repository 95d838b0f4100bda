#include "cachefs/prefetch.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/memory.h"

namespace ember::cachefs {
namespace {

constexpr auto kWatchWait = std::chrono::milliseconds(5000);

bool Under(const std::string& path, const std::string& sel) {
  return sel.empty() || path == sel ||
         (path.size() > sel.size() && path.compare(0, sel.size(), sel) == 0 &&
          path[sel.size()] == '/');
}

}  // namespace

void RateLimiter::Acquire(uint64_t bytes) {
  if (rate_ == 0) return;
  mu_.Lock();
  while (true) {
    auto now = std::chrono::steady_clock::now();
    available_ = std::min<double>(static_cast<double>(rate_),  // at most one second of burst
                                  available_ + std::chrono::duration<double>(now - last_).count() *
                                                   static_cast<double>(rate_));
    last_ = now;
    if (available_ >= static_cast<double>(bytes) ||
        (available_ >= static_cast<double>(rate_) - 1)) {
      available_ -= static_cast<double>(bytes);  // a block larger than a second's worth: debt
      mu_.Unlock();
      return;
    }
    double wait = (static_cast<double>(bytes) - available_) / static_cast<double>(rate_);
    mu_.Unlock();
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait, 0.5)));
    mu_.Lock();
  }
}

PrefetchRunner::PrefetchRunner(const std::string& node_id, Namespace* ns, ReadPath* read_path,
                               BlockCache* cache, meta::MetaClient* meta,
                               std::chrono::milliseconds owner_grace,
                               std::function<void()> report_locations)
    : node_id_(node_id),
      owner_grace_(owner_grace),
      report_locations_(std::move(report_locations)),
      ns_(ns),
      read_path_(read_path),
      cache_(cache),
      meta_(meta) {
  watcher_ = std::thread([this] { Watch(); });
}

void PrefetchRunner::Watch() {
  uint64_t epoch = 0;
  while (true) {
    auto r = meta_->WatchPrefetches(node_id_, epoch, kWatchWait);
    if (r.ok()) {
      epoch = r->epoch();
      Update({r->prefetches().begin(), r->prefetches().end()});
    } else if (absl::IsUnimplemented(r.status())) {
      spdlog::info("prefetch: meta does not offer job watches; jobs come with heartbeats");
      return;
    }
    absl::MutexLock lock(&stop_mu_);
    if (stopping_) return;
    // Meta unreachable (the reporter logs it): try again in a while.
    if (!r.ok()) stop_cv_.WaitWithTimeout(&stop_mu_, absl::Seconds(1));
    if (stopping_) return;
  }
}

PrefetchRunner::~PrefetchRunner() {
  {
    absl::MutexLock lock(&stop_mu_);
    stopping_ = true;
  }
  stop_cv_.SignalAll();
  meta_->CancelWatches();
  watcher_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, r] : jobs_) r->cancel = true;
  for (auto& [id, r] : jobs_) {
    if (r->thread.joinable()) r->thread.join();
  }
}

void PrefetchRunner::Update(const std::vector<rpc::PrefetchJob>& jobs) {
  absl::MutexLock lock(&mu_);
  for (const auto& job : jobs) {
    auto it = jobs_.find(job.id());
    if (it == jobs_.end()) {
      auto r = std::make_unique<Running>();
      r->job = job;
      Running* raw = r.get();
      jobs_[job.id()] = std::move(r);
      if (job.state() == rpc::PrefetchJob::RUNNING) {
        bool finished = false;
        for (const auto& n : job.nodes()) finished |= n.node_id() == node_id_ && n.finished();
        if (!finished) {
          raw->thread = std::thread([this, raw] {
            Run(raw);
            ReleaseFreeMemory();  // the plan and the fills' buffers
          });
        }
      }
      continue;
    }
    Running* r = it->second.get();
    if (job.state() == rpc::PrefetchJob::CANCELLED) r->cancel = true;
    // Released or expired pins: let the blocks go.
    if (r->pinned_until != 0 && job.pin_until_unix_ms() != r->pinned_until) {
      r->job.set_pin_until_unix_ms(job.pin_until_unix_ms());
      if (r->finished) {
        ApplyPin(job, job.pin_until_unix_ms());
        r->pinned_until = job.pin_until_unix_ms();
      }
    }
  }
}

absl::StatusOr<std::shared_ptr<const DatasetView>> PrefetchRunner::Plan(
    const rpc::PrefetchJob& job, std::vector<Block>* mine, std::vector<uint64_t>* files) {
  const auto& spec = job.spec();
  auto view = ns_->ViewByName(absl::StrCat(spec.dataset(), "@", spec.version()));
  if (!view.ok()) return view.status();
  std::vector<std::string> paths;
  for (std::string p : spec.paths()) {
    while (!p.empty() && p.front() == '/') p.erase(0, 1);
    while (!p.empty() && p.back() == '/') p.pop_back();
    paths.push_back(p);
  }
  int n = spec.nodes_size(), k = -1;
  for (int i = 0; i < n; i++) {
    if (spec.nodes(i) == node_id_) k = i;
  }
  if (k < 0) return absl::NotFoundError("this node is not part of the prefetch");
  const uint32_t replicas = spec.mode() == rpc::PrefetchSpec::STRIPE ? spec.replicas() : n;
  const uint64_t bs = (*view)->block_size;
  uint64_t ordinal = 0;
  for (uint64_t id = 1; id <= (*view)->size(); id++) {
    const auto node = (*view)->Get(id);
    if (node->type != rpc::FileEntry::FILE) continue;
    bool selected = paths.empty();
    if (!selected) {
      std::string path = (*view)->PathOf(id);
      for (const auto& p : paths) selected |= Under(path, p);
    }
    if (!selected) continue;
    bool any = false;
    for (uint64_t i = 0; i * bs < node->size; i++, ordinal++) {
      uint64_t offset_from_owner = (static_cast<uint64_t>(k) + n - ordinal % n) % n;
      if (offset_from_owner < replicas) {
        mine->push_back({id, i, ordinal, static_cast<uint32_t>(files->size())});
        any = true;
      }
    }
    if (any) files->push_back(id);
  }
  return *view;
}

void PrefetchRunner::ApplyPin(const rpc::PrefetchJob& job, int64_t until) {
  std::vector<Block> mine;
  std::vector<uint64_t> files;
  auto view = Plan(job, &mine, &files);
  if (!view.ok()) return;
  for (const auto& b : mine) {
    cache_->SetPin({(*view)->dataset_id, (*view)->version, b.file_id, b.index}, until);
  }
}

}  // namespace ember::cachefs
