// Takeover: handing a live mount from a running agent to its successor over a unix socket.
//
//   successor                              running agent (TakeoverListener)
//   RequestTakeover(path) --"takeover"-->  stops serving FUSE (in-flight requests answered),
//                                          shuts down (cache index closed, ports freed),
//                         <-- state+fd --  SendTakeoverState: JSON + the /dev/fuse fd
//                                          (SCM_RIGHTS), then exits without unmounting
//   KernelFuse::Adopt(state) serves the same mount; requests queued meanwhile wait in the kernel.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cachefs/fuse_kernel.h"

namespace ember::cachefs {

// The socket a node's agent listens on for its successor.
std::string TakeoverSocketPath(const std::string& cache_dir);

// Asks the agent listening at `path` to hand over; waits up to `timeout` for its state.
// Returns: the state (its fd is ours now); NotFound if no agent listens there;
// DeadlineExceeded / Unavailable / DataLoss naming what went wrong.
absl::StatusOr<KernelFuseState> RequestTakeover(const std::string& path,
                                                std::chrono::milliseconds timeout);

// Sends `state` (and its fd) on a connection accepted by TakeoverListener, then closes it.
absl::Status SendTakeoverState(int conn, const KernelFuseState& state);

// A supervisor keeps the mount across agent crashes (`ember node --supervise`): the agent sends
// it the state with the fd once serving, then every passthrough open and release; after a crash
// the next agent gets the latest state from it and reattaches. `sock` is a SOCK_SEQPACKET pair.
absl::Status SendStateMessage(int sock, const KernelFuseState& state);
// An update (open == false: release) for the supervisor's copy of the open files.
void SendOpenUpdate(int sock, bool open, const KernelFuseState::OpenFile& f, int32_t backing_id);
// Applies one message from the agent to `state`. Returns false if it was malformed.
bool ApplySupervisorMessage(const char* msg, size_t len, int passed_fd, KernelFuseState* state);
// Reads one queued message (without waiting) into `state`. Returns 1 if one was read, 0 if none
// was queued, -1 if the other end is gone.
int ReceiveSupervisorMessage(int sock, KernelFuseState* state);
// A state queued for this agent by its supervisor, if any (it does not wait).
std::optional<KernelFuseState> TakeQueuedState(int sock);

// Listens at `path` (a stale socket file is replaced); calls on_request(conn) once for the first
// well-formed request, on its own thread. The callee owns conn.
class TakeoverListener {
 public:
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
