// KernelFuse: a FUSE binding that reads and answers /dev/fuse itself (the kernel protocol of
// linux/fuse.h) for what a read-only file system needs, calling the same FileSystem as the
// libfuse binding (fuse_mount.h). libfuse still mounts. Over libfuse 3.14 it adds:
//
//  - Passthrough (Linux 6.9+, FUSE_PASSTHROUGH): a file whose blocks are all resident is opened
//    with the cache file as its backing file, so the kernel reads it directly, at local-disk
//    speed, with no request to this process. Its blocks stay pinned (never evicted or punched)
//    until the last such open is released. Partially resident files go through the daemon.
//  - Takeover: Quiesce() stops serving once in-flight requests are answered and returns the
//    /dev/fuse fd with what the kernel already knows (negotiated INIT, open files and their
//    backing ids); Adopt() continues the same mount from it in another process, no new INIT.
//    Inode numbers come from manifests, so they mean the same in the successor.
//
// Threads: one per cloned /dev/fuse fd (FUSE_DEV_IOC_CLONE), each reading and answering requests.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "cachefs/filesystem.h"
#include "cachefs/fuse_mount.h"
#include "cachefs/fuse_uring.h"

struct fuse_session;

namespace ember::cachefs {

// What a successor needs to continue serving a mount (sent over a unix socket, takeover.h).
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

class KernelFuse final : public MountBinding {
 public:
  // Mounts `fs` at `mountpoint` (INIT is answered by Run()). The FileSystem must outlive this.
  static absl::StatusOr<std::unique_ptr<KernelFuse>> Mount(FileSystem* fs,
                                                           const std::string& mountpoint,
                                                           const MountOptions& options);
  // Continues a mount from a predecessor's state. Files open in passthrough are pinned again
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
  // Reports the mount and every passthrough open/release to a supervisor (takeover.h) over
  // `sock`, so the mount survives a crash of this process. Call before Run().
  void SetSupervisor(int sock) { supervisor_ = sock; }
  // Where a reply goes (a /dev/fuse fd or a ring entry); defined in the .cc.
  struct Channel;

  struct Stats {
    bool passthrough = false;  // negotiated and not disabled by a failure
    uint64_t passthrough_opens = 0;
    uint64_t daemon_opens = 0;
    uint64_t passthrough_files_open = 0;  // inodes with a backing file now
  };
  Stats GetStats();

 private:
  struct Inode {
    int32_t backing_id = 0;
    uint32_t passthrough_opens = 0;    // open files reading through the backing file
    uint32_t cached_opens = 0;         // open files served by this process
    std::shared_ptr<const void> hold;  // pins of the file's blocks while backing_id is set
  };
  struct Open {
    uint64_t ino = 0;
    uint64_t fs_handle = 0;
    bool passthrough = false;
  };

  KernelFuse() = default;
  bool HandleInit();
  void Serve(int fd);
  void Dispatch(const Channel& ch, const char* msg, size_t len, std::vector<char>* scratch);
  // Ends the ring threads, if any.
  void StopUring();
  // Opens ino for reading; fills open_flags/backing id. Returns errno (0 = ok).
  int OpenFile(uint64_t ino, int flags, uint64_t* fh, uint32_t* open_flags, int32_t* backing_id);
  void ReleaseFile(uint64_t fh);
  void CloseBacking(int32_t id);
  // REQUIRES: mu_ held. What a successor needs; fd is fd_ itself (callers dup or send it).
  KernelFuseState StateLocked();

  FileSystem* fs_ = nullptr;
  MountOptions options_;
  std::string mountpoint_;
  fuse_session* session_ = nullptr;  // libfuse, for mounting and unmounting only
  int fd_ = -1;
  int supervisor_ = -1;
  bool adopted_ = false;
  uint32_t proto_minor_ = 0;
  std::atomic<bool> passthrough_{false};  // new opens of resident files use passthrough
  bool negotiated_passthrough_ = false;   // the kernel agreed at INIT (kept across takeovers)
  bool direct_io_mmap_ = false;           // FUSE_DIRECT_IO_ALLOW_MMAP agreed at INIT
  std::atomic<bool> stopping_{false};
  std::atomic<bool> quiescing_{false};
  std::atomic<bool> unmounted_{false};
  std::vector<std::thread> workers_;
  std::unique_ptr<FuseUring> uring_;  // requests over io_uring (--fuse-uring), if started
  // Workers block in read(2): the kernel wakes one of them per request (poll(2) woke all 16).
  // To stop them, Run() signals each (kWakeSignal, no SA_RESTART) until all have returned.
  std::mutex workers_mu_;
  std::condition_variable workers_cv_;
  int live_workers_ = 0;  // GUARDED_BY(workers_mu_)
  std::condition_variable served_cv_;
  bool served_done_ = false;  // GUARDED_BY(mu_): Run() has ended

  std::mutex mu_;
  std::unordered_map<uint64_t, Open> opens_;    // GUARDED_BY(mu_), by fh
  std::unordered_map<uint64_t, Inode> inodes_;  // GUARDED_BY(mu_), files with open handles
  uint64_t next_fh_ = 1;                        // GUARDED_BY(mu_)
  std::atomic<uint64_t> passthrough_opens_{0}, daemon_opens_{0};
};

}  // namespace ember::cachefs
