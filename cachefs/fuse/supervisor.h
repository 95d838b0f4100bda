// The supervisor (`ember node --supervise`) keeps a kernel-binding mount across agent crashes.
//
// Supervise() runs the agent as a child with one end of a SOCK_SEQPACKET pair (its number in
// $EMBER_SUPERVISOR_FD). The agent sends the mount's state with the /dev/fuse fd once serving
// (SendStateMessage), then every open and release (SendOpenUpdate); the supervisor applies them
// to its copy. When the agent dies of anything but a requested stop, the supervisor queues the
// state for the next agent, which takes it (TakeQueuedState), adopts the mount
// (KernelFuse::Adopt) and asks the kernel to resend the requests the dead one had taken, so
// open files keep working.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cachefs/fuse/mount_state.h"

namespace ember::cachefs {

// The environment variable that hands the agent its end of the supervisor's socket.
inline constexpr char kSupervisorFdEnv[] = "EMBER_SUPERVISOR_FD";

// Runs `agent_argv` (argv[0] first; executed as /proc/self/exe) under supervision until it
// stops on purpose or exits cleanly, restarting it on the same mount after a crash.
// REQUIRES: SIGTERM and SIGINT are blocked in the calling thread (they are forwarded to the
// agent and end supervision).
// Returns: the exit code to end with (the agent's, or 128 + its signal); Internal when the
// supervisor cannot start (socketpair, fork).
absl::StatusOr<int> Supervise(const std::vector<std::string>& agent_argv);

// The agent's side: the whole state, with its fd. Returns: Ok; Unavailable.
absl::Status SendStateMessage(int sock, const KernelFuseState& state);
// An update (open == false: release) for the supervisor's copy of the open files. Blocking: a
// lost update could make a successor reuse a closed backing id. The supervisor drains its end
// at once; if it is gone the send fails (EPIPE) and nothing waits.
void SendOpenUpdate(int sock, bool open, const KernelFuseState::OpenFile& f, int32_t backing_id);

// Applies one message from the agent to `state`. Returns: false if it was malformed.
bool ApplySupervisorMessage(const char* msg, size_t len, int passed_fd, KernelFuseState* state);
// Reads one queued message (without waiting) into `state`. Returns: 1 if one was read, 0 if
// none was queued, -1 if the other end is gone.
int ReceiveSupervisorMessage(int sock, KernelFuseState* state);
// Returns: a state queued for this agent by its supervisor, if any (it does not wait).
std::optional<KernelFuseState> TakeQueuedState(int sock);

}  // namespace ember::cachefs
