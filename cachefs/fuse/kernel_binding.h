// KernelFuse: the default FUSE binding. It reads and answers /dev/fuse itself (the kernel
// protocol of linux/fuse.h) for what a read-only file system needs, calling the same FileSystem
// as the libfuse binding (libfuse_binding.h); libfuse still mounts. Over libfuse 3.14 it adds:
//
//  - Passthrough (Linux 6.9+, FUSE_PASSTHROUGH): a file whose blocks are all resident is read by
//    the kernel from its cache file, with no request to this process (open_files.h).
//  - Takeover: Quiesce() stops serving once in-flight requests are answered and returns the
//    /dev/fuse fd with what the kernel already knows (negotiated INIT, open files and their
//    backing ids); Adopt() continues the same mount from it in another process, no new INIT.
//    Inode numbers come from manifests, so they mean the same in the successor (takeover.h,
//    supervisor.h).
//  - Requests over io_uring (--fuse-uring, fuse_uring.h).
//
// The session (kernel_session.cc): mount, INIT, one worker thread per cloned /dev/fuse fd
// (FUSE_DEV_IOC_CLONE), each reading and answering requests; stop and quiesce. The requests
// (kernel_ops.h): one function per opcode, each ending in exactly one reply. The open files:
// OpenFiles (open_files.h), the one table of them.
//
// Thread-safe. Lock order: the session's mutex and the open-file table's are never held
// together.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/filesystem.h"
#include "cachefs/fuse/binding.h"
#include "cachefs/fuse/fuse_uring.h"
#include "cachefs/fuse/mount_state.h"
#include "cachefs/fuse/open_files.h"

struct fuse_session;

namespace ember::cachefs {

class KernelFuse final : public MountBinding {
 public:
  // Mounts `fs` at `mountpoint` (INIT is answered by Run()). The FileSystem must outlive this.
  // Returns: the errors of PrepareMountpoint; FailedPrecondition (cannot mount).
  static absl::StatusOr<std::unique_ptr<KernelFuse>> Mount(FileSystem* fs,
                                                           const std::string& mountpoint,
                                                           const MountOptions& options);
  // Continues a mount from a predecessor's state. Files open in passthrough are held again
  // before this returns. Takes ownership of state.fd.
  static absl::StatusOr<std::unique_ptr<KernelFuse>> Adopt(FileSystem* fs, KernelFuseState state,
                                                           const MountOptions& options);
  ~KernelFuse() override;

  // Serves requests until Stop(), Quiesce() or an external unmount.
  void Run() override;
  void Stop() override;
  // Stops serving (in-flight requests are answered first); the mount stays and Run() returns.
  // The returned fd is this object's; it stays open until this object is destroyed.
  KernelFuseState Quiesce();
  // Reports the mount and every open and release to a supervisor (supervisor.h) over `sock`,
  // so the mount survives a crash of this process; with it goes `peer_listener` (the agent's
  // listening peer socket, not owned; -1: none), which a restarted agent serves on. Call before
  // Run().
  void SetSupervisor(int sock, int peer_listener);

  using Stats = OpenFiles::Stats;
  Stats GetStats() { return files_->GetStats(); }

 private:
  KernelFuse() = default;
  // Answers INIT. Returns: false if the kernel's INIT could not be read or answered.
  bool HandleInit();
  // A worker: reads requests from `fd` and answers them until stopped or unmounted.
  void Serve(int fd);
  // Ends the ring threads, if any.
  void StopUring();
  // What a successor needs apart from the open files; fd is fd_ itself, peer_listen_fd the
  // supervisor's copy's (not owned).
  KernelFuseState SessionState() const;

  FileSystem* fs_ = nullptr;
  MountOptions options_;
  std::string mountpoint_;
  fuse_session* session_ = nullptr;  // libfuse, for mounting and unmounting only
  int fd_ = -1;
  int supervisor_ = -1;
  int peer_listener_ = -1;  // sent to the supervisor with the mount (not owned)
  bool adopted_ = false;
  std::unique_ptr<OpenFiles> files_;
  // Negotiated at INIT (by this process or its predecessor); set before serving.
  uint32_t proto_minor_ = 0;
  bool negotiated_passthrough_ = false;  // kept across takeovers
  bool direct_io_mmap_ = false;          // FUSE_DIRECT_IO_ALLOW_MMAP
  std::atomic<bool> stopping_{false};
  std::atomic<bool> quiescing_{false};
  std::atomic<bool> unmounted_{false};
  std::vector<std::thread> workers_;
  std::unique_ptr<FuseUring> uring_;  // requests over io_uring (--fuse-uring), if started

  // Workers block in read(2): the kernel wakes one of them per request (poll(2) woke all 16).
  // To stop them, Run() signals each (kWakeSignal, no SA_RESTART) until all have returned.
  absl::Mutex mu_;
  absl::CondVar cv_;  // a worker ended, Stop/Quiesce asked, or Run() ended
  int live_workers_ ABSL_GUARDED_BY(mu_) = 0;
  bool served_done_ ABSL_GUARDED_BY(mu_) = false;  // Run() has ended
};

}  // namespace ember::cachefs
