// Takeover: handing a live mount from a running agent to its successor over a unix socket.
//
//   successor                              running agent (TakeoverListener)
//   RequestTakeover(path) --"takeover"-->  stops serving FUSE (in-flight requests answered),
//                                          shuts down (cache index closed, ports freed),
//                         <-- state+fd --  SendTakeoverState: JSON + the /dev/fuse fd
//                                          (SCM_RIGHTS), then exits without unmounting
//   KernelFuse::Adopt(state) serves the same mount; requests queued meanwhile wait in the kernel.
//
// The same exchange hands a mount between supervisors (supervisor.h: a new pod's supervisor asks
// the old pod's on CACHE/supervisor.sock) and from an agent to its own supervisor.
//
// Version skew: the request names the successor's handover protocols (oldest..current) and the
// listener refuses, with a message and without stopping, a successor it cannot hand to. A release
// that changes what is handed over bumps kHandoverProtocol and keeps speaking the one before
// (oldest = current - 1), so release N+1 takes over from N and N from N+1 (a rollback); releases
// further apart refuse, and the running one keeps serving.
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

// The handover protocols one end speaks. 1: the takeover of releases before supervisors handed
// over (request line "takeover v1"); 2: versioned requests and refusals.
struct HandoverProtocol {
  int oldest = 1;
  int current = 2;
};
// This binary's protocols; EMBER_TEST_HANDOVER_PROTOCOL="OLDEST:CURRENT" makes it act as another
// release would (tests of the skew rule).
HandoverProtocol OwnHandoverProtocol();
// Returns: whether ends speaking `a` and `b` can hand a mount between them (either way).
bool HandoverCompatible(HandoverProtocol a, HandoverProtocol b);

// Asks the agent listening at `path` to hand over; waits up to `timeout` for its state.
// Returns: the state (its fd is ours now); NotFound if nothing listens there; FailedPrecondition
// with the listener's reason if it refused (it keeps serving); DeadlineExceeded / Unavailable /
// DataLoss naming what went wrong.
absl::StatusOr<KernelFuseState> RequestTakeover(const std::string& path,
                                                std::chrono::milliseconds timeout);

// Sends `state` (and its fd) on a connection accepted by TakeoverListener, then closes it.
// Returns: Ok; Unavailable naming what failed.
absl::Status SendTakeoverState(int conn, const KernelFuseState& state);

// Listens at `path` (a stale socket file is replaced); calls on_request(conn, the successor's
// protocols) once for the first
// well-formed request of a compatible successor, on its own thread. The callee owns conn.
// Others are logged and answered (a refusal names both ends' protocols); listening goes on.
class TakeoverListener {
 public:
  // Returns: the listener; InvalidArgument (path too long); FailedPrecondition (cannot listen).
  static absl::StatusOr<std::unique_ptr<TakeoverListener>> Start(
      const std::string& path, std::function<void(int conn, HandoverProtocol theirs)> on_request);
  ~TakeoverListener();

 private:
  TakeoverListener() = default;
  std::string path_;
  int fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
};

}  // namespace ember::cachefs
