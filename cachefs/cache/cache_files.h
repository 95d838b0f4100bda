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

#include "common/ids.h"

namespace ember::cachefs {

// Reads exactly len bytes at offset (retrying short reads and EINTR). Returns: false on an error
// or EOF.
bool PreadFull(int fd, uint64_t offset, size_t len, char* buf);

class CacheFiles {
 public:
  // `direct_writes`: write the 4 KiB-aligned part of blocks with O_DIRECT (see
  // BlockCache::Options::direct_writes).
  CacheFiles(std::string dir, bool direct_writes);

  // The cache file holding the blocks of addr's dataset file and version.
  std::string FilePath(const BlockAddr& addr) const;

  // Writes a block's bytes at `offset` of its cache file (created, and grown to `file_size`, as
  // needed). A failed write leaves its range punched. Returns: 0, or the errno of the failure
  // (ENOSPC / EDQUOT for a full disk).
  int WriteBlock(const BlockAddr& addr, uint64_t file_size, uint64_t offset, std::string_view data);
  // Frees a block's range of its cache file (fallocate PUNCH_HOLE); logs a failure.
  void PunchHole(const BlockAddr& addr, uint64_t offset, uint32_t length);

  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  std::atomic<bool> direct_writes_;  // cleared when the file system refuses O_DIRECT
};

}  // namespace ember::cachefs
