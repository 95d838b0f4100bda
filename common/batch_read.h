// BatchPread: many reads of many files issued at once, through one io_uring submission per batch
// (each calling thread keeps a small ring of its own). Why: on a VM every disk request the kernel
// sends is a notify to the host (a VM exit, ~15-20 us of a core here); reads submitted together
// are dispatched under one plug and share one notify, and the caller sleeps once for the batch
// instead of once per read. What a cold epoch over a folder of small files pays per file
// (docs/benchmarks.md, #21). Without io_uring (an old kernel, `kernel.io_uring_disabled`), the
// reads are plain preads one after another: the same results, slower.
// Thread-safe: a ring per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ember {

struct PreadOp {
  int fd = -1;
  uint64_t offset = 0;
  size_t len = 0;
  char* buf = nullptr;
  // When not 0: the read is done once it has this many bytes (an O_DIRECT read of a file's end
  // asks for whole pages, len rounded up, and gets the file's bytes: no read after them).
  size_t enough = 0;
  // Out: bytes read (== len unless the file ended first), or -errno.
  int64_t result = 0;
};

// Reads every op (short reads are retried from where they stopped, until EOF or len).
void BatchPread(std::span<PreadOp> ops);

// Whether this thread's reads go through io_uring (false: plain preads). For tests and logs.
bool BatchPreadUsesUring();

// Many files opened, or closed, in one submission on the same ring as BatchPread: a system call
// costs ~1 us on this VM before it does anything, and a batch of small files pays an open and a
// close each (a third of the CPU of reading one). Without io_uring, plain openat2 / close.
struct OpenOp {
  const char* path = nullptr;  // absolute, or relative to dirfd
  int dirfd = -100;            // AT_FDCWD
  uint64_t flags = 0;          // open(2) flags
  uint64_t resolve = 0;        // openat2(2) RESOLVE_* flags
  // Out: the fd, or -errno (-ENOSYS: this kernel has no openat2; the caller opens otherwise).
  int result = -1;
};
void BatchOpen(std::span<OpenOp> ops);
// Closes every fd (errors are ignored, as close(2)'s are for a file only read).
void BatchClose(std::span<const int> fds);

}  // namespace ember
