// DatasetFs: the FileSystem of a node's mount. The root lists datasets; below it, entries come
// from immutable manifests (Namespace) and bytes from the ReadPath (fetch/read_path.h). An open
// file's handle is its ReadStream (readahead window, block visits), kept by the FUSE binding.
// Thread-safe; no state of its own besides what it was given.
#pragma once

#include <memory>

#include "cachefs/fetch/read_path.h"
#include "cachefs/filesystem.h"
#include "cachefs/namespace.h"

namespace ember::cachefs {

// What the read path needs to fill blocks of one file of a loaded view.
FileRef MakeFileRef(const DatasetView& view, uint64_t file_id);

class DatasetFs final : public FileSystem {
 public:
  // Both must outlive this.
  DatasetFs(Namespace* ns, ReadPath* read_path);

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

  // Resolves a non-root inode. Returns: NotFound.
  absl::StatusOr<std::pair<std::shared_ptr<const DatasetView>, FsNode>> Resolve(uint64_t ino);
  static Attr AttrOf(const DatasetView& view, uint64_t file_id, const FsNode& node);
  static Attr RootAttr();

  Namespace* const ns_;
  ReadPath* const read_path_;
};

}  // namespace ember::cachefs
