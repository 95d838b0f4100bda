#include "cachefs/agent_handover.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <utility>

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
  auto listener = TakeoverListener::Start(
      TakeoverSocketPath(cache_dir),
      [p = h.get()](int conn, HandoverProtocol theirs) { p->OnRequest(conn, theirs); });
  if (!listener.ok()) {
    spdlog::warn("node: {}; restarts will remount", std::string(listener.status().message()));
    return nullptr;
  }
  h->listener_ = std::move(*listener);
  return h;
}

void Handover::OnRequest(int conn, HandoverProtocol theirs) {
  {
    absl::MutexLock lock(&mu_);
    requested_ = true;  // before Run() returns: the agent then stops for the successor
    successor_ = theirs;
  }
  KernelFuseState state = kernel_->Quiesce();  // Run() returns in the main thread
  absl::MutexLock lock(&mu_);
  state_ = std::move(state);
  conn_ = conn;
}

bool Handover::Requested() {
  absl::MutexLock lock(&mu_);
  return requested_;
}

void Handover::StopListening() { listener_.reset(); }

void Handover::Send(int peer_listener) {
  absl::MutexLock lock(&mu_);
  if (conn_ < 0) {
    if (peer_listener >= 0) close(peer_listener);
    return;
  }
  if (successor_.current < 2 && peer_listener >= 0) {
    // Protocol 1 knew one fd: it would keep the socket unknowingly and fail to bind the port.
    close(peer_listener);
    peer_listener = -1;
  }
  state_.peer_listen_fd = peer_listener;
  absl::Status st = SendTakeoverState(std::exchange(conn_, -1), state_);
  if (st.ok()) {
    spdlog::info("takeover: mount {} handed over", state_.mountpoint);
  } else {
    spdlog::error("takeover: {}; the mount ends with this process", std::string(st.message()));
  }
  CloseStateFds(&state_);
}

}  // namespace ember::cachefs
