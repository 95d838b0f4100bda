// The kernel binding's requests: one function per opcode (kernel_ops.cc), as libfuse's
// passthrough_hp.cc does, each ending in exactly one reply (FORGET and INTERRUPT get none).
// Errors go out as errno through ToErrno (errno.h). Internal to fuse/.
#pragma once

#include <cstddef>
#include <vector>

#include "cachefs/filesystem.h"
#include "cachefs/fuse/kernel_protocol.h"
#include "cachefs/fuse/open_files.h"

namespace ember::cachefs {

// Answers one request (`msg`, `len` bytes as /dev/fuse gives it) on `ch`. `scratch` is the
// calling thread's reply buffer. INIT is answered by the session (KernelFuse::HandleInit) only.
void DispatchRequest(FileSystem* fs, OpenFiles* files, const Channel& ch, const char* msg,
                     size_t len, std::vector<char>* scratch);

}  // namespace ember::cachefs
