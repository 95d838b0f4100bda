// Locality of a dataset version across the cluster (`ember locality`, the status page): per
// node resident bytes and blocks, fraction, pinned bytes (as the node reported), state and
// labels; overall bytes resident on some live node and a histogram of blocks by live replica
// count. Composes the catalog (sizes), the registry (nodes) and the location index (bitmaps);
// holds no state of its own.
#pragma once

#include "absl/status/status.h"
#include "meta/catalog.h"
#include "meta/location_index.h"
#include "meta/meta.pb.h"
#include "meta/node_registry.h"

namespace ember::meta {

// Returns: Ok; NotFound (dataset or version); the store's errors reading the manifest.
absl::Status ComputeLocality(DatasetCatalog* catalog, NodeRegistry* nodes, LocationIndex* locations,
                             const rpc::LocalityRequest& req, rpc::LocalityResponse* resp);

}  // namespace ember::meta
