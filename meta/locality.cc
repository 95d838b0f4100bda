#include "meta/locality.h"

#include <map>

#include "common/status.h"

namespace ember::meta {

absl::Status ComputeLocality(DatasetCatalog* catalog, NodeRegistry* nodes, LocationIndex* locations,
                             const rpc::LocalityRequest& req, rpc::LocalityResponse* resp) {
  ASSIGN_OR_RETURN(auto dv, catalog->ResolveVersion(req.dataset(), req.version()));
  const auto& [ds, version] = dv;
  ASSIGN_OR_RETURN(auto sizes, catalog->Sizes(ds.id(), version));
  const NodeView view = nodes->View();
  const LocationIndex::Residency r =
      locations->Resident(ds.id(), version, *sizes, ds.block_size(), view);
  resp->set_dataset(ds.name());
  resp->set_version(version);
  resp->set_dataset_bytes(r.total_bytes);
  resp->set_dataset_blocks(r.total_blocks);
  for (const rpc::Node& node : nodes->List()) {
    rpc::NodeLocality* n = resp->add_nodes();
    n->set_node_id(node.id());
    n->set_address(node.address());
    n->set_state(node.state());
    for (const auto& [k, v] : node.labels()) (*n->mutable_labels())[k] = v;
    auto pin = node.stats().pinned_bytes_by_dataset().find(ds.id());
    if (pin != node.stats().pinned_bytes_by_dataset().end()) n->set_pinned_bytes(pin->second);
    auto held = r.by_node.find(node.id());
    if (held != r.by_node.end()) {
      n->set_resident_bytes(held->second.bytes);
      n->set_resident_blocks(held->second.blocks);
    }
    n->set_fraction(r.total_bytes == 0 ? 0
                                       : static_cast<double>(n->resident_bytes()) /
                                             static_cast<double>(r.total_bytes));
  }
  resp->set_resident_anywhere_bytes(r.anywhere_bytes);
  resp->set_resident_anywhere_blocks(r.anywhere_blocks);
  for (uint64_t h : r.replicas_histogram) resp->add_replicas_histogram(h);
  return absl::OkStatus();
}

}  // namespace ember::meta
