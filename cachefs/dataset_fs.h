// DatasetFs: the FileSystem of a node's mount. The root lists datasets; below it, entries come
// from immutable manifests (Namespace) and bytes from the ReadPath (fetch/read_path.h). An open
// file's handle is its ReadStream (readahead window, block visits), kept by the FUSE binding.
//
// Folder readahead: block readahead never crosses from one file to the next, so a reader going
// through a folder of small (one-block) files, as a first epoch does, would wait on the origin
// once per file. When a read at offset 0 of such a file follows a read of one of the two files
// before it in the folder (name order; any of the last 4 reads in that folder), the next
// kFolderWindow files of the folder are filled ahead (ReadPath::ReadAheadFiles). A reader
// jumping around (a shuffled epoch) triggers nothing, so it reads no more from the origin than
// it asks for.
//
// Thread-safe; its only state is the folder readahead's, under its own mutex.
#pragma once

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
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
  absl::StatusOr<std::pair<std::shared_ptr<const DatasetView>, const FsNode*>> Resolve(
      uint64_t ino);
  static Attr AttrOf(const DatasetView& view, uint64_t file_id, const FsNode& node);
  static Attr RootAttr();

  // Folder readahead (see above) after a read at offset 0 of `file_id`, a file of `view`.
  void ReadAheadInFolder(const DatasetView& view, uint64_t file_id, const FsNode& node);

  // Files filled ahead of an in-order reader. Small enough that 4 readers' windows stay within
  // ReadPath's recent blocks (48): a file read ahead and gone from memory before its reader
  // arrives is read back from the cache (ImageNet-shaped cold epoch: 16 ahead 620 files/s, 6
  // ahead 821, none 737).
  static constexpr size_t kFolderWindow = 6;
  static constexpr size_t kFoldersKept = 4096;
  struct Folder {
    uint64_t recent[4] = {~0ull, ~0ull, ~0ull, ~0ull};  // positions of the last reads in it
    uint32_t next = 0;                                  // where the next read's goes
    uint64_t queued_until = 0;                          // positions below were queued
  };

  Namespace* const ns_;
  ReadPath* const read_path_;
  absl::Mutex folders_mu_;
  absl::flat_hash_map<std::pair<const DatasetView*, uint64_t>, Folder> folders_
      ABSL_GUARDED_BY(folders_mu_);
};

}  // namespace ember::cachefs
