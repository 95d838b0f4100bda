#include "meta/meta_server.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "meta/manifest.h"
#include "meta/meta.grpc.pb.h"
#include "meta/store.h"

namespace ember::meta {
namespace {

using Clock = std::chrono::steady_clock;
using FileKey = MetaStore::FileKey;

constexpr uint32_t kMaxManifestPage = 10'000;
constexpr int kMaxBatch = 100'000;  // blocks per checksum / locate / report call

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

BlockAddr FromProto(const rpc::BlockAddr& b) {
  return BlockAddr{b.dataset_id(), b.version(), b.file_id(), b.index()};
}

bool TestBit(const std::string& bitmap, uint64_t i) {
  return i / 8 < bitmap.size() && (static_cast<uint8_t>(bitmap[i / 8]) >> (i % 8)) & 1;
}

void SetBit(std::string* bitmap, uint64_t i, bool on) {
  if (i / 8 >= bitmap->size()) {
    if (!on) return;
    bitmap->resize(i / 8 + 1, '\0');
  }
  uint8_t b = static_cast<uint8_t>((*bitmap)[i / 8]);
  b = on ? (b | (1u << (i % 8))) : (b & ~(1u << (i % 8)));
  (*bitmap)[i / 8] = static_cast<char>(b);
  while (!bitmap->empty() && bitmap->back() == '\0') bitmap->pop_back();
}

// Pulls entries of a stored manifest version in id order (= ComparePaths order), with paths.
class StoredStream {
 public:
  StoredStream(MetaStore* store, uint32_t ds, uint32_t ver) : store_(store), ds_(ds), ver_(ver) {}
  bool Next(std::string* path, rpc::FileEntry* e) {
    if (pos_ == page_.size()) {
      if (done_) return false;
      auto page = store_->ReadManifest(ds_, ver_, after_, 4096);
      if (!page.ok() || page->empty()) {
        done_ = true;
        return false;
      }
      page_ = std::move(*page);
      pos_ = 0;
      after_ = page_.back().file_id();
    }
    *e = page_[pos_++];
    auto parent = dirs_.find(e->parent_id());
    *path = parent == dirs_.end() || parent->second.empty()
                ? e->name()
                : absl::StrCat(parent->second, "/", e->name());
    if (e->type() == rpc::FileEntry::DIR) dirs_[e->file_id()] = *path;
    return true;
  }

 private:
  MetaStore* store_;
  uint32_t ds_, ver_;
  uint64_t after_ = 0;
  std::vector<rpc::FileEntry> page_;
  size_t pos_ = 0;
  bool done_ = false;
  std::unordered_map<uint64_t, std::string> dirs_;
};

}  // namespace

class MetaServiceImpl final : public rpc::Meta::Service {
 public:
  MetaServiceImpl(std::unique_ptr<MetaStore> store, const MetaOptions& options)
      : store_(std::move(store)), options_(options) {}

  absl::Status Load() {
    ASSIGN_OR_RETURN(std::vector<rpc::Node> nodes, store_->ListNodes());
    Clock::time_point now = Clock::now();
    for (auto& n : nodes) {
      // After a restart every known node gets one lease to check in.
      std::string id = n.id();
      nodes_[id] = NodeEntry{std::move(n), now};
    }
    size_t locations = 0;
    RETURN_IF_ERROR(store_->ForEachLocation(
        [&](const FileKey& key, const std::string& node, const std::string& bitmap) {
          locations_[key][node] = bitmap;
          node_files_[node].insert(key);
          locations++;
        }));
    ASSIGN_OR_RETURN(auto jobs, store_->ListPrefetches());
    for (auto& j : jobs) {
      uint64_t n = 0;
      if (j.id().size() > 3 && absl::SimpleAtoi(j.id().substr(3), &n)) {
        next_prefetch_ = std::max(next_prefetch_, n + 1);
      }
      std::string id = j.id();
      prefetches_[id] = std::move(j);
    }
    spdlog::info("meta: loaded {} nodes, {} file location records, {} prefetches", nodes_.size(),
                 locations, prefetches_.size());
    return absl::OkStatus();
  }

  // ---- datasets ----

  grpc::Status AddDataset(grpc::ServerContext* ctx, const rpc::AddDatasetRequest* req,
                          grpc::ServerWriter<rpc::DatasetProgress>* writer) override {
    return ToGrpc(DoAdd(*req, writer));
  }

  grpc::Status RefreshDataset(grpc::ServerContext* ctx, const rpc::RefreshDatasetRequest* req,
                              grpc::ServerWriter<rpc::DatasetProgress>* writer) override {
    return ToGrpc(DoRefresh(req->name(), writer));
  }

  grpc::Status ListDatasets(grpc::ServerContext*, const rpc::ListDatasetsRequest*,
                            rpc::ListDatasetsResponse* resp) override {
    auto all = store_->ListDatasets();
    if (!all.ok()) return ToGrpc(all.status());
    for (auto& ds : *all) *resp->add_datasets() = std::move(ds);
    return grpc::Status::OK;
  }

  grpc::Status GetDataset(grpc::ServerContext*, const rpc::GetDatasetRequest* req,
                          rpc::Dataset* resp) override {
    auto ds = Resolve(*req);
    if (!ds.ok()) return ToGrpc(ds.status());
    *resp = std::move(*ds);
    return grpc::Status::OK;
  }

  grpc::Status RemoveDataset(grpc::ServerContext*, const rpc::RemoveDatasetRequest* req,
                             rpc::RemoveDatasetResponse*) override {
    return ToGrpc(DoRemove(*req));
  }

  grpc::Status ListManifest(grpc::ServerContext*, const rpc::ListManifestRequest* req,
                            rpc::ListManifestResponse* resp) override {
    return ToGrpc(DoListManifest(*req, resp));
  }

  // ---- checksums ----

  grpc::Status RecordChecksums(grpc::ServerContext*, const rpc::RecordChecksumsRequest* req,
                               rpc::RecordChecksumsResponse* resp) override {
    return ToGrpc(DoRecordChecksums(*req, resp));
  }

  grpc::Status GetChecksums(grpc::ServerContext*, const rpc::GetChecksumsRequest* req,
                            rpc::GetChecksumsResponse* resp) override {
    if (req->blocks_size() > kMaxBatch) return ToGrpc(TooMany(req->blocks_size()));
    for (const auto& b : req->blocks()) {
      auto sum = store_->GetChecksum(FromProto(b));
      if (!sum.ok()) return ToGrpc(sum.status());
      resp->add_checksums(sum->value_or(0));
      resp->add_present(sum->has_value());
    }
    return grpc::Status::OK;
  }

  // ---- nodes and locations ----

  grpc::Status RegisterNode(grpc::ServerContext*, const rpc::RegisterNodeRequest* req,
                            rpc::RegisterNodeResponse* resp) override {
    return ToGrpc(DoRegister(*req, resp));
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const rpc::HeartbeatRequest* req,
                         rpc::HeartbeatResponse* resp) override {
    std::unique_lock lock(state_mu_);
    auto it = nodes_.find(req->node_id());
    if (it == nodes_.end()) {
      resp->set_reregister(true);
      return grpc::Status::OK;
    }
    if (!Alive(it->second)) spdlog::info("meta: node {} is back", req->node_id());
    it->second.last_heartbeat = Clock::now();
    it->second.node.set_last_heartbeat_unix_ms(NowUnixMs());
    *it->second.node.mutable_stats() = req->stats();
    lock.unlock();
    JobsForNode(req->node_id(), resp);
    return grpc::Status::OK;
  }

  // ---- prefetch and locality ----

  grpc::Status StartPrefetch(grpc::ServerContext*, const rpc::PrefetchSpec* req,
                             rpc::PrefetchJob* resp) override {
    return ToGrpc(DoStartPrefetch(*req, resp));
  }

  grpc::Status GetPrefetch(grpc::ServerContext*, const rpc::PrefetchId* req,
                           rpc::PrefetchJob* resp) override {
    auto alive = AliveNodes();
    std::lock_guard lock(prefetch_mu_);
    auto it = prefetches_.find(req->id());
    if (it == prefetches_.end()) {
      return ToGrpc(absl::NotFoundError(absl::StrCat("unknown prefetch '", req->id(), "'")));
    }
    Settle(&it->second, alive);
    *resp = it->second;
    return grpc::Status::OK;
  }

  grpc::Status ListPrefetches(grpc::ServerContext*, const rpc::ListPrefetchesRequest*,
                              rpc::ListPrefetchesResponse* resp) override {
    auto alive = AliveNodes();
    std::lock_guard lock(prefetch_mu_);
    for (auto& [id, job] : prefetches_) {
      Settle(&job, alive);
      *resp->add_jobs() = job;
    }
    return grpc::Status::OK;
  }

  grpc::Status CancelPrefetch(grpc::ServerContext*, const rpc::PrefetchId* req,
                              rpc::PrefetchJob* resp) override {
    std::lock_guard lock(prefetch_mu_);
    auto it = prefetches_.find(req->id());
    if (it == prefetches_.end()) {
      return ToGrpc(absl::NotFoundError(absl::StrCat("unknown prefetch '", req->id(), "'")));
    }
    if (it->second.state() == rpc::PrefetchJob::RUNNING) {
      it->second.set_state(rpc::PrefetchJob::CANCELLED);
      it->second.set_finished_unix_ms(NowUnixMs());
    }
    it->second.set_pin_until_unix_ms(0);  // a cancelled prefetch holds nothing
    (void)store_->PutPrefetch(it->second);
    *resp = it->second;
    return grpc::Status::OK;
  }

  grpc::Status Unpin(grpc::ServerContext*, const rpc::UnpinRequest* req,
                     rpc::UnpinResponse* resp) override {
    if (req->dataset().empty() && req->prefetch_id().empty()) {
      return ToGrpc(absl::InvalidArgumentError("name a dataset or a prefetch id to unpin"));
    }
    if (!req->dataset().empty()) {
      auto ds = store_->GetDataset(req->dataset());
      if (!ds.ok()) return ToGrpc(ds.status());
    }
    std::lock_guard lock(prefetch_mu_);
    uint32_t n = 0;
    for (auto& [id, job] : prefetches_) {
      bool match = req->dataset().empty() ? id == req->prefetch_id()
                                          : job.spec().dataset() == req->dataset();
      if (match && job.pin_until_unix_ms() > 0) {
        job.set_pin_until_unix_ms(0);
        (void)store_->PutPrefetch(job);
        n++;
      }
    }
    if (!req->prefetch_id().empty() && !prefetches_.count(req->prefetch_id())) {
      return ToGrpc(
          absl::NotFoundError(absl::StrCat("unknown prefetch '", req->prefetch_id(), "'")));
    }
    resp->set_unpinned(n);
    return grpc::Status::OK;
  }

  grpc::Status ReportPrefetch(grpc::ServerContext*, const rpc::ReportPrefetchRequest* req,
                              rpc::ReportPrefetchResponse*) override {
    auto alive = AliveNodes();
    std::lock_guard lock(prefetch_mu_);
    auto it = prefetches_.find(req->job_id());
    if (it == prefetches_.end()) {
      return ToGrpc(absl::NotFoundError(absl::StrCat("unknown prefetch '", req->job_id(), "'")));
    }
    for (auto& n : *it->second.mutable_nodes()) {
      if (n.node_id() == req->progress().node_id()) n = req->progress();
    }
    Settle(&it->second, alive);
    return grpc::Status::OK;
  }

  grpc::Status Locality(grpc::ServerContext*, const rpc::LocalityRequest* req,
                        rpc::LocalityResponse* resp) override {
    return ToGrpc(DoLocality(*req, resp));
  }

  grpc::Status ListNodes(grpc::ServerContext*, const rpc::ListNodesRequest*,
                         rpc::ListNodesResponse* resp) override {
    std::lock_guard lock(state_mu_);
    for (auto& [id, entry] : nodes_) {
      rpc::Node* n = resp->add_nodes();
      *n = entry.node;
      n->set_state(Alive(entry) ? rpc::Node::ALIVE : rpc::Node::DEAD);
    }
    return grpc::Status::OK;
  }

  grpc::Status ReportBlocks(grpc::ServerContext*, const rpc::ReportBlocksRequest* req,
                            rpc::ReportBlocksResponse*) override {
    return ToGrpc(DoReport(*req));
  }

  grpc::Status Locate(grpc::ServerContext*, const rpc::LocateRequest* req,
                      rpc::LocateResponse* resp) override {
    if (req->blocks_size() > kMaxBatch) return ToGrpc(TooMany(req->blocks_size()));
    {
      std::lock_guard lock(state_mu_);
      for (const auto& b : req->blocks()) {
        rpc::Holders* h = resp->add_holders();
        auto it = locations_.find(FileKey{b.dataset_id(), b.version(), b.file_id()});
        if (it == locations_.end()) continue;
        for (const auto& [node_id, bitmap] : it->second) {
          if (!TestBit(bitmap, b.index())) continue;
          auto n = nodes_.find(node_id);
          if (n == nodes_.end() || !Alive(n->second)) continue;
          const auto& labels = n->second.node.labels();
          h->add_node_ids(node_id);
          h->add_addresses(n->second.node.address());
          h->add_switches(labels.count("switch") ? labels.at("switch") : "");
          h->add_racks(labels.count("rack") ? labels.at("rack") : "");
        }
      }
    }
    // Checksums let the caller verify what a peer sends.
    for (int i = 0; i < req->blocks_size(); i++) {
      rpc::Holders* h = resp->mutable_holders(i);
      if (h->node_ids_size() == 0) continue;
      auto sum = store_->GetChecksum(FromProto(req->blocks(i)));
      if (sum.ok() && sum->has_value()) {
        h->set_has_checksum(true);
        h->set_checksum(**sum);
      }
    }
    return grpc::Status::OK;
  }

 private:
  struct NodeEntry {
    rpc::Node node;
    Clock::time_point last_heartbeat;
  };

  static absl::Status TooMany(int n) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", n, " blocks is over the limit of ", kMaxBatch));
  }

  bool Alive(const NodeEntry& e) const { return Clock::now() - e.last_heartbeat <= options_.lease; }

  absl::StatusOr<rpc::Dataset> Resolve(const rpc::GetDatasetRequest& req) {
    if (!req.name().empty()) return store_->GetDataset(req.name());
    ASSIGN_OR_RETURN(auto all, store_->ListDatasets());
    for (auto& ds : all) {
      if (ds.id() == req.id()) return ds;
    }
    return absl::NotFoundError(absl::StrCat("unknown dataset id ", req.id()));
  }

  // Scans `origin` into (dataset_id, version), streaming progress. Returns the version info.
  absl::StatusOr<rpc::VersionInfo> ScanVersion(const std::string& origin, uint32_t dataset_id,
                                               uint32_t version,
                                               grpc::ServerWriter<rpc::DatasetProgress>* writer) {
    MetaStore::ManifestWriter mw(store_.get(), dataset_id, version);
    auto sink = [&](const rpc::FileEntry& e, std::string_view) { return mw.Add(e); };
    auto progress = [&](const ScanStats& s) {
      rpc::DatasetProgress p;
      p.set_entries_scanned(s.entries);
      p.set_bytes_scanned(s.bytes);
      writer->Write(p);
    };
    auto stats = ScanTree(origin, sink, progress);
    absl::Status fin = stats.ok() ? mw.Finish() : stats.status();
    if (!fin.ok()) {
      (void)store_->DeleteVersionData(dataset_id, version);
      return fin;
    }
    rpc::VersionInfo v;
    v.set_version(version);
    v.set_files(stats->files);
    v.set_dirs(stats->dirs);
    v.set_symlinks(stats->symlinks);
    v.set_bytes(stats->bytes);
    v.set_fingerprint(stats->fingerprint);
    v.set_created_unix_ms(NowUnixMs());
    v.set_max_file_id(stats->max_file_id);
    v.set_skipped(stats->skipped);
    return v;
  }

  absl::Status DoAdd(const rpc::AddDatasetRequest& req,
                     grpc::ServerWriter<rpc::DatasetProgress>* writer) {
    RETURN_IF_ERROR(ValidateDatasetName(req.name()));
    uint64_t block_size = req.block_size() == 0 ? kDefaultBlockSize : req.block_size();
    RETURN_IF_ERROR(ValidateBlockSize(block_size));
    ASSIGN_OR_RETURN(std::string origin, NormalizeOrigin(req.origin()));
    std::lock_guard lock(datasets_mu_);
    auto existing = store_->GetDataset(req.name());
    if (existing.ok()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "dataset '", req.name(), "' already exists (origin ", existing->origin(), ")"));
    }
    if (!absl::IsNotFound(existing.status())) return existing.status();
    ASSIGN_OR_RETURN(uint32_t id, store_->AllocateDatasetId());
    ASSIGN_OR_RETURN(rpc::VersionInfo v, ScanVersion(origin, id, 1, writer));
    rpc::Dataset ds;
    ds.set_name(req.name());
    ds.set_id(id);
    ds.set_origin(origin);
    ds.set_block_size(block_size);
    ds.set_latest_version(1);
    ds.set_created_unix_ms(NowUnixMs());
    *ds.add_versions() = v;
    RETURN_IF_ERROR(store_->PutDataset(ds));
    spdlog::info("meta: added dataset {} (id {}) from {}: {} files, {} bytes", ds.name(), id,
                 origin, v.files(), v.bytes());
    rpc::DatasetProgress done;
    done.set_done(true);
    done.set_changed(true);
    done.set_entries_scanned(v.files() + v.dirs() + v.symlinks());
    done.set_bytes_scanned(v.bytes());
    done.set_added(done.entries_scanned());
    *done.mutable_dataset() = ds;
    writer->Write(done);
    return absl::OkStatus();
  }

  absl::Status DoRefresh(const std::string& name,
                         grpc::ServerWriter<rpc::DatasetProgress>* writer) {
    std::lock_guard lock(datasets_mu_);
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(name));
    RETURN_IF_ERROR(NormalizeOrigin(ds.origin()).status());
    uint32_t latest = ds.latest_version();
    uint32_t next = latest + 1;
    ASSIGN_OR_RETURN(rpc::VersionInfo v, ScanVersion(ds.origin(), ds.id(), next, writer));
    const rpc::VersionInfo* prev = nullptr;
    for (const auto& pv : ds.versions()) {
      if (pv.version() == latest) prev = &pv;
    }
    rpc::DatasetProgress done;
    done.set_done(true);
    done.set_entries_scanned(v.files() + v.dirs() + v.symlinks());
    done.set_bytes_scanned(v.bytes());
    if (prev != nullptr && prev->fingerprint() == v.fingerprint() &&
        prev->max_file_id() == v.max_file_id()) {
      RETURN_IF_ERROR(store_->DeleteVersionData(ds.id(), next));
      done.set_changed(false);
    } else {
      StoredStream old_s(store_.get(), ds.id(), latest), new_s(store_.get(), ds.id(), next);
      DiffCounts d =
          DiffManifests([&](std::string* p, rpc::FileEntry* e) { return old_s.Next(p, e); },
                        [&](std::string* p, rpc::FileEntry* e) { return new_s.Next(p, e); });
      ds.set_latest_version(next);
      *ds.add_versions() = v;
      RETURN_IF_ERROR(store_->PutDataset(ds));
      done.set_changed(true);
      done.set_added(d.added);
      done.set_removed(d.removed);
      done.set_modified(d.modified);
      spdlog::info("meta: dataset {} version {}: +{} -{} ~{}", name, next, d.added, d.removed,
                   d.modified);
    }
    *done.mutable_dataset() = ds;
    writer->Write(done);
    return absl::OkStatus();
  }

  absl::Status DoRemove(const rpc::RemoveDatasetRequest& req) {
    std::lock_guard lock(datasets_mu_);
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(req.name()));
    if (req.version() == 0) {
      RETURN_IF_ERROR(store_->DeleteDataset(ds));
      DropLocations(ds.id(), 0);
      spdlog::info("meta: removed dataset {}", ds.name());
      return absl::OkStatus();
    }
    if (req.version() == ds.latest_version()) {
      return absl::FailedPreconditionError(absl::StrCat("version ", req.version(),
                                                        " is the latest of '", ds.name(),
                                                        "'; remove the whole dataset instead"));
    }
    rpc::Dataset updated = ds;
    updated.clear_versions();
    bool found = false;
    for (const auto& v : ds.versions()) {
      if (v.version() == req.version()) {
        found = true;
      } else {
        *updated.add_versions() = v;
      }
    }
    if (!found) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", ds.name(), "' has no version ", req.version()));
    }
    RETURN_IF_ERROR(store_->PutDataset(updated));
    RETURN_IF_ERROR(store_->DeleteVersionData(ds.id(), req.version()));
    DropLocations(ds.id(), req.version());
    return absl::OkStatus();
  }

  // Forgets in-memory locations of a dataset (version 0 = all versions).
  void DropLocations(uint32_t ds, uint32_t version) {
    std::lock_guard lock(state_mu_);
    for (auto it = locations_.begin(); it != locations_.end();) {
      if (it->first.dataset_id == ds && (version == 0 || it->first.version == version)) {
        for (auto& [node, bitmap] : it->second) node_files_[node].erase(it->first);
        it = locations_.erase(it);
      } else {
        ++it;
      }
    }
  }

  absl::Status DoListManifest(const rpc::ListManifestRequest& req,
                              rpc::ListManifestResponse* resp) {
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(req.name()));
    uint32_t version = req.version() == 0 ? ds.latest_version() : req.version();
    bool found = false;
    for (const auto& v : ds.versions()) found |= v.version() == version;
    if (!found) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", ds.name(), "' has no version ", version));
    }
    uint32_t max =
        req.max_entries() == 0 ? kMaxManifestPage : std::min(req.max_entries(), kMaxManifestPage);
    ASSIGN_OR_RETURN(auto entries,
                     store_->ReadManifest(ds.id(), version, req.after_file_id(), max));
    resp->set_dataset_id(ds.id());
    resp->set_version(version);
    if (entries.size() == max) resp->set_next_after_file_id(entries.back().file_id());
    for (auto& e : entries) *resp->add_entries() = std::move(e);
    return absl::OkStatus();
  }

  absl::Status DoRecordChecksums(const rpc::RecordChecksumsRequest& req,
                                 rpc::RecordChecksumsResponse* resp) {
    if (req.checksums_size() > kMaxBatch) return TooMany(req.checksums_size());
    std::lock_guard lock(checksum_mu_);
    std::vector<std::pair<BlockAddr, uint64_t>> to_write;
    std::map<BlockAddr, uint64_t> in_batch;
    for (const auto& c : req.checksums()) {
      BlockAddr addr = FromProto(c.block());
      std::optional<uint64_t> have;
      if (auto it = in_batch.find(addr); it != in_batch.end()) {
        have = it->second;
      } else {
        ASSIGN_OR_RETURN(have, store_->GetChecksum(addr));
      }
      rpc::BlockChecksum* out = resp->add_recorded();
      *out->mutable_block() = c.block();
      if (!have) {
        to_write.emplace_back(addr, c.checksum());
        in_batch[addr] = c.checksum();
        out->set_checksum(c.checksum());
        resp->add_conflict(false);
      } else {
        out->set_checksum(*have);
        resp->add_conflict(*have != c.checksum());
        if (*have != c.checksum()) {
          spdlog::warn("meta: checksum conflict for block {}/{}/{}/{}: held {:016x}, got {:016x}",
                       addr.dataset_id, addr.version, addr.file_id, addr.index, *have,
                       c.checksum());
        }
      }
    }
    if (!to_write.empty()) RETURN_IF_ERROR(store_->PutChecksums(to_write));
    return absl::OkStatus();
  }

  absl::Status DoRegister(const rpc::RegisterNodeRequest& req, rpc::RegisterNodeResponse* resp) {
    const rpc::Node& in = req.node();
    if (in.id().empty()) return absl::InvalidArgumentError("node id is empty");
    if (in.address().empty()) return absl::InvalidArgumentError("node address is empty");
    rpc::Node n = in;
    n.set_registered_unix_ms(NowUnixMs());
    n.set_last_heartbeat_unix_ms(NowUnixMs());
    n.set_state(rpc::Node::ALIVE);
    RETURN_IF_ERROR(store_->PutNode(n));
    {
      std::lock_guard lock(state_mu_);
      nodes_[n.id()] = NodeEntry{n, Clock::now()};
    }
    spdlog::info("meta: node {} registered at {} ({} GPUs, capacity {} bytes)", n.id(), n.address(),
                 n.gpus(), n.capacity_bytes());
    uint32_t lease = static_cast<uint32_t>(options_.lease.count());
    resp->set_lease_ms(lease);
    resp->set_heartbeat_interval_ms(std::max<uint32_t>(lease / 3, 50));
    return absl::OkStatus();
  }

  absl::Status DoReport(const rpc::ReportBlocksRequest& req) {
    if (req.added_size() + req.removed_size() > kMaxBatch) {
      return TooMany(req.added_size() + req.removed_size());
    }
    std::lock_guard lock(state_mu_);
    if (!nodes_.count(req.node_id())) {
      return absl::FailedPreconditionError(
          absl::StrCat("unknown node '", req.node_id(), "'; register first"));
    }
    const std::string& node = req.node_id();
    std::set<FileKey> touched;
    if (req.full_report_start()) {
      for (const FileKey& k : node_files_[node]) {
        auto it = locations_.find(k);
        if (it != locations_.end()) {
          it->second.erase(node);
          if (it->second.empty()) locations_.erase(it);
        }
        RETURN_IF_ERROR(store_->PutLocation(k, node, ""));
      }
      node_files_[node].clear();
    }
    for (const auto& f : req.files()) {
      FileKey k{f.dataset_id(), f.version(), f.file_id()};
      std::string bitmap = f.bitmap();
      while (!bitmap.empty() && bitmap.back() == '\0') bitmap.pop_back();
      locations_[k][node] = bitmap;
      touched.insert(k);
    }
    auto apply = [&](const rpc::BlockAddr& b, bool on) {
      FileKey k{b.dataset_id(), b.version(), b.file_id()};
      SetBit(&locations_[k][node], b.index(), on);
      touched.insert(k);
    };
    for (const auto& b : req.added()) apply(b, true);
    for (const auto& b : req.removed()) apply(b, false);
    for (const FileKey& k : touched) {
      auto it = locations_.find(k);
      std::string bitmap = it->second[node];
      if (bitmap.empty()) {
        it->second.erase(node);
        if (it->second.empty()) locations_.erase(it);
        node_files_[node].erase(k);
      } else {
        node_files_[node].insert(k);
      }
      RETURN_IF_ERROR(store_->PutLocation(k, node, bitmap));
    }
    return absl::OkStatus();
  }

  // Nodes alive now.
  std::set<std::string> AliveNodes() {
    std::lock_guard lock(state_mu_);
    std::set<std::string> out;
    for (const auto& [id, e] : nodes_) {
      if (Alive(e)) out.insert(id);
    }
    return out;
  }

  // REQUIRES: prefetch_mu_ held. Marks nodes that died mid-prefetch and finishes the job when
  // every node is finished or dead.
  void Settle(rpc::PrefetchJob* job, const std::set<std::string>& alive) {
    if (job->state() != rpc::PrefetchJob::RUNNING) return;
    bool all = true;
    for (auto& n : *job->mutable_nodes()) {
      if (!n.finished() && !alive.count(n.node_id())) {
        n.set_finished(true);
        n.set_note("node died before finishing");
        n.set_blocks_failed(n.blocks_total() > n.blocks_done() ? n.blocks_total() - n.blocks_done()
                                                               : 0);
      }
      all = all && n.finished();
    }
    if (all) {
      job->set_state(rpc::PrefetchJob::DONE);
      job->set_finished_unix_ms(NowUnixMs());
      (void)store_->PutPrefetch(*job);
      spdlog::info("meta: prefetch {} of {} done", job->id(), job->spec().dataset());
    }
  }

  // Running jobs a node takes part in, plus recent ones so it can release their pins.
  void JobsForNode(const std::string& node_id, rpc::HeartbeatResponse* resp) {
    std::lock_guard lock(prefetch_mu_);
    int64_t now = NowUnixMs();
    for (const auto& [id, job] : prefetches_) {
      bool member = false;
      for (const auto& n : job.spec().nodes()) member |= n == node_id;
      bool recent = job.finished_unix_ms() == 0 || now - job.finished_unix_ms() < 600'000;
      if (member &&
          (job.state() == rpc::PrefetchJob::RUNNING || job.pin_until_unix_ms() > now || recent)) {
        *resp->add_prefetches() = job;
      }
    }
  }

  struct Selection {
    uint64_t bytes = 0;
    uint64_t files = 0;
  };

  // Sums the files under the selected paths of a version. Returns: NotFound for a path that is
  // not in the manifest, InvalidArgument for '..' or empty components.
  absl::StatusOr<Selection> SelectPaths(const rpc::Dataset& ds, uint32_t version,
                                        const std::vector<std::string>& raw) {
    std::vector<std::string> paths;
    for (std::string p : raw) {
      while (!p.empty() && p.front() == '/') p.erase(0, 1);
      while (!p.empty() && p.back() == '/') p.pop_back();
      if (p.find("..") != std::string::npos || p.find("//") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("path '", p, "' is not a plain path"));
      }
      paths.push_back(p);
    }
    std::vector<bool> seen(paths.size(), false);
    std::unordered_map<uint64_t, std::string> dirs;
    Selection sel;
    absl::Status st = store_->ForEachEntry(ds.id(), version, [&](const rpc::FileEntry& e) {
      auto parent = dirs.find(e.parent_id());
      std::string path = parent == dirs.end() || parent->second.empty()
                             ? e.name()
                             : absl::StrCat(parent->second, "/", e.name());
      if (e.type() == rpc::FileEntry::DIR) dirs[e.file_id()] = path;
      bool in = paths.empty();
      for (size_t i = 0; i < paths.size(); i++) {
        if (path == paths[i]) seen[i] = true;
        if (paths[i].empty() || path == paths[i] ||
            (path.size() > paths[i].size() && path.compare(0, paths[i].size(), paths[i]) == 0 &&
             path[paths[i].size()] == '/')) {
          in = true;
        }
      }
      if (in && e.type() == rpc::FileEntry::FILE) {
        sel.bytes += e.size();
        sel.files++;
      }
      return true;
    });
    RETURN_IF_ERROR(st);
    for (size_t i = 0; i < paths.size(); i++) {
      if (!seen[i] && !paths[i].empty()) {
        return absl::NotFoundError(absl::StrCat("no path '", paths[i], "' in dataset '", ds.name(),
                                                "' version ", version));
      }
    }
    return sel;
  }

  absl::Status DoStartPrefetch(const rpc::PrefetchSpec& in, rpc::PrefetchJob* out) {
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(in.dataset()));
    uint32_t version = in.version() == 0 ? ds.latest_version() : in.version();
    bool has = false;
    for (const auto& v : ds.versions()) has |= v.version() == version;
    if (!has) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", ds.name(), "' has no version ", version));
    }
    // Chosen nodes: named ones must be known and alive.
    std::vector<std::string> nodes;
    std::map<std::string, rpc::Node> info;
    {
      std::lock_guard lock(state_mu_);
      if (in.all_nodes() || in.nodes().empty()) {
        for (const auto& [id, e] : nodes_) {
          if (Alive(e)) nodes.push_back(id);
        }
      } else {
        for (const auto& id : in.nodes()) {
          auto it = nodes_.find(id);
          if (it == nodes_.end())
            return absl::NotFoundError(absl::StrCat("unknown node '", id, "'"));
          if (!Alive(it->second)) {
            return absl::FailedPreconditionError(absl::StrCat("node '", id, "' is dead"));
          }
          nodes.push_back(id);
        }
      }
      for (const auto& id : nodes) info[id] = nodes_[id].node;
    }
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    if (nodes.empty()) return absl::FailedPreconditionError("no live nodes to prefetch to");
    uint32_t replicas = in.mode() == rpc::PrefetchSpec::STRIPE ? in.replicas() : nodes.size();
    if (in.mode() == rpc::PrefetchSpec::STRIPE && (replicas == 0 || replicas > nodes.size())) {
      return absl::InvalidArgumentError(absl::StrCat("--replicas ", in.replicas(),
                                                     " must be between 1 and the ", nodes.size(),
                                                     " chosen node(s)"));
    }
    ASSIGN_OR_RETURN(Selection sel,
                     SelectPaths(ds, version, {in.paths().begin(), in.paths().end()}));
    // A pin must fit before any work starts.
    if (in.pin_ms() > 0) {
      uint64_t per_node =
          in.mode() == rpc::PrefetchSpec::FULL
              ? sel.bytes
              : (sel.bytes * replicas + nodes.size() - 1) / nodes.size() + ds.block_size();
      for (const auto& id : nodes) {
        const rpc::Node& n = info[id];
        uint64_t pinned = n.stats().pinned_bytes();
        uint64_t room = n.capacity_bytes() > pinned ? n.capacity_bytes() - pinned : 0;
        if (per_node > room) {
          return absl::FailedPreconditionError(
              absl::StrCat("cannot pin: node '", id, "' would need ", per_node,
                           " bytes pinned but has room for ", room, " (capacity ",
                           n.capacity_bytes(), ", already pinned ", pinned, ")"));
        }
      }
    }
    rpc::PrefetchJob job;
    {
      std::lock_guard lock(prefetch_mu_);
      job.set_id(absl::StrCat("pf-", next_prefetch_++));
    }
    *job.mutable_spec() = in;
    job.mutable_spec()->set_version(version);
    job.mutable_spec()->clear_nodes();
    for (const auto& id : nodes) job.mutable_spec()->add_nodes(id);
    job.mutable_spec()->set_replicas(replicas);
    job.set_dataset_id(ds.id());
    job.set_state(rpc::PrefetchJob::RUNNING);
    job.set_created_unix_ms(NowUnixMs());
    if (in.pin_ms() > 0) job.set_pin_until_unix_ms(NowUnixMs() + static_cast<int64_t>(in.pin_ms()));
    job.set_dataset_bytes(sel.bytes);
    job.set_dataset_files(sel.files);
    for (const auto& id : nodes) job.add_nodes()->set_node_id(id);
    RETURN_IF_ERROR(store_->PutPrefetch(job));
    {
      std::lock_guard lock(prefetch_mu_);
      prefetches_[job.id()] = job;
    }
    spdlog::info("meta: prefetch {} of {} version {} to {} node(s), {} bytes", job.id(), ds.name(),
                 version, nodes.size(), sel.bytes);
    *out = job;
    return absl::OkStatus();
  }

  // File sizes of a version, by file id, loaded once.
  absl::StatusOr<std::shared_ptr<const std::vector<uint64_t>>> FileSizes(uint32_t ds,
                                                                         uint32_t version) {
    std::lock_guard lock(sizes_mu_);
    auto it = sizes_.find({ds, version});
    if (it != sizes_.end()) return it->second;
    auto sizes = std::make_shared<std::vector<uint64_t>>();
    RETURN_IF_ERROR(store_->ForEachEntry(ds, version, [&](const rpc::FileEntry& e) {
      if (sizes->size() <= e.file_id()) sizes->resize(e.file_id() + 1, 0);
      (*sizes)[e.file_id()] = e.type() == rpc::FileEntry::FILE ? e.size() : 0;
      return true;
    }));
    sizes_[{ds, version}] = sizes;
    return std::shared_ptr<const std::vector<uint64_t>>(sizes);
  }

  absl::Status DoLocality(const rpc::LocalityRequest& req, rpc::LocalityResponse* resp) {
    ASSIGN_OR_RETURN(rpc::Dataset ds, store_->GetDataset(req.dataset()));
    uint32_t version = req.version() == 0 ? ds.latest_version() : req.version();
    bool has = false;
    for (const auto& v : ds.versions()) has |= v.version() == version;
    if (!has) {
      return absl::NotFoundError(
          absl::StrCat("dataset '", ds.name(), "' has no version ", version));
    }
    ASSIGN_OR_RETURN(auto sizes, FileSizes(ds.id(), version));
    const uint64_t bs = ds.block_size();
    uint64_t total_bytes = 0, total_blocks = 0;
    for (uint64_t sz : *sizes) {
      total_bytes += sz;
      total_blocks += (sz + bs - 1) / bs;
    }
    resp->set_dataset(ds.name());
    resp->set_version(version);
    resp->set_dataset_bytes(total_bytes);
    resp->set_dataset_blocks(total_blocks);
    auto block_len = [&](uint64_t file, uint64_t index) -> uint64_t {
      uint64_t sz = file < sizes->size() ? (*sizes)[file] : 0;
      if (index * bs >= sz) return 0;
      return std::min(bs, sz - index * bs);
    };
    std::lock_guard lock(state_mu_);
    std::map<std::string, rpc::NodeLocality> per_node;
    for (const auto& [id, e] : nodes_) {
      rpc::NodeLocality& n = per_node[id];
      n.set_node_id(id);
      n.set_address(e.node.address());
      n.set_state(Alive(e) ? rpc::Node::ALIVE : rpc::Node::DEAD);
      for (const auto& [k, v] : e.node.labels()) (*n.mutable_labels())[k] = v;
      auto pin = e.node.stats().pinned_bytes_by_dataset().find(ds.id());
      if (pin != e.node.stats().pinned_bytes_by_dataset().end()) n.set_pinned_bytes(pin->second);
    }
    std::vector<uint64_t> histogram(1, 0);
    uint64_t anywhere_bytes = 0, anywhere_blocks = 0;
    auto begin = locations_.lower_bound(FileKey{ds.id(), version, 0});
    for (auto it = begin;
         it != locations_.end() && it->first.dataset_id == ds.id() && it->first.version == version;
         ++it) {
      const uint64_t file = it->first.file_id;
      std::map<uint64_t, int> holders;  // block -> live holders
      for (const auto& [node, bitmap] : it->second) {
        auto pn = per_node.find(node);
        bool live = pn != per_node.end() && pn->second.state() == rpc::Node::ALIVE;
        for (uint64_t i = 0; i < bitmap.size() * 8; i++) {
          if (!TestBit(bitmap, i) || block_len(file, i) == 0) continue;
          if (pn != per_node.end()) {
            pn->second.set_resident_bytes(pn->second.resident_bytes() + block_len(file, i));
            pn->second.set_resident_blocks(pn->second.resident_blocks() + 1);
          }
          if (live) holders[i]++;
        }
      }
      for (const auto& [i, k] : holders) {
        if (histogram.size() <= static_cast<size_t>(k)) histogram.resize(k + 1, 0);
        histogram[k]++;
        anywhere_blocks++;
        anywhere_bytes += block_len(file, i);
      }
    }
    histogram[0] = total_blocks - anywhere_blocks;
    for (auto& [id, n] : per_node) {
      n.set_fraction(total_bytes == 0 ? 0 : static_cast<double>(n.resident_bytes()) / total_bytes);
      *resp->add_nodes() = n;
    }
    resp->set_resident_anywhere_bytes(anywhere_bytes);
    resp->set_resident_anywhere_blocks(anywhere_blocks);
    for (uint64_t h : histogram) resp->add_replicas_histogram(h);
    return absl::OkStatus();
  }

  std::unique_ptr<MetaStore> store_;
  MetaOptions options_;
  std::mutex prefetch_mu_;                              // after state_mu_ when both are held
  std::map<std::string, rpc::PrefetchJob> prefetches_;  // GUARDED_BY(prefetch_mu_)
  uint64_t next_prefetch_ = 1;
  std::mutex sizes_mu_;
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<const std::vector<uint64_t>>> sizes_;
  std::mutex datasets_mu_;  // serializes dataset add / refresh / remove
  std::mutex checksum_mu_;  // serializes checksum check-and-set
  std::mutex state_mu_;     // guards nodes_, locations_, node_files_
  std::map<std::string, NodeEntry> nodes_;
  std::map<FileKey, std::map<std::string, std::string>> locations_;
  std::map<std::string, std::set<FileKey>> node_files_;
};

absl::StatusOr<std::unique_ptr<MetaServer>> MetaServer::Start(const MetaOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir is required");
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create data dir '", options.data_dir, "': ", ec.message()));
  }
  ASSIGN_OR_RETURN(auto store, MetaStore::Open(options.data_dir + "/meta.rocksdb"));
  std::unique_ptr<MetaServer> server(new MetaServer());
  server->service_ = std::make_unique<MetaServiceImpl>(std::move(store), options);
  RETURN_IF_ERROR(server->service_->Load());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(16 << 20);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", options.listen,
                                               "' (in use, or not an address of this host)"));
  }
  spdlog::info("meta: serving on {} (port {}), data in {}", options.listen, server->port_,
               options.data_dir);
  return server;
}

MetaServer::~MetaServer() { Shutdown(); }

void MetaServer::Wait() {
  if (server_) server_->Wait();
}

void MetaServer::Shutdown() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace ember::meta
