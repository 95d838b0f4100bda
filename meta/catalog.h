// DatasetCatalog: meta's datasets, their versions and manifests, and each version's geometry
// (file sizes, block counts, the bounds a block address must fall in).
//
// The dataset records are kept in memory (they are few and small) and written through to the
// store first: memory changes only after the store has accepted the change, so what a caller was
// told is what a restart finds. Manifests stay in the store and are read page by page; a
// version's file sizes are loaded once, when first needed (locality, prefetch selection).
//
// Thread-safe. `mu_` guards the in-memory records and caches and is never held across a store
// scan or a call into another unit; `writer_mu_` serializes the read-modify-write of add,
// refresh and remove (held across a whole origin scan, which may take minutes; readers never
// wait for it). Lock order: writer_mu_ -> mu_.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "meta/meta.pb.h"
#include "meta/store.h"

namespace ember::meta {

// The largest number of manifest entries one ListManifest page carries.
inline constexpr uint32_t kMaxManifestPage = 10'000;

class DatasetCatalog {
 public:
  using ProgressFn = std::function<void(const rpc::DatasetProgress&)>;

  // REQUIRES: the store outlives the catalog.
  explicit DatasetCatalog(MetaStore* store);

  // Loads the dataset records. Returns: Ok, or the store's error.
  absl::Status Load();

  // Scans the origin into version 1 of a new dataset, reporting progress as it goes.
  // Returns: the final progress (done); InvalidArgument (name, block size, origin);
  // AlreadyExists; the origin's errors (NotFound, PermissionDenied, FailedPrecondition when a
  // remote origin cannot be reached); the store's errors (ResourceExhausted: disk full).
  absl::StatusOr<rpc::DatasetProgress> Add(const rpc::AddDatasetRequest& req,
                                           const ProgressFn& progress);
  // Rescans; makes version N+1 only if something changed. Returns: as Add, NotFound.
  absl::StatusOr<rpc::DatasetProgress> Refresh(const std::string& name, const ProgressFn& progress);
  // Removes a dataset (version 0) or one version that is not the latest; returns the dataset id
  // so the caller can forget its locations. Returns: NotFound; FailedPrecondition (the latest
  // version); the store's errors.
  absl::StatusOr<uint32_t> Remove(const rpc::RemoveDatasetRequest& req);

  std::vector<rpc::Dataset> List();
  // Returns: the dataset; NotFound.
  absl::StatusOr<rpc::Dataset> Get(const std::string& name);
  // By name, or by id when the name is empty. Returns: the dataset; NotFound.
  absl::StatusOr<rpc::Dataset> Resolve(const rpc::GetDatasetRequest& req);
  // The dataset and the version a request names (0 = latest). Returns: NotFound (no such
  // dataset, or no such version of it).
  absl::StatusOr<std::pair<rpc::Dataset, uint32_t>> ResolveVersion(const std::string& name,
                                                                   uint32_t version);
  // One page of a version's manifest. Returns: NotFound; the store's errors.
  absl::Status ListManifest(const rpc::ListManifestRequest& req, rpc::ListManifestResponse* resp);

  // A block address must name an existing dataset version, one of its file ids, and an index
  // below the version's block count, so that no caller can record checksums or grow a location
  // bitmap for blocks that cannot exist. Returns: Ok; NotFound (no such dataset version:
  // removed, or never added); InvalidArgument (file id or index out of range).
  absl::Status CheckBlock(const rpc::BlockAddr& b);
  // The most blocks any file of a version can have. Returns: NotFound as CheckBlock.
  absl::StatusOr<uint64_t> MaxBlocks(uint32_t dataset_id, uint32_t version);

  // File sizes of a version by file id (0 for directories and symlinks), loaded once.
  using FileSizes = std::vector<uint64_t>;
  absl::StatusOr<std::shared_ptr<const FileSizes>> Sizes(uint32_t dataset_id, uint32_t version);

  // The files under `paths` of a version ("" or no paths: all). Returns: NotFound for a path
  // that is not in the manifest; InvalidArgument for '..' or empty components.
  struct Selection {
    uint64_t bytes = 0;
    uint64_t files = 0;
  };
  absl::StatusOr<Selection> SelectPaths(const rpc::Dataset& ds, uint32_t version,
                                        const std::vector<std::string>& paths);

 private:
  struct Bounds {
    uint64_t max_file_id = 0;
    uint64_t max_blocks = 0;  // ceil(version bytes / block size): no file can have more
  };
  // Scans the origin at `uri` into (dataset_id, version). Returns the version's summary.
  absl::StatusOr<rpc::VersionInfo> ScanVersion(const std::string& uri, uint32_t dataset_id,
                                               uint32_t version, const ProgressFn& progress);
  // REQUIRES: mu_. Replaces the in-memory record (and its bounds) after the store took it.
  void PutLocked(const rpc::Dataset& ds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MetaStore* const store_;
  absl::Mutex writer_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::map<std::string, rpc::Dataset> by_name_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::string> name_by_id_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint32_t, uint32_t>, Bounds> bounds_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<const FileSizes>> sizes_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::meta
