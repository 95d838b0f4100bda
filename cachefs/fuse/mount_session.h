// Mounting and unmounting (both bindings mount through libfuse), and what both bindings share:
// the mount's readahead window and the per-operation latency metric. Internal to fuse/.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "cachefs/fuse/binding.h"

struct fuse_session;
struct fuse_lowlevel_ops;
namespace ember::metrics {
class Histogram;
}

namespace ember::cachefs {

// Mounts at `mountpoint` through libfuse (fusermount3 when not root) and returns the session;
// `ops` may be empty when the caller reads /dev/fuse itself. `writable`: read-write (the kernel
// binding, which serves volumes' changes; datasets answer EROFS), else read-only (libfuse
// binding). *resolved is the absolute mountpoint. Returns: the errors of PrepareMountpoint;
// FailedPrecondition (cannot mount).
absl::StatusOr<fuse_session*> MountSession(const std::string& mountpoint,
                                           const MountOptions& options, bool writable,
                                           const ::fuse_lowlevel_ops* ops, void* userdata,
                                           std::string* resolved);
// Detaches a mount (umount2 MNT_DETACH, or fusermount3 -u -z when not root).
void LazyUnmount(const std::string& mountpoint);
// Sets read_ahead_kb of the FUSE mount at `mountpoint` (found in /proc/self/mountinfo, without
// touching the mount itself). Returns: false (and logs) when it cannot.
bool SetMountReadahead(const std::string& mountpoint, uint32_t kb);
// Raises fs.fuse.max_pages_limit to `pages` when it is lower and this process may write it (the
// kernel reads it when a FUSE file system mounts, and clamps the max_pages a daemon asks for to
// it; it bounds no other mount). Logs what it did or why it could not; a kernel without the
// setting (before 6.13) keeps its fixed 256.
void RaiseFuseMaxPagesLimit(uint32_t pages);
// The per-operation FUSE request latency histogram (ember_fuse_request_seconds{op}) both
// bindings report into.
::ember::metrics::Histogram* FuseOpHistogram(const std::string& op);

}  // namespace ember::cachefs
