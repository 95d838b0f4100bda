// FuseMount: the libfuse3 low-level binding of a FileSystem (`--fuse-binding libfuse`). Mounts
// read-only, runs libfuse's multi-threaded loop, replies to reads with fd buffers so the kernel
// splices cached bytes without a copy through this process, and unmounts cleanly on Stop().
//
// Every callback ends in exactly one fuse_reply_*; errors go out through ToErrno (errno.h). An
// open file's FileSystem handle lives in the kernel's file (fuse_file_info::fh) from OPEN until
// RELEASE. Thread-safe (libfuse calls from many threads).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cachefs/filesystem.h"
#include "cachefs/fuse/binding.h"

struct fuse_session;

namespace ember::cachefs {

class FuseMount final : public MountBinding {
 public:
  // Mounts `fs` at `mountpoint`. The FileSystem must outlive the mount.
  // Returns: the errors of PrepareMountpoint; FailedPrecondition (cannot mount).
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
