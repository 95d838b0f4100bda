#include "cachefs/agent_reports.h"

#include <spdlog/spdlog.h>

#include <vector>

namespace ember::cachefs {

MetaReporter::MetaReporter(const Options& options, meta::MetaClient* meta,
                           BlockDirectory* directory, BlockCache* cache, StatsFn stats,
                           HeartbeatFn on_heartbeat)
    : options_(options),
      meta_(meta),
      directory_(directory),
      cache_(cache),
      stats_(std::move(stats)),
      on_heartbeat_(std::move(on_heartbeat)) {
  thread_ = std::thread([this] { Loop(); });
}

MetaReporter::~MetaReporter() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

void MetaReporter::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  cv_.SignalAll();
}

void MetaReporter::ReportNow() {
  absl::MutexLock send_lock(&send_mu_);
  if (!registered_) return;
  bool sent = false;
  // An error is the loop's to see (it re-registers with a full report).
  if (!SendChanges(&sent).ok()) registered_ = false;
}

absl::Status MetaReporter::Register() {
  auto r = meta_->RegisterNode(options_.node);
  if (!r.ok()) return r.status();
  heartbeat_interval_ =
      std::chrono::milliseconds(std::max<uint32_t>(r->heartbeat_interval_ms(), 50));
  // Changes queued before registration are covered by the full report.
  std::vector<BlockAddr> added, removed;
  cache_->TakeChanges(&added, &removed);
  absl::Status st = FullReport();
  if (!st.ok()) return st;
  spdlog::info("node: {} registered with meta at {} (heartbeat every {} ms)", options_.node.id(),
               meta_->address(), heartbeat_interval_.count());
  return absl::OkStatus();
}

absl::Status MetaReporter::FullReport() {
  std::vector<BlockDirectory::ResidentFile> files;
  cache_->ForEachResidentFile([&](uint32_t ds, uint32_t ver, uint64_t file, const std::string& bm) {
    files.push_back({ds, ver, file, bm});
  });
  return directory_->ReportResident(files);
}

absl::Status MetaReporter::SendChanges(bool* sent) {
  std::vector<BlockAddr> added, removed;
  cache_->TakeChanges(&added, &removed);
  *sent = !added.empty() || !removed.empty();
  if (!*sent) return absl::OkStatus();
  // Lost on an error: the next registration's full report covers it.
  return directory_->ReportChanges(added, removed);
}

void MetaReporter::Loop() {
  auto last_heartbeat = std::chrono::steady_clock::time_point{};
  bool meta_down_logged = false;
  while (true) {
    bool sent = false;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    absl::Status st = absl::OkStatus();
    if (!registered_) {
      absl::MutexLock send_lock(&send_mu_);
      st = Register();
      registered_ = st.ok();
    } else {
      {
        absl::MutexLock send_lock(&send_mu_);
        st = SendChanges(&sent);
      }
      if (st.ok() && std::chrono::steady_clock::now() - last_heartbeat >= heartbeat_interval_) {
        auto hb = meta_->Heartbeat(options_.node.id(), stats_());
        if (hb.ok()) {
          last_heartbeat = std::chrono::steady_clock::now();
          if (hb->reregister()) registered_ = false;
          on_heartbeat_(*hb);
        } else {
          st = hb.status();
        }
      }
      if (!st.ok()) registered_ = false;  // re-register (with a full report) when meta is back
    }
    if (!st.ok() && !meta_down_logged) {
      spdlog::warn("node: meta at {}: {}; serving on and retrying", meta_->address(),
                   std::string(st.message()));
      meta_down_logged = true;
    } else if (st.ok() && meta_down_logged) {
      spdlog::info("node: meta at {} is back", meta_->address());
      meta_down_logged = false;
    }
    absl::MutexLock lock(&mu_);
    const auto wait = !st.ok() ? std::chrono::milliseconds(500)
                      : sent   ? options_.busy_report_interval
                               : options_.report_interval;
    const absl::Time deadline = absl::Now() + absl::FromChrono(wait);
    while (!stopping_ && !cv_.WaitWithDeadline(&mu_, deadline)) {
    }
  }
}

}  // namespace ember::cachefs
