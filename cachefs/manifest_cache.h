// On-disk copies of what the node learned from meta: the dataset list and every manifest it
// loaded (CACHE/manifests/). With them a node keeps serving resident and origin reads while meta
// is down, also across its own restart. Manifests are immutable per (dataset id, version) and
// ids are never reused, so a copy never goes stale; the list is the last one meta gave.
//
// File format (both kinds): magic (8) | payload | XXH3-64 of magic+payload (8, little-endian).
//   manifest payload: varint-length rpc::Dataset (name, id, origin, block size; `versions`
//   holds the one version), then varint-length rpc::FileEntry records in file id order.
//   list payload: one rpc::ListDatasetsResponse.
// Files are written to a temp name and renamed, so a crash leaves the old copy or the new one.
// Decoding checks the checksum and the manifest's shape (dense ids, parents before children).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cachefs/namespace.h"
#include "meta/meta.pb.h"

namespace ember::cachefs {

std::string EncodeManifest(const DatasetView& view);
// Returns: the view (view field 0; callers set it); DataLoss naming what is wrong.
absl::StatusOr<std::shared_ptr<DatasetView>> DecodeManifest(std::string_view bytes);

std::string EncodeDatasetList(const std::vector<rpc::Dataset>& datasets);
absl::StatusOr<std::vector<rpc::Dataset>> DecodeDatasetList(std::string_view bytes);

class ManifestCache {
 public:
  // dir is created if missing; an empty dir disables the cache (every call a no-op/NotFound).
  explicit ManifestCache(std::string dir);

  // Returns: Ok (also when disabled); Unavailable naming the file that could not be written.
  absl::Status SaveManifest(const DatasetView& view);
  // Returns: the view; NotFound (no copy); DataLoss (a damaged copy, which is then removed).
  absl::StatusOr<std::shared_ptr<DatasetView>> LoadManifest(uint32_t dataset_id, uint32_t version);
  // Whether a copy of the manifest is on disk (not checked; false when disabled).
  bool HasManifest(uint32_t dataset_id, uint32_t version);
  // Returns: as SaveManifest.
  absl::Status SaveDatasets(const std::vector<rpc::Dataset>& datasets);
  // Returns: the list; NotFound (no copy); DataLoss (a damaged copy).
  absl::StatusOr<std::vector<rpc::Dataset>> LoadDatasets();

 private:
  static std::string ManifestName(uint32_t dataset_id, uint32_t version);
  absl::Status WriteAtomically(const std::string& name, const std::string& bytes);
  absl::StatusOr<std::string> Read(const std::string& name);
  std::string dir_;
};

}  // namespace ember::cachefs
