// DatasetFs: the FileSystem of a node's mount. The root lists datasets; below it, entries come
// from immutable manifests (Namespace) and bytes from the ReadPath (fetch/read_path.h). An open
// file's handle is its ReadStream (readahead window, block visits), kept by the FUSE binding.
// The root also lists writable volumes: their names and every inode below them go to VolumeFs
// (cachefs/volume/volume_fs.h), the only part of the mount that takes changes.
// Thread-safe; no state of its own besides what it was given.
#pragma once

#include <memory>

#include "cachefs/fetch/read_path.h"
#include "cachefs/filesystem.h"
#include "cachefs/namespace.h"
#include "cachefs/volume/volume_fs.h"

namespace ember::cachefs {

// What the read path needs to fill blocks of one file of a loaded view.
FileRef MakeFileRef(const DatasetView& view, uint64_t file_id);

class DatasetFs final : public FileSystem {
 public:
  // All must outlive this. `volumes`: null for a mount without volumes.
  DatasetFs(Namespace* ns, ReadPath* read_path, VolumeFs* volumes = nullptr);

  absl::StatusOr<Entry> Lookup(uint64_t parent, const std::string& name) override;
  absl::StatusOr<Entry> GetAttr(uint64_t ino) override;
  absl::Status ReadDir(
      uint64_t ino, uint64_t offset,
      const std::function<bool(const std::string&, const Attr&, uint64_t)>& fn) override;
  absl::StatusOr<std::string> ReadLink(uint64_t ino) override;
  absl::StatusOr<std::unique_ptr<FileHandle>> Open(uint64_t ino, int flags) override;
  absl::StatusOr<ReadResult> Read(uint64_t ino, FileHandle* handle, uint64_t offset, size_t size,
                                  char* buf) override;
  absl::StatusOr<Backing> OpenBacking(uint64_t ino, bool verified_only) override;
  FsStats StatFs() override;

  // Changes: volumes only (EROFS elsewhere).
  absl::StatusOr<std::pair<Entry, std::unique_ptr<FileHandle>>> Create(uint64_t parent,
                                                                       const std::string& name,
                                                                       uint32_t mode, int flags,
                                                                       uint32_t uid,
                                                                       uint32_t gid) override;
  absl::StatusOr<Entry> MkDir(uint64_t parent, const std::string& name, uint32_t mode, uint32_t uid,
                              uint32_t gid) override;
  absl::Status Unlink(uint64_t parent, const std::string& name) override;
  absl::Status RmDir(uint64_t parent, const std::string& name) override;
  absl::Status Rename(uint64_t parent, const std::string& name, uint64_t new_parent,
                      const std::string& new_name, uint32_t flags) override;
  absl::StatusOr<size_t> Write(uint64_t ino, FileHandle* handle, uint64_t offset, const char* data,
                               size_t size) override;
  absl::Status Flush(uint64_t ino, FileHandle* handle) override;
  absl::Status Fsync(uint64_t ino, FileHandle* handle) override;
  absl::StatusOr<Entry> SetAttr(uint64_t ino, FileHandle* handle, const SetAttrs& attrs) override;
  absl::StatusOr<std::string> GetXattr(uint64_t ino, const std::string& name) override;
  bool Writable(uint64_t ino) override;

  // Entries and attributes below the root never change (manifests are immutable).
  static constexpr double kImmutableTimeout = 3600;
  // The root's listing follows `ember dataset add/rm`.
  static constexpr double kRootTimeout = 1;

 private:
  // An open file: its reading state.
  struct File final : FileHandle {
    explicit File(std::unique_ptr<ReadStream> s) : stream(std::move(s)) {}
    std::unique_ptr<ReadStream> stream;
  };

  // Up to `max` small files (one block each) after file `ino` in its folder, in name order.
  std::vector<FileRef> NextSmallFiles(uint64_t ino, size_t max);
  // Resolves a non-root inode. Returns: NotFound.
  absl::StatusOr<std::pair<std::shared_ptr<const DatasetView>, FsNode>> Resolve(uint64_t ino);
  static Attr AttrOf(const DatasetView& view, uint64_t file_id, const FsNode& node);
  static Attr RootAttr();

  bool IsVolume(uint64_t ino) const { return volumes_ != nullptr && VolumeFs::IsVolumeIno(ino); }

  Namespace* const ns_;
  ReadPath* const read_path_;
  VolumeFs* const volumes_;
};

}  // namespace ember::cachefs
