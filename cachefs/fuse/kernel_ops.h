// The kernel binding's requests: one function per opcode (kernel_ops.cc), as libfuse's
// passthrough_hp.cc does, each ending in exactly one reply (FORGET and INTERRUPT get none).
// Errors go out as errno through ToErrno (errno.h). Internal to fuse/.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "cachefs/filesystem.h"
#include "cachefs/fuse/kernel_protocol.h"
#include "cachefs/fuse/open_files.h"

namespace ember::cachefs {

// A thread's reply buffer. Grown without zeroing: a READ writes every byte it answers, and
// zeroing a new 1 MiB buffer (and faulting its pages in) was 2% of a restoring node's samples
// on each FUSE thread's first READ.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  template <class U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;  // default-initialized: left as it is
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using ReplyScratch = std::vector<char, UninitAllocator<char>>;

// Answers one request (`msg`, `len` bytes as /dev/fuse gives it) on `ch`. `scratch` is the
// calling thread's reply buffer. INIT is answered by the session (KernelFuse::HandleInit) only.
void DispatchRequest(FileSystem* fs, OpenFiles* files, const Channel& ch, const char* msg,
                     size_t len, ReplyScratch* scratch);

}  // namespace ember::cachefs
