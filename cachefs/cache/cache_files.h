// CacheFiles: the cache's files on disk, `DIR/blocks/<dataset>/<version>/<file>`: one sparse file
// per dataset file and version, each block at its natural offset. Writes a block's bytes (with
// O_DIRECT where the file system takes it), punches the range of a block that leaves, and reads
// bytes back for verification. Knows nothing of the index or of which blocks are resident
// (BlockCache decides; this only does the I/O).
//
// Thread-safe: no shared state but the O_DIRECT switch (an atomic, cleared once the file system
// refuses O_DIRECT).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/file_io.h"
#include "common/ids.h"

namespace ember::cachefs {

// PreadFull (reads exactly len bytes at offset) is in common/file_io.h.
// The same, only from the page cache (preadv2 RWF_NOWAIT). Returns: false when any byte would
// have to come from the disk (or on an error).
bool PreadCached(int fd, uint64_t offset, size_t len, char* buf);
// Whether every page of [offset, offset+len) of the file is in the page cache now (the
// cachestat syscall, Linux 6.5+). Returns: false when not, or when that cannot be told.
bool PagesCached(int fd, uint64_t offset, size_t len);
// The file's ctime in nanoseconds (0 if fstat fails): it changes with every write, truncate or
// hole punch, whoever makes it.
uint64_t ChangeStamp(int fd);

class CacheFiles {
 public:
  // `direct_writes`: write the 4 KiB-aligned part of blocks with O_DIRECT (see
  // BlockCache::Options::direct_writes).
  CacheFiles(std::string dir, bool direct_writes);

  // The cache file holding the blocks of addr's dataset file and version.
  std::string FilePath(const BlockAddr& addr) const;

  // Writes a block's bytes at `offset` of its cache file (created, and grown to `file_size`, as
  // needed). A failed write leaves its range punched. *stamp gets the file's ChangeStamp after
  // the write. Returns: 0, or the errno of the failure (ENOSPC / EDQUOT for a full disk).
  int WriteBlock(const BlockAddr& addr, uint64_t file_size, uint64_t offset, std::string_view data,
                 uint64_t* stamp);
  // Frees a block's range of its cache file (fallocate PUNCH_HOLE); logs a failure.
  // Returns: the file's ChangeStamp after it (0 if the file cannot be opened).
  uint64_t PunchHole(const BlockAddr& addr, uint64_t offset, uint32_t length);
  // Reads [offset, offset+len) of a block's cache file from the disk, past the page cache
  // (O_DIRECT; buffered where the file system refuses it) into buf, which must be
  // BlockBuffer-aligned with room for len rounded up to 4 KiB. Returns: false on an error.
  bool ReadFromDisk(const BlockAddr& addr, uint64_t offset, size_t len, char* buf);

  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  std::atomic<bool> direct_writes_;  // cleared when the file system refuses O_DIRECT
};

}  // namespace ember::cachefs
