// CacheFiles: the cache's files on disk. Two kinds:
//  - `DIR/blocks/<dataset>/<version>/<file>`: one sparse file per dataset file and version, each
//    block at its natural offset (what passthrough hands the kernel). Written with O_DIRECT where
//    the file system takes it.
//  - `DIR/segments/<n>`: small-object segments. A small file's only block is appended to the
//    active segment (64 MiB, then the next one), packed end to end: no file to create, open,
//    size and close per small file. The objects a batch stores together are one run: a run of
//    64 KiB or more starts at a 4 KiB boundary and is written with O_DIRECT from a 2 MiB
//    buffer; a shorter one goes through the page cache, whose writeback is started every 8 MiB,
//    so the disk sees large sequential writes either way (O_DIRECT per object measured no
//    better: each a small synchronous write). Space of an object that leaves is freed by punching
//    its range (a page shared with a live neighbour stays allocated until both are gone); a segment
//    with nothing left in it is deleted.
// Writes a block's bytes, punches the range of a block that leaves, and reads bytes back for
// verification. Knows nothing of the index or of which blocks are resident (BlockCache decides;
// this only does the I/O). `segment` 0 means a block in its file's own cache file.
//
// Thread-safe: the O_DIRECT switch is an atomic (cleared once the file system refuses O_DIRECT);
// the active segment has its own mutex, held only to claim a range.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/file_io.h"
#include "common/ids.h"

namespace ember::cachefs {

// PreadFull (reads exactly len bytes at offset) is in common/file_io.h.
// The same, only from the page cache (preadv2 RWF_NOWAIT). Returns: false when any byte would
// have to come from the disk (or on an error).
bool PreadCached(int fd, uint64_t offset, size_t len, char* buf);
// PagesCached (whether a range is all in the page cache) is in common/file_io.h.
// The file's ctime in nanoseconds (0 if fstat fails): it changes with every write, truncate or
// hole punch, whoever makes it.
uint64_t ChangeStamp(int fd);

class CacheFiles {
 public:
  static constexpr uint64_t kSegmentBytes = 64u << 20;  // a segment is closed past this

  // `direct_writes`: write the 4 KiB-aligned part of blocks with O_DIRECT (see
  // BlockCache::Options::direct_writes). New segments are numbered after those already there.
  CacheFiles(std::string dir, bool direct_writes);

  // The cache file holding the block: its file's own, or segment `segment` when not 0.
  std::string FilePath(const BlockAddr& addr, uint32_t segment = 0) const;
  std::string SegmentPath(uint32_t segment) const;

  // Writes a block's bytes at `offset` of its cache file (created, and grown to `file_size`, as
  // needed). A failed write leaves its range punched. *stamp gets the file's ChangeStamp after
  // the write. Returns: 0, or the errno of the failure (ENOSPC / EDQUOT for a full disk).
  int WriteBlock(const BlockAddr& addr, uint64_t file_size, uint64_t offset, std::string_view data,
                 uint64_t* stamp);
  // Where a small object goes: a range of the active segment, claimed by ClaimSmall (nothing is
  // written yet: a claimed range never written stays a hole) and written by WriteSmallRun.
  struct SmallSlot {
    uint32_t segment = 0;
    uint64_t offset = 0;
    std::shared_ptr<const int> fd;         // the segment's, open for writing
    std::shared_ptr<const int> direct_fd;  // the same with O_DIRECT; set only in a direct run
  };
  // A run of objects claimed together that is this long or longer is written with O_DIRECT.
  static constexpr uint64_t kDirectRunMin = 64u << 10;
  // Claims slots for objects of `lens`, in order, one after the other in the active segment (the
  // next one when it is full). A run of kDirectRunMin bytes or more, with O_DIRECT writes on,
  // starts at a 4 KiB boundary and keeps the room to the boundary after it: a direct run, whose
  // slots have direct_fd. Returns: 0, or the errno of creating the next segment.
  int ClaimSmall(const std::vector<size_t>& lens, std::vector<SmallSlot>* slots)
      ABSL_LOCKS_EXCLUDED(seg_mu_);
  // Writes objects whose slots follow each other in one segment (claimed one after the other):
  // a direct run's copied into 2 MiB buffers and written with O_DIRECT, padded with zeros to its
  // 4 KiB boundary (the page cache never holds them: on this VM a first touch of each new
  // page-cache page costs an exit, half of a prefetch's CPU); others with one vectored write
  // through the page cache. *stamp is the segment's ChangeStamp after it. A failed write leaves
  // the whole run punched. Returns: 0, or the errno of the failure.
  int WriteSmallRun(const std::vector<const SmallSlot*>& slots,
                    const std::vector<std::string_view>& data, uint64_t* stamp);
  // The segment appends go to now (0 before the first append).
  uint32_t ActiveSegment() ABSL_LOCKS_EXCLUDED(seg_mu_);
  // Deletes a segment nothing lives in any more (never the active one). Returns: false if it is
  // the active segment (kept).
  bool RemoveSegment(uint32_t segment) ABSL_LOCKS_EXCLUDED(seg_mu_);
  // Frees a block's range of its cache file (fallocate PUNCH_HOLE); logs a failure.
  // Returns: the file's ChangeStamp after it (0 if the file cannot be opened).
  uint64_t PunchHole(const BlockAddr& addr, uint32_t segment, uint64_t offset, uint32_t length);
  // Reads [offset, offset+len) of a block's cache file from the disk, past the page cache
  // (O_DIRECT; buffered where the file system refuses it) into buf, which must be
  // BlockBuffer-aligned with room for len rounded up to 4 KiB. Returns: false on an error.
  bool ReadFromDisk(const BlockAddr& addr, uint32_t segment, uint64_t offset, size_t len,
                    char* buf);

  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  std::atomic<bool> direct_writes_;  // cleared when the file system refuses O_DIRECT

  absl::Mutex seg_mu_;
  uint32_t last_segment_ ABSL_GUARDED_BY(seg_mu_) = 0;             // the highest number used
  uint32_t active_ ABSL_GUARDED_BY(seg_mu_) = 0;                   // 0: none open yet
  uint64_t active_end_ ABSL_GUARDED_BY(seg_mu_) = 0;               // where the next append goes
  std::shared_ptr<const int> active_fd_ ABSL_GUARDED_BY(seg_mu_);  // kept open while active
  std::shared_ptr<const int> active_direct_fd_ ABSL_GUARDED_BY(seg_mu_);  // null: no O_DIRECT

  // Starts the next segment (under seg_mu_). Returns: 0 or an errno.
  int NextSegmentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(seg_mu_);
  // WriteSmallRun's O_DIRECT write of a direct run. Returns: 0 or an errno.
  int WriteDirectRun(int fd, uint64_t start, const std::vector<std::string_view>& data);
};

}  // namespace ember::cachefs
