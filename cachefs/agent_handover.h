// The node agent's side of keeping a mount across restarts (fuse/takeover.h, fuse/supervisor.h).
//
// At start, InheritMount finds a mount to continue: one a supervisor kept after this agent's
// predecessor crashed, or (--takeover) one a running agent on the same cache dir hands over.
// While serving, Handover listens for a successor: when one asks, it quiesces the kernel binding
// (Run() returns in the main thread) and keeps the mount's state; the agent then closes what the
// successor opens (cache index, ports) and Send hands the mount over.
//
// Thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/fuse/kernel_binding.h"
#include "cachefs/fuse/takeover.h"

namespace ember::cachefs {

// The mount this agent continues, if any: queued by its supervisor (`supervisor_fd` >= 0), or
// handed over by the agent running on `cache_dir` when `takeover` is set. Returns: the state
// (its fd is ours) or nullopt (mount afresh); InvalidArgument (--takeover without the kernel
// binding); FailedPrecondition (the running agent did not hand over).
absl::StatusOr<std::optional<KernelFuseState>> InheritMount(int supervisor_fd, bool takeover,
                                                            const std::string& fuse_binding,
                                                            const std::string& cache_dir);

class Handover {
 public:
  // Listens on the cache dir's takeover socket for a successor of `kernel` (which must outlive
  // this). Returns: nullptr (logged: restarts will remount) when it cannot listen.
  static std::unique_ptr<Handover> Listen(const std::string& cache_dir, KernelFuse* kernel);

  // Returns: whether a successor asked for the mount (Run() has returned for that reason).
  bool Requested() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops listening (a request being handled finishes first).
  void StopListening();
  // Sends the mount to the successor that asked, with `peer_listener` (the peer port, still
  // listening, or -1), then closes this process's copies. REQUIRES: everything else the
  // successor opens (cache index, other ports) is closed. No-op if none asked.
  void Send(int peer_listener) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit Handover(KernelFuse* kernel) : kernel_(kernel) {}
  // On the listener's thread: stop serving FUSE; the rest shuts down in ~NodeAgent.
  void OnRequest(int conn, HandoverProtocol theirs) ABSL_LOCKS_EXCLUDED(mu_);

  KernelFuse* const kernel_;
  std::unique_ptr<TakeoverListener> listener_;
  absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;      // a successor asked (it stays asked)
  int conn_ ABSL_GUARDED_BY(mu_) = -1;               // the successor waiting for the mount
  HandoverProtocol successor_ ABSL_GUARDED_BY(mu_);  // what the successor speaks
  KernelFuseState state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::cachefs
