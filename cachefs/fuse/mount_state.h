// KernelFuseState: what a process needs to continue serving a kernel-binding mount without a
// new INIT: the /dev/fuse fd, what INIT negotiated, and the open files with their passthrough
// backing ids. A successor gets it over the takeover socket (takeover.h); a supervisor keeps a
// copy across crashes (supervisor.h). Both send it as JSON with the fd attached (SCM_RIGHTS).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::cachefs {

struct KernelFuseState {
  int fd = -1;  // /dev/fuse of the mount
  std::string mountpoint;
  uint32_t proto_minor = 0;
  bool passthrough = false;     // negotiated at INIT
  bool direct_io_mmap = false;  // FUSE_DIRECT_IO_ALLOW_MMAP negotiated at INIT
  uint64_t next_fh = 1;
  struct OpenFile {
    uint64_t fh = 0;
    uint64_t ino = 0;
    bool passthrough = false;
  };
  std::vector<OpenFile> open_files;
  std::map<uint64_t, int32_t> backing_ids;  // ino -> backing id registered with the kernel
  // The agent's peer port, still listening (-1: none): handed on with the mount so that peers
  // connecting meanwhile wait in its backlog instead of being refused. Travels as the second fd.
  int peer_listen_fd = -1;
};

// The state as JSON (without the fd, which travels beside it).
std::string EncodeMountState(const KernelFuseState& state);
// Returns: the state (fd -1); DataLoss naming what is malformed.
absl::StatusOr<KernelFuseState> DecodeMountState(const std::string& text);

// Sends one message of `len` bytes with `fds` attached (SCM_RIGHTS, at most kMaxPassedFds).
// Returns: sendmsg's result.
inline constexpr size_t kMaxPassedFds = 4;
ssize_t SendWithFds(int sock, const void* data, size_t len, const std::vector<int>& fds);
// Receives one message into buf; *fds gets the fds attached to it (more than kMaxPassedFds are
// closed by the kernel). Returns: recvmsg's result.
ssize_t RecvWithFds(int sock, void* buf, size_t len, int flags, std::vector<int>* fds);

// A state's fds in the order they travel: /dev/fuse, then the peer listener if any.
std::vector<int> StateFds(const KernelFuseState& s);
// Gives a decoded state the fds that came with it (in StateFds' order; extra ones are closed).
void AttachStateFds(const std::vector<int>& fds, KernelFuseState* s);
// Closes the state's fds (and marks them gone).
void CloseStateFds(KernelFuseState* s);

// The state (without its fds) in a new memfd, for a hand-over that cannot carry a message (an
// exec, a service manager's fd store). Returns: the memfd (close-on-exec); Internal.
absl::StatusOr<int> StateMemfd(const KernelFuseState& state);
// The state in `memfd` (closed) with its fds attached: /dev/fuse and the peer listener (-1:
// none), close-on-exec from now on. Returns: the state; DataLoss (the fds are closed).
absl::StatusOr<KernelFuseState> StateFromMemfd(int memfd, int fuse_fd, int peer_listen_fd);

}  // namespace ember::cachefs
