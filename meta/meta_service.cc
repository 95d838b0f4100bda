#include "meta/meta_service.h"

#include <spdlog/spdlog.h>

#include <map>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/secret.h"
#include "common/status.h"
#include "meta/locality.h"
#include "meta/meta_client.h"

namespace ember::meta {
namespace {

constexpr int kMaxBatch = 100'000;  // blocks per checksum / locate / report call

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status TooMany(int n) {
  return absl::InvalidArgumentError(
      absl::StrCat("batch of ", n, " blocks is over the limit of ", kMaxBatch));
}

// Per-RPC latency (its count is the call rate), one histogram per method of the service,
// created once: the map is read-only afterwards.
metrics::Histogram* RpcHistogram(const char* method) {
  static const auto* const by_method = [] {
    auto* m = new std::unordered_map<std::string, metrics::Histogram*>();
    const auto* service = rpc::Dataset::descriptor()->file()->FindServiceByName("Meta");
    for (int i = 0; i < service->method_count(); i++) {
      const std::string& name = service->method(i)->name();
      (*m)[name] = metrics::Global().GetHistogram(
          "ember_meta_rpc_seconds", "gRPC calls served by meta, by method.", {{"method", name}});
    }
    return m;
  }();
  auto it = by_method->find(method);
  return it == by_method->end() ? nullptr : it->second;
}

std::vector<BlockAddr> Addrs(const google::protobuf::RepeatedPtrField<rpc::BlockAddr>& in) {
  std::vector<BlockAddr> out;
  out.reserve(in.size());
  for (const auto& b : in) out.push_back(FromProto(b));
  return out;
}

// The client's id for this call, the same on every retry of it (meta_client.h); empty from
// clients that send none.
std::string RequestId(const grpc::ServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kRequestIdMetadataKey);
  if (it == md.end() || it->second.size() > 64) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

MetaService::MetaService(const MetaUnits& units, std::string token)
    : units_(units), token_(std::move(token)) {}

absl::Status MetaService::Authorize(grpc::ServerContext* ctx) {
  if (token_.empty()) return absl::OkStatus();
  const auto& md = ctx->client_metadata();
  auto it = md.find(kAuthMetadataKey);
  if (it != md.end()) {
    std::string_view got(it->second.data(), it->second.size());
    if (TokenEqual(got, absl::StrCat(kBearerPrefix, token_))) return absl::OkStatus();
  }
  const uint64_t n = ++refused_;
  const auto now = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&refused_log_mu_);
    if (now - refused_logged_at_ >= std::chrono::seconds(1)) {
      refused_logged_at_ = now;
      spdlog::warn("meta: refused a call from {}: {} cluster token ({} refused so far)",
                   ctx->peer(), it == md.end() ? "no" : "wrong", n);
    }
  }
  return absl::UnauthenticatedError(it == md.end()
                                        ? "meta requires the cluster token (--token-file)"
                                        : "meta refused the cluster token (--token-file)");
}

grpc::Status MetaService::Serve(grpc::ServerContext* ctx, const char* method,
                                const std::function<absl::Status()>& body) {
  metrics::Timer timer(RpcHistogram(method));
  // Marks the status as meta's answer: a client tells it from a failed transport (and tries
  // another replica only for the latter).
  ctx->AddTrailingMetadata(kAnsweredMetadataKey, "1");
  if (absl::Status denied = Authorize(ctx); !denied.ok()) return ToGrpc(denied);
  return ToGrpc(body());
}

// ---- datasets ----

grpc::Status MetaService::AddDataset(grpc::ServerContext* ctx, const rpc::AddDatasetRequest* req,
                                     grpc::ServerWriter<rpc::DatasetProgress>* writer) {
  return Serve(ctx, "AddDataset", [&]() -> absl::Status {
    if (units_.volumes != nullptr && units_.volumes->Has(req->name())) {
      return absl::AlreadyExistsError(
          absl::StrCat("'", req->name(), "' is a volume's name: a dataset needs its own"));
    }
    auto progress = [writer](const rpc::DatasetProgress& p) { writer->Write(p); };
    ASSIGN_OR_RETURN(rpc::DatasetProgress done, units_.catalog->Add(*req, progress));
    writer->Write(done);
    return absl::OkStatus();
  });
}

grpc::Status MetaService::RefreshDataset(grpc::ServerContext* ctx,
                                         const rpc::RefreshDatasetRequest* req,
                                         grpc::ServerWriter<rpc::DatasetProgress>* writer) {
  return Serve(ctx, "RefreshDataset", [&]() -> absl::Status {
    auto progress = [writer](const rpc::DatasetProgress& p) { writer->Write(p); };
    ASSIGN_OR_RETURN(rpc::DatasetProgress done, units_.catalog->Refresh(req->name(), progress));
    writer->Write(done);
    return absl::OkStatus();
  });
}

grpc::Status MetaService::ListDatasets(grpc::ServerContext* ctx, const rpc::ListDatasetsRequest*,
                                       rpc::ListDatasetsResponse* resp) {
  return Serve(ctx, "ListDatasets", [&] {
    for (auto& ds : units_.catalog->List()) *resp->add_datasets() = std::move(ds);
    return absl::OkStatus();
  });
}

grpc::Status MetaService::GetDataset(grpc::ServerContext* ctx, const rpc::GetDatasetRequest* req,
                                     rpc::Dataset* resp) {
  return Serve(ctx, "GetDataset", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.catalog->Resolve(*req));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::RemoveDataset(grpc::ServerContext* ctx,
                                        const rpc::RemoveDatasetRequest* req,
                                        rpc::RemoveDatasetResponse*) {
  return Serve(ctx, "RemoveDataset", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(uint32_t id, units_.catalog->Remove(*req));
    units_.locations->Drop(id, req->version());
    return absl::OkStatus();
  });
}

grpc::Status MetaService::ListManifest(grpc::ServerContext* ctx,
                                       const rpc::ListManifestRequest* req,
                                       rpc::ListManifestResponse* resp) {
  return Serve(ctx, "ListManifest", [&] { return units_.catalog->ListManifest(*req, resp); });
}

// ---- checksums ----

grpc::Status MetaService::RecordChecksums(grpc::ServerContext* ctx,
                                          const rpc::RecordChecksumsRequest* req,
                                          rpc::RecordChecksumsResponse* resp) {
  return Serve(ctx, "RecordChecksums", [&]() -> absl::Status {
    if (req->checksums_size() > kMaxBatch) return TooMany(req->checksums_size());
    for (const auto& c : req->checksums()) RETURN_IF_ERROR(units_.catalog->CheckBlock(c.block()));
    return units_.checksums->Record(*req, resp);
  });
}

grpc::Status MetaService::GetChecksums(grpc::ServerContext* ctx,
                                       const rpc::GetChecksumsRequest* req,
                                       rpc::GetChecksumsResponse* resp) {
  return Serve(ctx, "GetChecksums", [&]() -> absl::Status {
    if (req->blocks_size() > kMaxBatch) return TooMany(req->blocks_size());
    ASSIGN_OR_RETURN(auto sums, units_.checksums->Get(Addrs(req->blocks())));
    for (const auto& sum : sums) {
      resp->add_checksums(sum.value_or(0));
      resp->add_present(sum.has_value());
    }
    return absl::OkStatus();
  });
}

// ---- nodes and locations ----

grpc::Status MetaService::RegisterNode(grpc::ServerContext* ctx,
                                       const rpc::RegisterNodeRequest* req,
                                       rpc::RegisterNodeResponse* resp) {
  return Serve(ctx, "RegisterNode", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.nodes->Register(req->node()));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::Heartbeat(grpc::ServerContext* ctx, const rpc::HeartbeatRequest* req,
                                    rpc::HeartbeatResponse* resp) {
  return Serve(ctx, "Heartbeat", [&] {
    if (!units_.nodes->Heartbeat(req->node_id(), req->stats())) {
      resp->set_reregister(true);
      return absl::OkStatus();
    }
    for (auto& job : units_.prefetches->ForNode(req->node_id())) {
      *resp->add_prefetches() = std::move(job);
    }
    return absl::OkStatus();
  });
}

grpc::Status MetaService::ListNodes(grpc::ServerContext* ctx, const rpc::ListNodesRequest*,
                                    rpc::ListNodesResponse* resp) {
  return Serve(ctx, "ListNodes", [&] {
    for (auto& n : units_.nodes->List()) *resp->add_nodes() = std::move(n);
    return absl::OkStatus();
  });
}

absl::Status MetaService::Report(const rpc::ReportBlocksRequest& req) {
  if (req.added_size() + req.removed_size() > kMaxBatch) {
    return TooMany(req.added_size() + req.removed_size());
  }
  // Blocks of removed dataset versions are skipped (a node may still hold them); addresses
  // beyond a known version's bounds refuse the whole call.
  auto keep = [&](const rpc::BlockAddr& b) -> absl::StatusOr<bool> {
    absl::Status st = units_.catalog->CheckBlock(b);
    if (absl::IsNotFound(st)) return false;
    RETURN_IF_ERROR(st);
    return true;
  };
  std::vector<BlockAddr> added, removed;
  std::vector<LocationIndex::FileBitmap> files;
  for (const auto& b : req.added()) {
    ASSIGN_OR_RETURN(bool k, keep(b));
    if (k) added.push_back(FromProto(b));
  }
  for (const auto& b : req.removed()) {
    ASSIGN_OR_RETURN(bool k, keep(b));
    if (k) removed.push_back(FromProto(b));
  }
  for (const auto& f : req.files()) {
    rpc::BlockAddr first;
    first.set_dataset_id(f.dataset_id());
    first.set_version(f.version());
    first.set_file_id(f.file_id());
    ASSIGN_OR_RETURN(bool k, keep(first));
    if (!k) continue;
    ASSIGN_OR_RETURN(uint64_t max_blocks, units_.catalog->MaxBlocks(f.dataset_id(), f.version()));
    if (f.bitmap().size() > (max_blocks + 7) / 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("bitmap of file ", f.dataset_id(), "/", f.version(), "/", f.file_id(),
                       " is ", f.bitmap().size(), " bytes, beyond the dataset's size"));
    }
    files.push_back({{f.dataset_id(), f.version(), f.file_id()}, f.bitmap()});
  }
  if (!units_.nodes->Known(req.node_id())) {
    return absl::FailedPreconditionError(
        absl::StrCat("unknown node '", req.node_id(), "'; register first"));
  }
  return units_.locations->Apply(req.node_id(), req.full_report_start(), files, added, removed);
}

grpc::Status MetaService::ReportBlocks(grpc::ServerContext* ctx,
                                       const rpc::ReportBlocksRequest* req,
                                       rpc::ReportBlocksResponse*) {
  return Serve(ctx, "ReportBlocks", [&] { return Report(*req); });
}

grpc::Status MetaService::Locate(grpc::ServerContext* ctx, const rpc::LocateRequest* req,
                                 rpc::LocateResponse* resp) {
  return Serve(ctx, "Locate", [&]() -> absl::Status {
    if (req->blocks_size() > kMaxBatch) return TooMany(req->blocks_size());
    const std::vector<BlockAddr> blocks = Addrs(req->blocks());
    units_.locations->Locate(blocks, req->node_id(), units_.nodes->View(), resp, req->node_table());
    // Checksums let the caller verify what a peer sends, or what it reads from the origin when
    // no peer holds the block any more. A store error here only costs the caller a claim.
    auto sums = units_.checksums->Get(blocks);
    if (!sums.ok()) return absl::OkStatus();
    for (size_t i = 0; i < sums->size(); i++) {
      if (!(*sums)[i]) continue;
      rpc::Holders* h = resp->mutable_holders(static_cast<int>(i));
      h->set_has_checksum(true);
      h->set_checksum(*(*sums)[i]);
    }
    return absl::OkStatus();
  });
}

// ---- prefetch and locality ----

grpc::Status MetaService::StartPrefetch(grpc::ServerContext* ctx, const rpc::PrefetchSpec* req,
                                        rpc::PrefetchJob* resp) {
  return Serve(ctx, "StartPrefetch", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.prefetches->Start(*req, RequestId(ctx)));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::GetPrefetch(grpc::ServerContext* ctx, const rpc::PrefetchId* req,
                                      rpc::PrefetchJob* resp) {
  return Serve(ctx, "GetPrefetch", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.prefetches->Get(req->id()));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::ListPrefetches(grpc::ServerContext* ctx,
                                         const rpc::ListPrefetchesRequest*,
                                         rpc::ListPrefetchesResponse* resp) {
  return Serve(ctx, "ListPrefetches", [&] {
    for (auto& j : units_.prefetches->List()) *resp->add_jobs() = std::move(j);
    return absl::OkStatus();
  });
}

grpc::Status MetaService::CancelPrefetch(grpc::ServerContext* ctx, const rpc::PrefetchId* req,
                                         rpc::PrefetchJob* resp) {
  return Serve(ctx, "CancelPrefetch", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.prefetches->Cancel(req->id()));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::Unpin(grpc::ServerContext* ctx, const rpc::UnpinRequest* req,
                                rpc::UnpinResponse* resp) {
  return Serve(ctx, "Unpin", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(uint32_t n, units_.prefetches->Unpin(req->dataset(), req->prefetch_id()));
    resp->set_unpinned(n);
    return absl::OkStatus();
  });
}

grpc::Status MetaService::ReportPrefetch(grpc::ServerContext* ctx,
                                         const rpc::ReportPrefetchRequest* req,
                                         rpc::ReportPrefetchResponse*) {
  return Serve(ctx, "ReportPrefetch",
               [&] { return units_.prefetches->Report(req->job_id(), req->progress()); });
}

grpc::Status MetaService::WatchPrefetches(grpc::ServerContext* ctx,
                                          const rpc::WatchPrefetchesRequest* req,
                                          rpc::WatchPrefetchesResponse* resp) {
  return Serve(ctx, "WatchPrefetches", [&] {
    // In slices, so a caller that went away (or a server shutting down) frees this thread soon.
    const absl::Time until =
        absl::Now() + absl::Milliseconds(std::min<uint32_t>(req->wait_ms(), 5000));
    // Epochs start at 1: a caller that knows none (0) is answered at once.
    uint64_t epoch = units_.prefetches->WaitForChange(req->known_epoch(), absl::Now());
    while (epoch == req->known_epoch() && !ctx->IsCancelled() && absl::Now() < until) {
      epoch = units_.prefetches->WaitForChange(
          req->known_epoch(), std::min(until, absl::Now() + absl::Milliseconds(100)));
    }
    resp->set_epoch(epoch);
    for (auto& job : units_.prefetches->ForNode(req->node_id())) {
      *resp->add_prefetches() = std::move(job);
    }
    return absl::OkStatus();
  });
}

grpc::Status MetaService::Locality(grpc::ServerContext* ctx, const rpc::LocalityRequest* req,
                                   rpc::LocalityResponse* resp) {
  return Serve(ctx, "Locality", [&] {
    return ComputeLocality(units_.catalog, units_.nodes, units_.locations, *req, resp);
  });
}

// ---- scheduler ----

grpc::Status MetaService::SubmitJob(grpc::ServerContext* ctx, const rpc::JobSpec* req,
                                    rpc::Job* resp) {
  return Serve(ctx, "SubmitJob", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.jobs->Submit(*req, RequestId(ctx)));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::GetJob(grpc::ServerContext* ctx, const rpc::JobRef* req, rpc::Job* resp) {
  return Serve(ctx, "GetJob", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.jobs->Get(req->id()));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::ListJobs(grpc::ServerContext* ctx, const rpc::ListJobsRequest*,
                                   rpc::ListJobsResponse* resp) {
  return Serve(ctx, "ListJobs", [&] {
    *resp = units_.jobs->List();
    return absl::OkStatus();
  });
}

grpc::Status MetaService::CancelJob(grpc::ServerContext* ctx, const rpc::JobRef* req,
                                    rpc::Job* resp) {
  return Serve(ctx, "CancelJob", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.jobs->End(req->id(), rpc::Job::CANCELLED, RequestId(ctx)));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::CompleteJob(grpc::ServerContext* ctx, const rpc::JobRef* req,
                                      rpc::Job* resp) {
  return Serve(ctx, "CompleteJob", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.jobs->End(req->id(), rpc::Job::COMPLETED, RequestId(ctx)));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::AddVolume(grpc::ServerContext* ctx, const rpc::AddVolumeRequest* req,
                                    rpc::Volume* resp) {
  return Serve(ctx, "AddVolume", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.volumes->Add(*req));
    return absl::OkStatus();
  });
}

grpc::Status MetaService::ListVolumes(grpc::ServerContext* ctx, const rpc::ListVolumesRequest*,
                                      rpc::ListVolumesResponse* resp) {
  return Serve(ctx, "ListVolumes", [&] {
    for (auto& v : units_.volumes->List()) *resp->add_volumes() = std::move(v);
    return absl::OkStatus();
  });
}

grpc::Status MetaService::RemoveVolume(grpc::ServerContext* ctx,
                                       const rpc::RemoveVolumeRequest* req,
                                       rpc::RemoveVolumeResponse*) {
  return Serve(ctx, "RemoveVolume", [&] { return units_.volumes->Remove(req->name()); });
}

grpc::Status MetaService::VolumeOp(grpc::ServerContext* ctx, const rpc::VolumeOpRequest* req,
                                   rpc::VolumeOpReply* resp) {
  return Serve(ctx, "VolumeOp", [&]() -> absl::Status {
    // A copier whose lease ran out is replaced as one the caller could not reach: nodes that
    // would copy its copy go to the origin (or become the copier) without trying it first.
    const rpc::VolumeOpRequest* op = req;
    rpc::VolumeOpRequest with_dead;
    if (req->has_copying()) {
      const NodeView view = units_.nodes->View();
      for (size_t i = 0; i < view.alive.size() && i < view.members->nodes.size(); ++i) {
        if (view.alive[i]) continue;
        if (op == req) {
          with_dead = *req;
          op = &with_dead;
        }
        with_dead.mutable_copying()->add_unreachable(view.members->nodes[i].id);
      }
    }
    absl::StatusOr<rpc::VolumeOpReply> reply = units_.volumes->Apply(*op);
    if (reply.ok()) {
      *resp = std::move(*reply);
      return absl::OkStatus();
    }
    // A file system's answer (ENOENT, EEXIST, ...) is a reply, not a failed call.
    if (int err = CarriedErrno(reply.status()); err != 0) {
      resp->set_err(err);
      resp->set_message(std::string(reply.status().message()));
      return absl::OkStatus();
    }
    return reply.status();
  });
}

grpc::Status MetaService::VolumeStatus(grpc::ServerContext* ctx,
                                       const rpc::VolumeStatusRequest* req,
                                       rpc::VolumeStatusResponse* resp) {
  return Serve(ctx, "VolumeStatus", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*resp, units_.volumes->Status(req->name()));
    return absl::OkStatus();
  });
}

}  // namespace ember::meta
