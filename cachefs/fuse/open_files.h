// OpenFiles: the kernel binding's table of open files, the one table of them on the node: per
// file handle (fh) the inode, the FileSystem's handle (its per-file read state) and whether the
// kernel reads it through passthrough; per inode its open counts and passthrough backing.
//
// Passthrough (Linux 6.9+): a file whose blocks are all resident is opened with its cache file
// as backing file (FileSystem::OpenBacking holds every block), so the kernel reads it directly
// with no request to this process. The hold lasts until the inode's last passthrough open is
// released, so eviction never punches a range the kernel reads, and then lingers kLinger with no
// open (still registered and held): a loader that opens the same files again and again (one open
// per record batch: MLPerf's resnet50 reader) reuses it instead of holding every block, opening
// the cache file and registering it again per open. Such a reuse is a new open like any other:
// it is passed through only when every block is still checked and the cache file unchanged
// since (Backing::still_checked: a block quarantined, a page check forgotten or a foreign change
// in the meantime ends the linger, and the open goes the way of a first open). At most
// kMaxLingering files linger (their blocks stay held; eviction skips them). The kernel refuses to
// mix cached and passthrough opens of one inode: an inode with a daemon-served open stays served by
// the daemon until that closes.
//
// Under a supervisor (supervisor.h) every open and release is reported to it, with the backing
// id a release leaves lingering, and the end of a linger; a successor closes the lingering ones
// (Restore), as it holds none of their blocks.
//
// No-open mode (MountOptions::no_open): OPEN is answered ENOSYS, after which the kernel opens
// every file of the mount without asking (and never sends RELEASE), with FOPEN_KEEP_CACHE. Reads
// then carry no fh: their per-file read state lives in a small table by inode (the most
// recently read kInodeStreams files), and there is no passthrough.
//
// Thread-safe; one mutex. FileSystem calls (Open, OpenBacking) and the destruction of handles
// and holds happen outside it. Under it: the backing ioctls on /dev/fuse, and the reports to
// the supervisor: they are sent in the order the table changed, which a successor's copy must
// follow (a release reported before its open would leave a stale open behind). Such a send
// waits only while the supervisor's socket buffer is full, which its loop drains at least every
// 100 ms; if the supervisor is gone it fails at once (EPIPE).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/filesystem.h"
#include "cachefs/fuse/mount_state.h"

namespace ember::cachefs {

class OpenFiles {
 public:
  // `fuse_fd`: the mount's /dev/fuse (for backing ioctls). `direct_io`, `no_open`: those of
  // MountOptions. The FileSystem must outlive this.
  OpenFiles(FileSystem* fs, int fuse_fd, bool direct_io, bool no_open = false);
  static constexpr size_t kInodeStreams = 1024;
  // How long a backing file stays registered (and its blocks held) after its last open closed.
  static constexpr std::chrono::seconds kLinger{5};
  static constexpr size_t kMaxLingering = 64;

  // No-open mode: OPEN is answered ENOSYS.
  bool no_open() const { return no_open_; }

  // What INIT negotiated (or the predecessor's INIT, after a takeover). `passthrough`: new opens
  // of resident files may use passthrough.
  void SetNegotiated(bool passthrough, bool direct_io_mmap);
  // Continues a predecessor's open files (takeover): a FileSystem handle per file served by the
  // daemon, and the blocks of every passthrough file held again. Returns: how many passthrough
  // files were held.
  size_t Restore(const KernelFuseState& state) ABSL_LOCKS_EXCLUDED(mu_);
  // Reports opens and releases to a supervisor on `sock` from now on.
  void SetSupervisor(int sock) ABSL_LOCKS_EXCLUDED(mu_);

  struct Opened {
    uint64_t fh = 0;
    uint32_t open_flags = 0;
    int32_t backing_id = 0;
  };
  // Opens `ino` (for writing only a volume's files: FileSystem::Open refuses the rest).
  // Returns: 0 and *out, or the errno to answer.
  int Open(uint64_t ino, int flags, Opened* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Registers a handle the FileSystem opened itself (CREATE). Volatile handles (volume files)
  // are served by this process without passthrough, without keeping the page cache of an
  // earlier open, and are not reported to a supervisor (a successor cannot continue a write).
  void Adopt(uint64_t ino, std::unique_ptr<FileSystem::FileHandle> handle, Opened* out)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns: the FileSystem's handle of an open file; nullptr if the file is unknown or read
  // through passthrough.
  std::shared_ptr<FileSystem::FileHandle> Handle(uint64_t fh) ABSL_LOCKS_EXCLUDED(mu_);
  // No-open mode: the read state of `ino`, made on its first read (nullptr if the FileSystem
  // cannot open it: the read then goes on without).
  std::shared_ptr<FileSystem::FileHandle> InodeHandle(uint64_t ino) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(uint64_t fh) ABSL_LOCKS_EXCLUDED(mu_);
  // Unregisters every backing file from the kernel (the mount is ending, not handed over).
  void CloseAllBacking() ABSL_LOCKS_EXCLUDED(mu_);

  // Adds next_fh, open_files and backing_ids to `state`.
  void Snapshot(KernelFuseState* state) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends `state` with this table's part to the supervisor (under the lock: no open or release
  // is reported before it). Returns: Ok (also without a supervisor); Unavailable.
  absl::Status ReportState(KernelFuseState state) ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    bool passthrough = false;  // negotiated and not disabled by a failure
    uint64_t passthrough_opens = 0;
    uint64_t daemon_opens = 0;
    uint64_t passthrough_files_open = 0;  // inodes read through a backing file now
    uint64_t backing_registrations = 0;   // backing files registered with the kernel
  };
  Stats GetStats() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Inode {
    int32_t backing_id = 0;
    uint32_t passthrough_opens = 0;       // open files reading through the backing file
    uint32_t cached_opens = 0;            // open files served by this process
    std::shared_ptr<const void> hold;     // the file's blocks, while backing_id is set
    std::function<bool()> still_checked;  // of `hold`: may a new open reuse the backing?
    // When the last passthrough open closed (the backing lingers from then), else unset.
    std::chrono::steady_clock::time_point idle_since{};
  };
  struct OpenRecord {
    uint64_t ino = 0;
    std::shared_ptr<FileSystem::FileHandle> handle;  // daemon-served opens
    bool passthrough = false;
  };
  void CloseBacking(int32_t id);
  // Ends the backing of an inode with no passthrough open: unregistered, its hold to `unhold`;
  // the inode is forgotten when nothing else is open.
  void EndBackingLocked(std::unordered_map<uint64_t, Inode>::iterator in,
                        std::vector<std::shared_ptr<const void>>* unhold)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the backing files that lingered kLinger unused; their holds go to `unhold` (released
  // by the caller after the lock).
  void SweepLocked(std::vector<std::shared_ptr<const void>>* unhold)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SnapshotLocked(KernelFuseState* state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  FileSystem* const fs_;
  const int fuse_fd_;
  const bool direct_io_;
  const bool no_open_;
  std::atomic<bool> passthrough_{false};  // new opens of resident files use passthrough
  std::atomic<bool> direct_io_mmap_{false};
  std::atomic<uint64_t> passthrough_opens_{0}, daemon_opens_{0}, backing_registrations_{0};

  absl::Mutex mu_;
  std::unordered_map<uint64_t, OpenRecord> opens_ ABSL_GUARDED_BY(mu_);  // by fh
  std::unordered_map<uint64_t, Inode> inodes_ ABSL_GUARDED_BY(mu_);      // with opens or a backing
  // Inodes whose backing lingers, oldest first, with their idle_since then.
  std::deque<std::pair<uint64_t, std::chrono::steady_clock::time_point>> lingering_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_fh_ ABSL_GUARDED_BY(mu_) = 1;
  // No-open mode: read state by inode, most recently read first.
  using StreamList = std::list<std::pair<uint64_t, std::shared_ptr<FileSystem::FileHandle>>>;
  StreamList streams_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, StreamList::iterator> stream_of_ ABSL_GUARDED_BY(mu_);
  int supervisor_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace ember::cachefs
