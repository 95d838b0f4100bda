#include "cachefs/fetch/block_directory.h"

#include <utility>

#include "meta/meta_client.h"

namespace ember::cachefs {
namespace {

constexpr size_t kReportPage = 2000;  // files (full report) or blocks (increments) per RPC

class MetaBlockDirectory final : public BlockDirectory {
 public:
  MetaBlockDirectory(meta::MetaClient* meta, std::string node_id)
      : meta_(meta), node_id_(std::move(node_id)) {}

  absl::StatusOr<std::vector<Location>> Locate(const std::vector<BlockAddr>& addrs) override {
    rpc::LocateRequest req;
    req.set_node_id(node_id_);
    req.set_node_table(true);
    for (const auto& a : addrs) *req.add_blocks() = meta::ToProto(a);
    auto resp = meta_->Locate(req);
    if (!resp.ok()) return resp.status();
    std::vector<Holder> nodes;  // the answer's node table (empty from a meta that predates it)
    nodes.reserve(resp->nodes_size());
    for (const auto& n : resp->nodes()) {
      nodes.push_back({n.node_id(), n.address(), n.switch_label(), n.rack()});
    }
    std::vector<Location> out;
    out.reserve(addrs.size());
    for (int i = 0; i < resp->holders_size() && i < static_cast<int>(addrs.size()); i++) {
      const auto& h = resp->holders(i);
      Location l;
      l.dataset_unheld = h.dataset_unheld();
      if (h.has_checksum()) l.checksum = h.checksum();
      for (uint32_t ref : h.node_refs()) {
        if (ref < nodes.size()) l.holders.push_back(nodes[ref]);
      }
      for (int j = 0; j < h.node_ids_size(); j++) {
        l.holders.push_back({h.node_ids(j), h.addresses(j),
                             j < h.switches_size() ? h.switches(j) : "",
                             j < h.racks_size() ? h.racks(j) : ""});
      }
      out.push_back(std::move(l));
    }
    return out;
  }

  absl::StatusOr<std::vector<bool>> RecordChecksums(const std::vector<Claim>& claims) override {
    rpc::RecordChecksumsRequest req;
    req.set_conflicts_only(true);  // the checksums meta holds are not needed, only conflicts
    for (const auto& c : claims) {
      auto* r = req.add_checksums();
      *r->mutable_block() = meta::ToProto(c.addr);
      r->set_checksum(c.checksum);
    }
    auto resp = meta_->RecordChecksums(req);
    if (!resp.ok()) return resp.status();
    std::vector<bool> conflict(claims.size(), false);
    for (int i = 0; i < resp->conflict_size() && i < static_cast<int>(claims.size()); i++) {
      conflict[i] = resp->conflict(i);
    }
    return conflict;
  }

  absl::Status ReportResident(const std::vector<ResidentFile>& files) override {
    rpc::ReportBlocksRequest req;
    req.set_node_id(node_id_);
    req.set_full_report_start(true);
    for (const auto& file : files) {
      auto* f = req.add_files();
      f->set_dataset_id(file.dataset_id);
      f->set_version(file.version);
      f->set_file_id(file.file_id);
      f->set_bitmap(file.bitmap);
      if (static_cast<size_t>(req.files_size()) >= kReportPage) {
        absl::Status st = meta_->ReportBlocks(req);
        if (!st.ok()) return st;
        req.clear_files();
        req.set_full_report_start(false);
      }
    }
    return meta_->ReportBlocks(req);  // the last page (the only one, empty, if nothing is held)
  }

  absl::Status ReportChanges(const std::vector<BlockAddr>& added,
                             const std::vector<BlockAddr>& removed) override {
    size_t a = 0, r = 0;
    while (a < added.size() || r < removed.size()) {
      rpc::ReportBlocksRequest req;
      req.set_node_id(node_id_);
      for (; a < added.size() && req.added_size() < static_cast<int>(kReportPage); a++) {
        *req.add_added() = meta::ToProto(added[a]);
      }
      for (; r < removed.size() && req.removed_size() < static_cast<int>(kReportPage); r++) {
        *req.add_removed() = meta::ToProto(removed[r]);
      }
      absl::Status st = meta_->ReportBlocks(req);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

 private:
  meta::MetaClient* const meta_;
  const std::string node_id_;
};

}  // namespace

std::unique_ptr<BlockDirectory> NewMetaBlockDirectory(meta::MetaClient* meta, std::string node_id) {
  return std::make_unique<MetaBlockDirectory>(meta, std::move(node_id));
}

}  // namespace ember::cachefs
