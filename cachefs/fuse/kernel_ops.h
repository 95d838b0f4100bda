// The kernel binding's requests: one function per opcode (kernel_ops.cc), as libfuse's
// passthrough_hp.cc does, each ending in exactly one reply (FORGET and INTERRUPT get none).
// Errors go out as errno through ToErrno (errno.h). Internal to fuse/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>

#include "cachefs/filesystem.h"
#include "cachefs/fuse/kernel_protocol.h"
#include "cachefs/fuse/open_files.h"

namespace ember::cachefs {

// A thread's reply buffer, kept across requests. New memory is not zeroed: a reply carries only
// bytes the request wrote, and zeroing each thread's first 1 MiB (with its page faults) was 2%
// of a restoring node's samples.
class ReplyScratch {
 public:
  // At least `n` bytes (grown to kMaxRead at least, so that one buffer serves every READ).
  char* Get(size_t n) {
    if (size_ < n) {
      size_ = std::max(n, kMaxRead);
      buf_ = std::make_unique_for_overwrite<char[]>(size_);
    }
    return buf_.get();
  }

 private:
  std::unique_ptr<char[]> buf_;
  size_t size_ = 0;
};

// Answers one request (`msg`, `len` bytes as /dev/fuse gives it) on `ch`. `scratch` is the
// calling thread's reply buffer. INIT is answered by the session (KernelFuse::HandleInit) only.
void DispatchRequest(FileSystem* fs, OpenFiles* files, const Channel& ch, const char* msg,
                     size_t len, ReplyScratch* scratch);

}  // namespace ember::cachefs
