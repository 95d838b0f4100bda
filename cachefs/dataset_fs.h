// DatasetFs: the FileSystem of a node's mount. The root lists datasets; below it, entries come
// from immutable manifests (Namespace) and bytes from the ReadPath. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "cachefs/filesystem.h"
#include "cachefs/namespace.h"
#include "cachefs/read_path.h"

namespace ember::cachefs {

// What the read path needs to fill blocks of one file of a loaded view.
FileRef MakeFileRef(const DatasetView& view, uint64_t file_id);

class DatasetFs final : public FileSystem {
 public:
  DatasetFs(Namespace* ns, ReadPath* read_path, int readahead_blocks);

  absl::StatusOr<Entry> Lookup(uint64_t parent, const std::string& name) override;
  absl::StatusOr<Entry> GetAttr(uint64_t ino) override;
  absl::Status ReadDir(
      uint64_t ino, uint64_t offset,
      const std::function<bool(const std::string&, const Attr&, uint64_t)>& fn) override;
  absl::StatusOr<std::string> ReadLink(uint64_t ino) override;
  absl::StatusOr<uint64_t> Open(uint64_t ino, int flags) override;
  absl::StatusOr<ReadResult> Read(uint64_t ino, uint64_t handle, uint64_t offset,
                                  size_t size) override;
  void Release(uint64_t handle) override;
  absl::StatusOr<Backing> OpenBacking(uint64_t ino) override;
  FsStats StatFs() override;

  // Entries and attributes below the root never change (manifests are immutable).
  static constexpr double kImmutableTimeout = 3600;
  // The root's listing follows `ember dataset add/rm`.
  static constexpr double kRootTimeout = 1;

 private:
  struct Handle {
    FileRef ref;
    std::mutex mu;
    uint64_t next_offset = 0;                      // where a sequential reader reads next
    uint64_t readahead_next = 0;                   // first block not yet queued for readahead
    std::atomic<uint64_t> last_block{UINT64_MAX};  // ReadPath::Read: counted per block visit
  };

  // Resolves a non-root inode. Returns: NotFound.
  absl::StatusOr<std::pair<std::shared_ptr<const DatasetView>, const FsNode*>> Resolve(
      uint64_t ino);
  static Attr AttrOf(const DatasetView& view, uint64_t file_id, const FsNode& node);
  static Attr RootAttr();

  Namespace* ns_;
  ReadPath* read_path_;
  int readahead_blocks_;
  std::mutex handles_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Handle>> handles_;  // GUARDED_BY(handles_mu_)
  std::atomic<uint64_t> next_handle_{1};
};

}  // namespace ember::cachefs
