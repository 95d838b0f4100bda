// Namespace: the mount's tree. The root lists every dataset; `NAME` is the dataset's latest
// version (resolved once per agent lifetime) and `NAME@V` pins version V. Manifests come from meta,
// page by page, the first time a dataset view is used, and stay in memory (they are immutable).
// Copies on disk (manifest_cache.h) answer when meta cannot: a node serves through a meta outage.
//
// Inode numbers are derived, never allocated: ino = dataset_id << 48 | view << 32 | file_id, where
// view is 0 for the latest-version view and V for `NAME@V`; the mount root is 1. So a restarted
// agent answers with the same numbers. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/filesystem.h"  // MakeIno, SplitIno
#include "meta/meta_client.h"

namespace ember::cachefs {

// One manifest entry, as read from a view: a value pointing into the view's tables (valid while
// the view is held).
struct FsNode {
  uint64_t parent = 0;
  std::string_view name;
  uint8_t type = 0;  // rpc::FileEntry::Type
  uint64_t size = 0;
  uint32_t mode = 0;
  uint32_t uid = 0, gid = 0;
  int64_t mtime_ns = 0;
  std::string_view link_target;
  std::string_view etag;               // remote origins: what a fill must find
  std::span<const uint32_t> children;  // dirs: child file ids, sorted by name
};

// A version's manifest in memory, packed for datasets of millions of files (docs/architecture.md,
// "memory"): per entry 40 bytes plus its name; names, link targets and ETags in one arena; owner
// and mode interned; children as one id array grouped by directory. Built by Append (entries in
// file id order) then Finish; immutable and shared by every view of the version afterwards.
class ManifestTable {
 public:
  // Adds the next entry of a manifest streamed in file id order. Returns false (adding nothing)
  // unless its id is the next one, its parent an earlier directory (0 for the root only), and
  // its name a single path component.
  bool Append(const rpc::FileEntry& e);
  // Builds the directory index (children) and trims the tables; Append after it needs it again.
  void Finish();
  void Reserve(size_t entries) { entries_.reserve(entries); }
  size_t size() const { return entries_.size(); }
  // Returns: the entry of file_id (1-based), or nullopt.
  std::optional<FsNode> Get(uint64_t file_id) const;
  // The entry's name alone (REQUIRES: 1 <= file_id <= size()).
  std::string_view Name(uint64_t file_id) const {
    const Packed& p = entries_[file_id - 1];
    return std::string_view(arena_).substr(p.name_off, p.name_len);
  }
  // Bytes held (for the log and the memory figures).
  size_t MemoryBytes() const;

 private:
  struct Packed {  // 40 bytes
    uint64_t size;
    int64_t mtime_ns;
    uint32_t parent;
    uint32_t name_off;  // in arena_
    uint32_t attr;      // index in attrs_ (mode, uid, gid)
    uint32_t aux;       // dirs: index in dir_begin_; others: 1 + index in extras_, or 0
    uint16_t name_len;
    uint8_t type;
  };
  struct Attrs {
    uint32_t mode, uid, gid;
    bool operator==(const Attrs&) const = default;
  };
  struct Extra {  // a symlink's target and a remote object's ETag, in arena_
    uint32_t link_off, etag_off;
    uint16_t link_len, etag_len;
  };
  bool AddString(std::string_view s, uint32_t* off);

  std::vector<Packed> entries_;
  std::string arena_;
  std::vector<Attrs> attrs_;
  std::vector<Extra> extras_;
  std::vector<uint32_t> dir_begin_;  // per dir: its first child in kids_; one past the last dir
  std::vector<uint32_t> kids_;       // child ids grouped by parent, in id (= name) order
  uint32_t dirs_ = 0;
  // While building: (mode, uid, gid) -> index in attrs_.
  absl::flat_hash_map<std::tuple<uint32_t, uint32_t, uint32_t>, uint32_t> attr_ids_;
};

// One loaded (dataset, version) view: the version's table and how the mount names it.
struct DatasetView {
  std::string name;
  uint32_t dataset_id = 0;
  uint32_t version = 0;  // the real version, also for the latest view
  uint32_t view = 0;     // 0 = latest view, else == version
  std::string origin;
  uint64_t block_size = 0;
  std::shared_ptr<ManifestTable> files = std::make_shared<ManifestTable>();

  std::optional<FsNode> Get(uint64_t file_id) const { return files->Get(file_id); }
  std::string_view Name(uint64_t file_id) const { return files->Name(file_id); }
  size_t size() const { return files->size(); }
  // The path of a file relative to the dataset root.
  std::string PathOf(uint64_t file_id) const;
  bool Append(const rpc::FileEntry& e) { return files->Append(e); }
  void Finish() { files->Finish(); }
};

// MakeIno / SplitIno (the inode layout above) are in filesystem.h: volumes use them too.

class ManifestCache;

class Namespace {
 public:
  // `disk` (may be null) keeps copies of the list and manifests for when meta is away.
  Namespace(meta::MetaClient* meta, ManifestCache* disk);

  // The datasets at the root, refreshed from meta at most every couple of seconds; when meta is
  // unreachable the last known list is kept.
  std::vector<rpc::Dataset> Datasets(bool force_refresh = false);
  // Resolves a root entry name ("NAME" or "NAME@V") to its view, loading it if needed.
  // Returns: the view, NotFound.
  absl::StatusOr<std::shared_ptr<const DatasetView>> ViewByName(const std::string& name);
  // The view an inode (other than the root) belongs to. Returns: the view, NotFound.
  absl::StatusOr<std::shared_ptr<const DatasetView>> ViewByIno(uint64_t ino);
  // Keeps copies on disk of the dataset list and of every dataset's latest manifest of at most
  // `max_entries` entries (larger ones are copied when first used), so that a dataset this node
  // never opened is browsable and readable while meta is down. Missing copies are fetched from
  // meta and written without being kept in memory. Returns: how many manifests were copied.
  size_t SyncCopies(uint64_t max_entries) ABSL_LOCKS_EXCLUDED(list_mu_, load_mu_, views_mu_);
  // The manifests held in memory, each version's table counted once.
  struct Memory {
    uint64_t entries = 0, bytes = 0;
  };
  Memory GetMemory() ABSL_LOCKS_EXCLUDED(views_mu_);

 private:
  absl::StatusOr<std::shared_ptr<const DatasetView>> Load(const rpc::Dataset& ds, uint32_t view)
      ABSL_LOCKS_EXCLUDED(load_mu_, views_mu_);
  absl::StatusOr<std::shared_ptr<DatasetView>> LoadFromMeta(const rpc::Dataset& ds,
                                                            uint32_t version);
  absl::StatusOr<rpc::Dataset> DatasetById(uint32_t id);
  // A loaded view (either name) of the dataset's version, or null.
  std::shared_ptr<const DatasetView> LoadedVersion(uint32_t dataset_id, uint32_t version)
      ABSL_LOCKS_EXCLUDED(views_mu_);

  meta::MetaClient* meta_;
  ManifestCache* disk_;
  // Lock order: load_mu_ -> views_mu_. Meta is asked under list_mu_ (one listing at a time) and
  // under load_mu_ (one manifest load at a time), never under views_mu_.
  absl::Mutex list_mu_;
  std::vector<rpc::Dataset> datasets_ ABSL_GUARDED_BY(list_mu_);
  std::chrono::steady_clock::time_point listed_at_ ABSL_GUARDED_BY(list_mu_){};
  absl::Mutex load_mu_;
  std::set<std::pair<uint32_t, uint32_t>> too_large_ ABSL_GUARDED_BY(load_mu_);  // logged once
  absl::Mutex views_mu_;                                                         // readers share it
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<const DatasetView>> views_
      ABSL_GUARDED_BY(views_mu_);
};

}  // namespace ember::cachefs
