// FileSystem: what a lookup, stat, readdir, open or read of the mount returns, apart from any
// FUSE binding. Both bindings in fuse/ call it (the kernel-protocol binding, the default, and
// the libfuse one); DatasetFs implements it over the namespace and the read path. It lives at
// cachefs/ top because both sides use it: fuse/ calls it, fetch/ fills its ReadResult.
// Implementations are thread-safe.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cachefs/cache/block_buffer.h"
#include "common/status.h"

namespace ember::cachefs {

inline constexpr uint64_t kRootIno = 1;

// The mount's inode numbers are derived, never allocated: id << 48 | view << 32 | number. For a
// dataset: its id, 0 (latest) or the version (NAME@V), the manifest's file id (namespace.h); for
// a volume: its id, 0xffff, the inode in meta (volume/volume_fs.h). A restarted agent answers
// with the same numbers.
inline uint64_t MakeIno(uint32_t id, uint32_t view, uint64_t number) {
  return (static_cast<uint64_t>(id) << 48) | (static_cast<uint64_t>(view & 0xffff) << 32) |
         (number & 0xffffffffull);
}
inline void SplitIno(uint64_t ino, uint32_t* id, uint32_t* view, uint64_t* number) {
  *id = static_cast<uint32_t>(ino >> 48);
  *view = static_cast<uint32_t>((ino >> 32) & 0xffff);
  *number = ino & 0xffffffffull;
}

struct Attr {
  uint64_t ino = 0;
  uint32_t mode = 0;  // st_mode with type bits
  uint64_t size = 0;
  uint32_t nlink = 1;
  uint32_t uid = 0;
  uint32_t gid = 0;
  int64_t mtime_ns = 0;
  bool complete = true;  // false: only ino and type are known (readdirplus then skips it)
};

// The st_blksize to report for a file of `size` bytes: readers size their buffers by it (GNU cat
// allocates and unmaps one per file, Python's open() buffers by it), so a small file gets a
// small one (4 KiB up to its size rounded to a power of two), a large file 1 MiB.
inline uint32_t PreferredIoSize(uint64_t size) {
  constexpr uint64_t kMin = 4096, kMax = 1 << 20;
  uint64_t b = kMin;
  while (b < size && b < kMax) b <<= 1;
  return static_cast<uint32_t>(b);
}

struct Entry {
  Attr attr;
  double timeout_s = 0;  // how long the kernel may cache the entry and its attributes
};

// One piece of a read reply, in memory: either in the caller's reply buffer (bytes from the
// cache, copied there once checked), at the offset the piece has in the reply, or in a buffer of
// a block just filled (kept alive by ReadResult::holds).
struct Segment {
  const char* data = nullptr;
  size_t len = 0;
};

// The bytes of a read, in order. Holds whatever keeps them valid until destroyed: destroy it only
// after the reply has been sent.
struct ReadResult {
  std::vector<Segment> segments;
  size_t total = 0;
  std::vector<std::shared_ptr<const void>> holds;
};

struct FsStats {
  uint64_t total_bytes = 0;
  uint64_t files = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Returns: the entry, NotFound, or an errno status (ENOTDIR).
  virtual absl::StatusOr<Entry> Lookup(uint64_t parent, const std::string& name) = 0;
  // Returns: the entry, NotFound.
  virtual absl::StatusOr<Entry> GetAttr(uint64_t ino) = 0;
  // Calls fn(name, attr, next_offset) for entries from `offset` on, until fn returns false.
  // Offsets are opaque cookies: 0 starts, next_offset resumes after that entry.
  // Returns: Ok, NotFound, ENOTDIR.
  virtual absl::Status ReadDir(
      uint64_t ino, uint64_t offset,
      const std::function<bool(const std::string& name, const Attr& attr, uint64_t next)>& fn) = 0;
  // Returns: the link's target; EINVAL (not a symlink), NotFound.
  virtual absl::StatusOr<std::string> ReadLink(uint64_t ino) = 0;

  // What the file system keeps per open file (e.g. its readahead state). The binding owns it
  // from Open until the kernel releases the file, in its table of open files, and destroys it
  // then: there is no other table of open files.
  class FileHandle {
   public:
    virtual ~FileHandle() = default;
    // A file whose contents may change (a volume's): opened without the kernel's page cache kept
    // from before, never through passthrough, and with a FLUSH at close.
    virtual bool Volatile() const { return false; }
    // A volatile file opened for writing, or for reading while its contents are copied to this
    // node: its reads and writes go past the mount's page cache (FOPEN_DIRECT_IO): a save's or a
    // restore's bytes are not copied into pages the kernel keeps for the mount's inode (one copy
    // less, and no page cache filled with what the node stores anyway).
    virtual bool Uncached() const { return false; }
  };
  // Opens a file for reading. Returns: its handle; EROFS for write access, EISDIR, EINVAL (not
  // a regular file), NotFound.
  virtual absl::StatusOr<std::unique_ptr<FileHandle>> Open(uint64_t ino, int flags) = 0;
  // Reads [offset, offset+size) clipped to the file size. `handle`: from Open of this inode, or
  // null for a file the binding has no handle of (opened before a restart): then the read has
  // no per-file state. `buf`: room for `size` bytes where bytes from the cache are copied (the
  // reply buffer; a segment there sits at its offset in the reply). May be called concurrently
  // on one handle. Returns: the bytes; EIO when they cannot be had correctly (origin gone or
  // changed, a bad cache block with no other source); never wrong bytes.
  virtual absl::StatusOr<ReadResult> Read(uint64_t ino, FileHandle* handle, uint64_t offset,
                                          size_t size, char* buf) = 0;

  // A file whose every block is resident and checked: a fd of the cache file holding it, which
  // the kernel may read directly (passthrough), and what keeps its blocks from being evicted or
  // punched while it lives. `verified_only` false (a takeover re-holding files the kernel already
  // reads directly): holds the blocks whether or not they are checked. Returns: NotFound when
  // some block is not resident or not checked (read through Read).
  struct Backing {
    int fd = -1;  // valid while `hold` lives
    std::shared_ptr<const void> hold;
    // While `hold` lives: true when every block is still checked and the file unchanged since
    // (what a later open of the same backing needs before the kernel reads it again).
    std::function<bool()> still_checked;
  };
  virtual absl::StatusOr<Backing> OpenBacking(uint64_t /*ino*/, bool /*verified_only*/ = true) {
    return absl::NotFoundError("this file system has no backing files");
  }
  virtual FsStats StatFs() = 0;

  // ---- changes: only a writable volume's files and directories (cachefs/volume/) take them;
  // the defaults answer EROFS (datasets are read-only) ----
  // Creates and opens a file (O_CREAT). Returns: its entry and handle; EEXIST (O_EXCL), EROFS.
  virtual absl::StatusOr<std::pair<Entry, std::unique_ptr<FileHandle>>> Create(
      uint64_t /*parent*/, const std::string& /*name*/, uint32_t /*mode*/, int /*flags*/,
      uint32_t /*uid*/, uint32_t /*gid*/) {
    return ReadOnly();
  }
  virtual absl::StatusOr<Entry> MkDir(uint64_t /*parent*/, const std::string& /*name*/,
                                      uint32_t /*mode*/, uint32_t /*uid*/, uint32_t /*gid*/) {
    return ReadOnly();
  }
  virtual absl::Status Unlink(uint64_t /*parent*/, const std::string& /*name*/) {
    return ReadOnly();
  }
  virtual absl::Status RmDir(uint64_t /*parent*/, const std::string& /*name*/) {
    return ReadOnly();
  }
  // `flags`: RENAME_NOREPLACE or 0 (RENAME_EXCHANGE: EINVAL).
  virtual absl::Status Rename(uint64_t /*parent*/, const std::string& /*name*/,
                              uint64_t /*new_parent*/, const std::string& /*new_name*/,
                              uint32_t /*flags*/) {
    return ReadOnly();
  }
  // Writes at `offset` of a file opened for writing. Returns: bytes written; EBADF (not open
  // for writing), ENOSPC, EIO.
  virtual absl::StatusOr<size_t> Write(uint64_t /*ino*/, FileHandle* /*handle*/,
                                       uint64_t /*offset*/, const char* /*data*/, size_t /*size*/) {
    return ReadOnly();
  }
  // close() (FLUSH) and fsync: return when what was written through `handle` is committed as
  // the volume promises (volume_fs.h). Ok for a handle with nothing written.
  virtual absl::Status Flush(uint64_t /*ino*/, FileHandle* /*handle*/) { return absl::OkStatus(); }
  virtual absl::Status Fsync(uint64_t /*ino*/, FileHandle* /*handle*/) { return absl::OkStatus(); }
  struct SetAttrs {
    std::optional<uint64_t> size;
    std::optional<uint32_t> mode;
    std::optional<int64_t> mtime_ns;
    std::optional<uint32_t> uid, gid;
  };
  // `handle`: the open file the change came through, if any. Returns: the new attributes.
  virtual absl::StatusOr<Entry> SetAttr(uint64_t /*ino*/, FileHandle* /*handle*/,
                                        const SetAttrs& /*attrs*/) {
    return ReadOnly();
  }
  // An extended attribute (a volume file's `user.ember.state`). Returns: its value; ENODATA.
  virtual absl::StatusOr<std::string> GetXattr(uint64_t /*ino*/, const std::string& /*name*/) {
    return NoData();
  }
  // Whether `ino` may be changed (ACCESS with W_OK).
  virtual bool Writable(uint64_t /*ino*/) { return false; }

 protected:
  static absl::Status ReadOnly() {
    return ErrnoStatus(EROFS, "read-only: datasets cannot be changed (volumes can)");
  }
  static absl::Status NoData() { return ErrnoStatus(ENODATA, "no such attribute"); }
};

}  // namespace ember::cachefs
