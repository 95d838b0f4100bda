// cachefs/fuse/: serving a FileSystem (cachefs/filesystem.h) at a mountpoint. This is the
// folder's front door.
//
// Owns: both FUSE bindings (kernel_binding.h: the kernel protocol spoken directly, the default;
// libfuse_binding.h: libfuse's low-level loop), mounting and unmounting (mount_session.h), the
// kernel session (INIT, worker threads) and its requests (kernel_ops.h, one function per
// opcode), the one table of open files with passthrough backing (open_files.h), requests over
// io_uring (fuse_uring.h), handing a mount to a successor (takeover.h), keeping it across
// crashes and upgrades (supervisor.h; across `systemctl restart`: service_manager.h), and the
// conversion of a Status to an errno (errno.h). Must not touch: the cache, the fill pipeline,
// meta or the namespace; it sees files only through FileSystem.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ember::cachefs {

struct MountOptions {
  bool allow_other = false;  // let other users read the mount (needs user_allow_other or root)
  int max_threads = 16;
  bool passthrough = true;  // kernel binding: ask for FUSE passthrough of resident files
  // The mount's readahead window (its bdi read_ahead_kb; the kernel's default is 128 KiB): a
  // sequential reader of a file served by the agent gets requests of up to 1 MiB with this much
  // in flight. 0 keeps the kernel's. Kernel binding; needs root (else the default stays).
  uint32_t readahead_kb = 4096;
  // Kernel binding: the largest READ request, in 4 KiB pages (at most kMaxPages: 4 MiB, a whole
  // block; the kernel's own limit is fs.fuse.max_pages_limit, raised to this at mount when
  // lower and this process is root, else requests are that limit's size, 1 MiB by default).
  uint32_t max_pages = 1024;
  // READDIRPLUS: listings carry every entry's attributes, so `ls -l` or a stat after a listing
  // needs no LOOKUP, but the kernel then builds an inode per entry even for `find`/`scandir`,
  // which need only names and types (4-5x slower listings of large folders). Off by default.
  bool readdirplus = false;
  // Kernel binding with passthrough: files not yet wholly cached open with FOPEN_DIRECT_IO (no
  // page cache of the mount; +15-60% on cold large sequential reads, but 4-8 KiB reads become
  // one round trip each). Off by default.
  bool direct_io = false;
  // Kernel binding: answer requests over io_uring, a queue per CPU served on that CPU
  // (FuseUring; Linux 6.14+ with the fuse module's enable_uring on, else /dev/fuse as usual).
  // No takeover or supervisor with it: the rings cannot be handed over.
  bool fuse_uring = false;
  int uring_threads_per_cpu = 4;
  // Kernel binding: answer OPEN with ENOSYS, so the kernel stops sending OPEN and RELEASE for
  // the mount's files (directories still open as usual): a file already in the mount's page
  // cache is read with no request at all, one not yet there costs LOOKUP and READ. Files open
  // with keep-cache (versions are immutable). No passthrough: resident large files are read
  // through the agent and the mount's page cache. For nodes serving datasets of many small
  // files. Off by default.
  bool no_open = false;
  bool debug = false;
};

// A FUSE binding serving a FileSystem at a mountpoint: libfuse (FuseMount) or the kernel
// protocol spoken directly (KernelFuse).
class MountBinding {
 public:
  virtual ~MountBinding() = default;
  // Serves requests until Stop() or an external unmount. Returns when the loop has ended.
  virtual void Run() = 0;
  // Ends the loop and unmounts; safe from any thread, idempotent.
  virtual void Stop() = 0;
};

// Checks a mountpoint before mounting: it must exist and be a directory that is not already a
// live mount. A stale FUSE mount left by a crashed agent ("Transport endpoint is not connected")
// is lazily unmounted first. Returns: Ok; NotFound; FailedPrecondition (not a directory, busy).
absl::Status PrepareMountpoint(const std::string& mountpoint);

}  // namespace ember::cachefs
