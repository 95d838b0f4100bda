// The supervisor (`ember node --supervise`) keeps a kernel-binding mount across agent crashes.
//
// Supervise() runs the agent as a child with one end of a SOCK_SEQPACKET pair (its number in
// $EMBER_SUPERVISOR_FD). The agent sends the mount's state with the /dev/fuse fd once serving
// (SendStateMessage), then every open and release (SendOpenUpdate); the supervisor applies them
// to its copy. When the agent dies of anything but a requested stop, the supervisor queues the
// state for the next agent, which takes it (TakeQueuedState), adopts the mount
// (KernelFuse::Adopt) and asks the kernel to resend the requests the dead one had taken, so
// open files keep working.
//
// Supervisors also hand a mount to each other (an upgrade without unmounting: the new pod of a
// DaemonSet's rolling update starts beside the old one): a starting supervisor asks the one
// listening on CACHE/supervisor.sock (takeover.h's exchange, versioned). The running supervisor
// takes the mount from its agent (the agent's takeover socket; if the agent is dead or does not
// answer, its own copy, as after a crash), waits until the agent has exited, sends the mount and
// then only waits to be stopped (SIGTERM: it exits without unmounting). The successor's first
// agent adopts the mount. If no supervisor listens, that agent asks a running agent directly
// (--takeover), else mounts afresh; a refusal (releases too far apart) or any other failure of
// the hand-over ends the successor with the reason, and the running one keeps serving.
//
// In place (SIGHUP; `systemctl reload` after installing a new binary): the supervisor asks the
// binary now at its path which protocols it speaks (`ember handover-protocol`), takes the mount
// from its agent as above and execs that binary with the same command line and the mount
// ($EMBER_SUPERVISOR_RELOAD); the pid stays, so a service manager sees no restart. An
// incompatible binary is refused with the reason and the agent keeps serving.
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

// The socket a supervisor listens on for its successor.
std::string SupervisorSocketPath(const std::string& cache_dir);

struct SuperviseOptions {
  std::vector<std::string> self_argv;  // this command line: an in-place upgrade runs it again
  std::string cache_dir;               // where the takeover sockets live (the agent's --cache-dir)
  std::string ready_file;  // holds the agent's pid while it serves this supervisor's mount
};

// Runs `agent_argv` (argv[0] first; executed as /proc/self/exe) under supervision until it
// stops on purpose or exits cleanly, restarting it on the same mount after a crash; first takes
// the mount from a supervisor already running on the cache dir, and hands it to a successor.
// REQUIRES: SIGTERM and SIGINT are blocked in the calling thread (they are forwarded to the
// agent and end supervision).
// Returns: the exit code to end with (the agent's, or 128 + its signal; 0 once stopped after
// handing the mount over); FailedPrecondition when the running supervisor refused to hand over;
// Internal when the supervisor cannot start (socketpair, fork).
absl::StatusOr<int> Supervise(const std::vector<std::string>& agent_argv,
                              const SuperviseOptions& options);

// The agent's side: the whole state, with its fd. Returns: Ok; Unavailable.
absl::Status SendStateMessage(int sock, const KernelFuseState& state);
// An update (open == false: release) for the supervisor's copy of the open files. Blocking: a
// lost update could make a successor reuse a closed backing id. The supervisor drains its end
// at once; if it is gone the send fails (EPIPE) and nothing waits.
void SendOpenUpdate(int sock, bool open, const KernelFuseState::OpenFile& f, int32_t backing_id);

// Applies one message from the agent to `state`. Returns: false if it was malformed.
bool ApplySupervisorMessage(const char* msg, size_t len, const std::vector<int>& fds,
                            KernelFuseState* state);
// Reads one queued message (without waiting) into `state`. Returns: 1 if one was read (2 if it
// was the whole state: the agent serves), 0 if none was queued, -1 if the other end is gone.
int ReceiveSupervisorMessage(int sock, KernelFuseState* state);
// Returns: a state queued for this agent by its supervisor, if any (it does not wait).
std::optional<KernelFuseState> TakeQueuedState(int sock);

}  // namespace ember::cachefs
