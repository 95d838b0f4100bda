#include "cachefs/agent_handover.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "cachefs/fuse/supervisor.h"

namespace ember::cachefs {

absl::StatusOr<std::optional<KernelFuseState>> InheritMount(int supervisor_fd, bool takeover,
                                                            const std::string& fuse_binding,
                                                            const std::string& cache_dir) {
  std::optional<KernelFuseState> inherited;
  if (supervisor_fd >= 0) {
    inherited = TakeQueuedState(supervisor_fd);  // the mount of a crashed predecessor
    if (inherited) {
      spdlog::info("node: reattaching {} kept by the supervisor", inherited->mountpoint);
    }
  }
  if (takeover && !inherited) {
    if (fuse_binding != "kernel") {
      return absl::InvalidArgumentError("--takeover needs --fuse-binding kernel");
    }
    auto st = RequestTakeover(TakeoverSocketPath(cache_dir), std::chrono::seconds(60));
    if (st.ok()) {
      inherited = std::move(*st);
    } else if (absl::IsNotFound(st.status())) {
      spdlog::info("node: --takeover: {}; mounting afresh", std::string(st.status().message()));
    } else {
      return absl::FailedPreconditionError(absl::StrCat("--takeover: ", st.status().message()));
    }
  }
  return inherited;
}

std::unique_ptr<Handover> Handover::Listen(const std::string& cache_dir, KernelFuse* kernel) {
  std::unique_ptr<Handover> h(new Handover(kernel));
  auto listener = TakeoverListener::Start(TakeoverSocketPath(cache_dir),
                                          [p = h.get()](int conn) { p->OnRequest(conn); });
  if (!listener.ok()) {
    spdlog::warn("node: {}; restarts will remount", std::string(listener.status().message()));
    return nullptr;
  }
  h->listener_ = std::move(*listener);
  return h;
}

void Handover::OnRequest(int conn) {
  KernelFuseState state = kernel_->Quiesce();  // Run() returns in the main thread
  absl::MutexLock lock(&mu_);
  state_ = std::move(state);
  conn_ = conn;
}

bool Handover::Requested() {
  absl::MutexLock lock(&mu_);
  return conn_ >= 0;
}

void Handover::StopListening() { listener_.reset(); }

void Handover::Send() {
  absl::MutexLock lock(&mu_);
  if (conn_ < 0) return;
  absl::Status st = SendTakeoverState(conn_, state_);
  if (st.ok()) {
    spdlog::info("takeover: mount {} handed over", state_.mountpoint);
  } else {
    spdlog::error("takeover: {}; the mount ends with this process", std::string(st.message()));
  }
  close(state_.fd);  // conn_ stays set: Requested() keeps saying a successor took the mount
}

}  // namespace ember::cachefs
