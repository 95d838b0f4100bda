// MetaService: the gRPC face of meta (meta.proto). It only translates: every RPC goes through
// one gate (Serve: the cluster token, the per-method latency metric, absl -> gRPC status) and
// then calls the unit that owns the answer. It holds no state of its own.
//
// Why a gate in the service and not a gRPC AuthMetadataProcessor or interceptor: gRPC C++ takes
// an AuthMetadataProcessor only on secure server credentials (meta also serves plaintext), and
// its server interceptors cannot end a call with a status. The gate is the one place the token
// is checked; a test calls every method of the service descriptor without and with a wrong
// token, so a method that bypassed it would fail the suite.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "meta/catalog.h"
#include "meta/checksum_ledger.h"
#include "meta/job_service.h"
#include "meta/location_index.h"
#include "meta/meta.grpc.pb.h"
#include "meta/node_registry.h"
#include "meta/prefetch_jobs.h"
#include "meta/volumes.h"

namespace ember::meta {

// The units a service answers from. All must outlive the service.
struct MetaUnits {
  DatasetCatalog* catalog = nullptr;
  ChecksumLedger* checksums = nullptr;
  NodeRegistry* nodes = nullptr;
  LocationIndex* locations = nullptr;
  PrefetchJobs* prefetches = nullptr;
  JobService* jobs = nullptr;
  VolumeCatalog* volumes = nullptr;
};

class MetaService final : public rpc::Meta::Service {
 public:
  // `token`: the cluster token callers must send (empty: none).
  MetaService(const MetaUnits& units, std::string token);

  grpc::Status AddDataset(grpc::ServerContext* ctx, const rpc::AddDatasetRequest* req,
                          grpc::ServerWriter<rpc::DatasetProgress>* writer) override;
  grpc::Status RefreshDataset(grpc::ServerContext* ctx, const rpc::RefreshDatasetRequest* req,
                              grpc::ServerWriter<rpc::DatasetProgress>* writer) override;
  grpc::Status ListDatasets(grpc::ServerContext* ctx, const rpc::ListDatasetsRequest* req,
                            rpc::ListDatasetsResponse* resp) override;
  grpc::Status GetDataset(grpc::ServerContext* ctx, const rpc::GetDatasetRequest* req,
                          rpc::Dataset* resp) override;
  grpc::Status RemoveDataset(grpc::ServerContext* ctx, const rpc::RemoveDatasetRequest* req,
                             rpc::RemoveDatasetResponse* resp) override;
  grpc::Status ListManifest(grpc::ServerContext* ctx, const rpc::ListManifestRequest* req,
                            rpc::ListManifestResponse* resp) override;

  grpc::Status RecordChecksums(grpc::ServerContext* ctx, const rpc::RecordChecksumsRequest* req,
                               rpc::RecordChecksumsResponse* resp) override;
  grpc::Status GetChecksums(grpc::ServerContext* ctx, const rpc::GetChecksumsRequest* req,
                            rpc::GetChecksumsResponse* resp) override;

  grpc::Status RegisterNode(grpc::ServerContext* ctx, const rpc::RegisterNodeRequest* req,
                            rpc::RegisterNodeResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const rpc::HeartbeatRequest* req,
                         rpc::HeartbeatResponse* resp) override;
  grpc::Status ListNodes(grpc::ServerContext* ctx, const rpc::ListNodesRequest* req,
                         rpc::ListNodesResponse* resp) override;
  grpc::Status ReportBlocks(grpc::ServerContext* ctx, const rpc::ReportBlocksRequest* req,
                            rpc::ReportBlocksResponse* resp) override;
  grpc::Status Locate(grpc::ServerContext* ctx, const rpc::LocateRequest* req,
                      rpc::LocateResponse* resp) override;

  grpc::Status StartPrefetch(grpc::ServerContext* ctx, const rpc::PrefetchSpec* req,
                             rpc::PrefetchJob* resp) override;
  grpc::Status GetPrefetch(grpc::ServerContext* ctx, const rpc::PrefetchId* req,
                           rpc::PrefetchJob* resp) override;
  grpc::Status ListPrefetches(grpc::ServerContext* ctx, const rpc::ListPrefetchesRequest* req,
                              rpc::ListPrefetchesResponse* resp) override;
  grpc::Status CancelPrefetch(grpc::ServerContext* ctx, const rpc::PrefetchId* req,
                              rpc::PrefetchJob* resp) override;
  grpc::Status Unpin(grpc::ServerContext* ctx, const rpc::UnpinRequest* req,
                     rpc::UnpinResponse* resp) override;
  grpc::Status ReportPrefetch(grpc::ServerContext* ctx, const rpc::ReportPrefetchRequest* req,
                              rpc::ReportPrefetchResponse* resp) override;
  grpc::Status WatchPrefetches(grpc::ServerContext* ctx, const rpc::WatchPrefetchesRequest* req,
                               rpc::WatchPrefetchesResponse* resp) override;
  grpc::Status Locality(grpc::ServerContext* ctx, const rpc::LocalityRequest* req,
                        rpc::LocalityResponse* resp) override;

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const rpc::JobSpec* req,
                         rpc::Job* resp) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const rpc::JobRef* req, rpc::Job* resp) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const rpc::ListJobsRequest* req,
                        rpc::ListJobsResponse* resp) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const rpc::JobRef* req, rpc::Job* resp) override;
  grpc::Status CompleteJob(grpc::ServerContext* ctx, const rpc::JobRef* req,
                           rpc::Job* resp) override;

  grpc::Status AddVolume(grpc::ServerContext* ctx, const rpc::AddVolumeRequest* req,
                         rpc::Volume* resp) override;
  grpc::Status ListVolumes(grpc::ServerContext* ctx, const rpc::ListVolumesRequest* req,
                           rpc::ListVolumesResponse* resp) override;
  grpc::Status RemoveVolume(grpc::ServerContext* ctx, const rpc::RemoveVolumeRequest* req,
                            rpc::RemoveVolumeResponse* resp) override;
  grpc::Status VolumeOp(grpc::ServerContext* ctx, const rpc::VolumeOpRequest* req,
                        rpc::VolumeOpReply* resp) override;
  grpc::Status VolumeStatus(grpc::ServerContext* ctx, const rpc::VolumeStatusRequest* req,
                            rpc::VolumeStatusResponse* resp) override;

 private:
  // The gate every RPC goes through: checks the token, times the call into
  // ember_meta_rpc_seconds{method}, runs `body` and converts its status.
  grpc::Status Serve(grpc::ServerContext* ctx, const char* method,
                     const std::function<absl::Status()>& body);
  absl::Status Authorize(grpc::ServerContext* ctx);
  absl::Status Report(const rpc::ReportBlocksRequest& req);

  const MetaUnits units_;
  const std::string token_;
  std::atomic<uint64_t> refused_{0};
  absl::Mutex refused_log_mu_;
  std::chrono::steady_clock::time_point refused_logged_at_ ABSL_GUARDED_BY(refused_log_mu_){};
};

}  // namespace ember::meta
