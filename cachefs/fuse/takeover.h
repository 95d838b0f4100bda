// Takeover: handing a live mount from a running agent to its successor over a unix socket.
//
//   successor                              running agent (TakeoverListener)
//   RequestTakeover(path) --"takeover"-->  stops serving FUSE (in-flight requests answered),
//                                          shuts down (cache index closed, ports freed),
//                         <-- state+fd --  SendTakeoverState: JSON + the /dev/fuse fd
//                                          (SCM_RIGHTS), then exits without unmounting
//   KernelFuse::Adopt(state) serves the same mount; requests queued meanwhile wait in the kernel.
//
// The agent's side (when to hand over, closing what the successor opens) is in
// cachefs/agent_handover.h; crashes are the supervisor's (supervisor.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cachefs/fuse/mount_state.h"

namespace ember::cachefs {

// The socket a node's agent listens on for its successor.
std::string TakeoverSocketPath(const std::string& cache_dir);

// Asks the agent listening at `path` to hand over; waits up to `timeout` for its state.
// Returns: the state (its fd is ours now); NotFound if no agent listens there;
// DeadlineExceeded / Unavailable / DataLoss naming what went wrong.
absl::StatusOr<KernelFuseState> RequestTakeover(const std::string& path,
                                                std::chrono::milliseconds timeout);

// Sends `state` (and its fd) on a connection accepted by TakeoverListener, then closes it.
// Returns: Ok; Unavailable naming what failed.
absl::Status SendTakeoverState(int conn, const KernelFuseState& state);

// Listens at `path` (a stale socket file is replaced); calls on_request(conn) once for the first
// well-formed request, on its own thread. The callee owns conn.
class TakeoverListener {
 public:
  // Returns: the listener; InvalidArgument (path too long); FailedPrecondition (cannot listen).
  static absl::StatusOr<std::unique_ptr<TakeoverListener>> Start(
      const std::string& path, std::function<void(int conn)> on_request);
  ~TakeoverListener();

 private:
  TakeoverListener() = default;
  std::string path_;
  int fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
};

}  // namespace ember::cachefs
