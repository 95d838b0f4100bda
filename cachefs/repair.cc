#include "cachefs/repair.h"

#include <spdlog/spdlog.h>

#include "cachefs/dataset_fs.h"

namespace ember::cachefs {

Repairer::Repairer(Namespace* ns, ReadPath* read_path) : ns_(ns), read_path_(read_path) {
  thread_ = std::thread([this] { Run(); });
}

Repairer::~Repairer() { Stop(); }

void Repairer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Repairer::Enqueue(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  if (stop_ || !queued_.insert(addr).second) return;
  queue_.push_back(addr);
}

void Repairer::Run() {
  for (;;) {
    BlockAddr addr;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      addr = queue_.front();
      queue_.pop_front();
      queued_.erase(addr);
    }
    Repair(addr);
  }
}

void Repairer::Repair(const BlockAddr& addr) {
  // The block's file, as the version's manifest has it (NAME@V: the version the block belongs to).
  auto view = ns_->ViewByIno(MakeIno(addr.dataset_id, addr.version, addr.file_id));
  if (!view.ok() || !(*view)->Get(addr.file_id)) {
    spdlog::warn(
        "repair: block {}/{}/{}/{}: its file is unknown here ({}); it is filled when "
        "next read",
        addr.dataset_id, addr.version, addr.file_id, addr.index,
        view.ok() ? "no such file" : std::string(view.status().message()));
    return;
  }
  const FileRef file = MakeFileRef(**view, addr.file_id);
  auto source = read_path_->MakeResident(file, addr.index, FillRoute::kPeersThenOrigin, {});
  if (!source.ok()) {
    spdlog::warn("repair: {} block {} of {}: {}; it is filled when next read", file.dataset_name,
                 addr.index, file.origin.path, std::string(source.status().message()));
    return;
  }
  repaired_++;
  spdlog::info("repair: {} block {} of {} refilled from {}", file.dataset_name, addr.index,
               file.origin.path,
               *source == ReadPath::Source::kPeer     ? "a peer"
               : *source == ReadPath::Source::kOrigin ? "the origin"
                                                      : "the cache (someone refilled it first)");
}

}  // namespace ember::cachefs
