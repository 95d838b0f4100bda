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
};

// The state as JSON (without the fd, which travels beside it).
std::string EncodeMountState(const KernelFuseState& state);
// Returns: the state (fd -1); DataLoss naming what is malformed.
absl::StatusOr<KernelFuseState> DecodeMountState(const std::string& text);

// Sends one message of `len` bytes with `fd` attached (SCM_RIGHTS). Returns: sendmsg's result.
ssize_t SendWithFd(int sock, const void* data, size_t len, int fd);
// Receives one message into buf; *fd is the fd attached to it, or -1. Returns: recvmsg's result.
ssize_t RecvWithFd(int sock, void* buf, size_t len, int flags, int* fd);

}  // namespace ember::cachefs
