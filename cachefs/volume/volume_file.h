// VolumeFs::File, an open file of a volume (cachefs/volume/, front door volume_fs.h): private to
// the volume's .cc files (volume_fs.cc: writes and commits; volume_fetch.cc: reads).
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/volume/volume_fs.h"
#include "cachefs/volume/volume_stream.h"
#include "common/ids.h"

namespace ember::cachefs {

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// An open file of a volume. Read-only: the contents it opened (a later commit elsewhere is seen
// by the next open). For writing: the staging file of the lease's contents id, committed by
// Flush/Fsync; a write after a commit starts a new staging file from the committed contents.
class VolumeFs::File final : public FileSystem::FileHandle {
 public:
  File(VolumeFs* fs, Ref at, uint64_t fuse_ino, uint64_t block_size)
      : fs_(fs), at_(std::move(at)), fuse_ino_(fuse_ino), block_size_(block_size) {}
  ~File() override;
  bool Volatile() const override { return true; }
  // Writers, and readers of contents not on this disk (read from the holders as they read, or
  // copied here as they read): a page cache of the mount's inode would be a second copy of
  // bytes this node does not read from it (the volume's `Volatile` contents are checked at open).
  bool Uncached() const override { return writable_ || copying_; }

  VolumeFs* const fs_;
  const Ref at_;
  const uint64_t fuse_ino_;
  const uint64_t block_size_;
  bool writable_ = false;
  bool copying_ = false;  // opened for reading while its contents are not here
  // Reading contents this node lacks from the holders, with no copy here (set at the open).
  std::unique_ptr<VolumeStream> stream_;

  absl::Mutex mu_;
  // Reading: the contents opened or last committed (null: empty, or still being copied).
  std::shared_ptr<const VolumeStore::Whole> whole_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> checked_ ABSL_GUARDED_BY(mu_);  // per block of whole_
  // Contents being copied from a holder at the open (whole_ is set once the copy is whole).
  std::shared_ptr<Copy> copy_ ABSL_GUARDED_BY(mu_);
  uint64_t copy_size_ ABSL_GUARDED_BY(mu_) = 0;
  int copy_fd_ ABSL_GUARDED_BY(mu_) = -1;           // the copy's file, for blocks already in it
  uint64_t copy_attempt_ ABSL_GUARDED_BY(mu_) = 0;  // Copy::attempt copy_fd_ was opened at
  // Writing.
  int fd_ ABSL_GUARDED_BY(mu_) = -1;  // staging of writing_id_, or -1 (none yet)
  void CloseStagingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    close(fd_);
    fd_ = -1;
  }
  uint64_t writing_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t whole_id_ ABSL_GUARDED_BY(mu_) = 0;  // the contents id whole_ holds
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  int64_t renewed_ms_ ABSL_GUARDED_BY(mu_) = NowMs();  // the lease was taken or renewed
  // Checksums of a staging file written from offset 0 straight on (a checkpoint's save): the
  // blocks so far, so that its commit need not read it again. Any other write gives them up.
  bool seq_ok_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t seq_end_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> seq_sums_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<BlockChecksummer> seq_block_ ABSL_GUARDED_BY(mu_);
  Ahead ahead_ ABSL_GUARDED_BY(mu_);  // whole blocks of seq_sums_ copied ahead by replicas
  void HashLocked(uint64_t offset, const char* data, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checksums of every block when the staging file was written straight on, else null.
  std::optional<std::vector<uint64_t>> KnownSumsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Renews the write lease when a third of it has passed (a long save outlives one lease).
  absl::Status RenewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The staging file, made from the committed contents when a write follows a commit.
  absl::Status StageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t SizeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SizeLocked() as of the last change through this handle, for a stat of the inode, which
  // must not wait for this handle's lock (held through a commit's sync).
  std::atomic<uint64_t> size_{0};
  absl::Status CommitLocked(bool keep_lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A commit failed after its contents were sealed (and maybe copied): writes go on under a
  // new contents id from meta, the staging file renamed to it.
  bool rekey_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status RekeyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace ember::cachefs
