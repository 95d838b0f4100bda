// FuseMount: the libfuse3 low-level binding of a FileSystem. Mounts read-only, runs the
// multi-threaded loop, replies to reads with fd buffers so the kernel splices cached bytes
// without a copy through this process, and unmounts cleanly on Stop().
//
// Every callback ends in exactly one fuse_reply_*; errors go out through ToErrno (errno.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cachefs/filesystem.h"

struct fuse_session;
struct fuse_lowlevel_ops;
namespace ember::metrics {
class Histogram;
}

namespace ember::cachefs {

struct MountOptions {
  bool allow_other = false;  // let other users read the mount (needs user_allow_other or root)
  int max_threads = 16;
  bool passthrough = true;  // kernel binding: ask for FUSE passthrough of resident files
  // The mount's readahead window (its bdi read_ahead_kb; the kernel's default is 128 KiB): a
  // sequential reader of a file served by the agent gets requests of up to 1 MiB with this much
  // in flight. 0 keeps the kernel's. Kernel binding; needs root (else the default stays).
  uint32_t readahead_kb = 4096;
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
  bool debug = false;
};

// Sets read_ahead_kb of the FUSE mount at `mountpoint` (found in /proc/self/mountinfo, without
// touching the mount itself). Logs and returns false when it cannot.
bool SetMountReadahead(const std::string& mountpoint, uint32_t kb);

// Checks a mountpoint before mounting: it must exist and be a directory that is not already a
// live mount. A stale FUSE mount left by a crashed agent ("Transport endpoint is not connected")
// is lazily unmounted first. Returns: Ok; NotFound; FailedPrecondition (not a directory, busy).
absl::Status PrepareMountpoint(const std::string& mountpoint);

// A FUSE binding serving a FileSystem at a mountpoint: libfuse (FuseMount, below) or the kernel
// protocol spoken directly (KernelFuse, fuse_kernel.h).
class MountBinding {
 public:
  virtual ~MountBinding() = default;
  // Serves requests until Stop() or an external unmount. Returns when the loop has ended.
  virtual void Run() = 0;
  // Ends the loop and unmounts; safe from any thread, idempotent.
  virtual void Stop() = 0;
};

// Mounts read-only at `mountpoint` through libfuse (fusermount3 when not root) and returns the
// session; `ops` may be empty when the caller reads /dev/fuse itself. *resolved is the absolute
// mountpoint. Returns: the errors of PrepareMountpoint; FailedPrecondition (cannot mount).
absl::StatusOr<fuse_session*> MountSession(const std::string& mountpoint,
                                           const MountOptions& options,
                                           const ::fuse_lowlevel_ops* ops, void* userdata,
                                           std::string* resolved);
// The per-operation FUSE request latency histogram (ember_fuse_request_seconds{op}) both
// bindings report into.
::ember::metrics::Histogram* FuseOpHistogram(const std::string& op);

// Detaches a mount (umount2 MNT_DETACH, or fusermount3 -u -z when not root).
void LazyUnmount(const std::string& mountpoint);

class FuseMount final : public MountBinding {
 public:
  // Mounts `fs` at `mountpoint`. The FileSystem must outlive the mount.
  static absl::StatusOr<std::unique_ptr<FuseMount>> Mount(FileSystem* fs,
                                                          const std::string& mountpoint,
                                                          const MountOptions& options);
  ~FuseMount() override;

  void Run() override;
  void Stop() override;

  const std::string& mountpoint() const { return mountpoint_; }

 private:
  FuseMount() = default;
  FileSystem* fs_ = nullptr;
  std::string mountpoint_;
  MountOptions options_;
  fuse_session* session_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> unmounted_{false};
};

}  // namespace ember::cachefs
