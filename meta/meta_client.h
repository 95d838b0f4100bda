// MetaClient: the one way other folders talk to meta (cachefs, tools, tests).
//
// Wraps the gRPC stub; every call has a deadline and returns absl::Status, with an unreachable
// meta reported as Unavailable naming the address. Thread-safe (gRPC channels and stubs are).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ids.h"
#include "meta/meta.pb.h"

namespace ember::meta {

// The address `ember up` and `ember meta` listen on by default.
inline constexpr char kDefaultMetaAddress[] = "127.0.0.1:7370";

// How a client proves the cluster token: gRPC metadata `authorization: Bearer TOKEN`.
inline constexpr char kAuthMetadataKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
// Trailing metadata on every status meta itself returns (not on a transport's failure).
inline constexpr char kAnsweredMetadataKey[] = "ember-answered";
// A client's id for one call, the same on every retry of it (on calls that start or end a prefetch
// or a job): meta answers a repeat with what the first attempt did.
inline constexpr char kRequestIdMetadataKey[] = "ember-request-id";

// What a client needs to reach a secured meta. Both empty: plaintext, no token.
struct MetaCredentials {
  std::string token;        // the cluster token (from --token-file)
  std::string tls_ca_file;  // PEM CA bundle; set = connect with TLS and verify meta against it
};

// Volumes (meta/volumes.h): the version field of a volume block's address (a volume's id is
// never a dataset's), and the inode of a volume's root.
inline constexpr uint32_t kVolumeDataVersion = 1;
inline constexpr uint64_t kVolumeRootIno = 1;

// A volume file's state as `ember volume status` and `user.ember.state` show it.
inline const char* VolumeStateName(rpc::VolumeInode::State s) {
  switch (s) {
    case rpc::VolumeInode::LOCAL:
      return "local";
    case rpc::VolumeInode::REPLICATED:
      return "replicated";
    case rpc::VolumeInode::PERSISTED:
      return "persisted";
    default:
      return "empty";
  }
}

// A block address on the wire and back.
inline rpc::BlockAddr ToProto(const BlockAddr& a) {
  rpc::BlockAddr b;
  b.set_dataset_id(a.dataset_id);
  b.set_version(a.version);
  b.set_file_id(a.file_id);
  b.set_index(a.index);
  return b;
}
inline BlockAddr FromProto(const rpc::BlockAddr& b) {
  return BlockAddr{b.dataset_id(), b.version(), b.file_id(), b.index()};
}

// --meta flag value if set, else $EMBER_META, else kDefaultMetaAddress.
std::string ResolveMetaAddress(const std::string& flag_value);

class MetaClient {
 public:
  explicit MetaClient(const std::string& address,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // A bad CA file is not fatal here: every call then returns that error.
  MetaClient(const std::string& address, const MetaCredentials& credentials,
             std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~MetaClient();

  const std::string& address() const { return address_; }

  using ProgressFn = std::function<void(const rpc::DatasetProgress&)>;
  // Scans run on meta and can take minutes; progress is reported as it goes.
  // Returns the final progress message (done = true).
  absl::StatusOr<rpc::DatasetProgress> AddDataset(const std::string& name,
                                                  const std::string& origin, uint64_t block_size,
                                                  const ProgressFn& progress = {});
  absl::StatusOr<rpc::DatasetProgress> RefreshDataset(const std::string& name,
                                                      const ProgressFn& progress = {});
  absl::StatusOr<std::vector<rpc::Dataset>> ListDatasets();
  absl::StatusOr<rpc::Dataset> GetDataset(const std::string& name);
  absl::Status RemoveDataset(const std::string& name, uint32_t version = 0);
  // Calls fn for every entry of a version (0 = latest), one page at a time.
  absl::Status ForEachManifestEntry(const std::string& name, uint32_t version,
                                    const std::function<void(const rpc::FileEntry&)>& fn);
  absl::StatusOr<rpc::ListManifestResponse> ListManifestPage(const std::string& name,
                                                             uint32_t version,
                                                             uint64_t after_file_id,
                                                             uint32_t max_entries);

  absl::StatusOr<rpc::RecordChecksumsResponse> RecordChecksums(
      const rpc::RecordChecksumsRequest& req);
  absl::StatusOr<rpc::GetChecksumsResponse> GetChecksums(const rpc::GetChecksumsRequest& req);

  absl::StatusOr<rpc::RegisterNodeResponse> RegisterNode(const rpc::Node& node);
  absl::StatusOr<rpc::HeartbeatResponse> Heartbeat(const std::string& node_id,
                                                   const rpc::NodeStats& stats);
  absl::StatusOr<std::vector<rpc::Node>> ListNodes();
  absl::Status ReportBlocks(const rpc::ReportBlocksRequest& req);
  absl::StatusOr<rpc::LocateResponse> Locate(const rpc::LocateRequest& req);

  absl::StatusOr<rpc::PrefetchJob> StartPrefetch(const rpc::PrefetchSpec& spec);
  absl::StatusOr<rpc::PrefetchJob> GetPrefetch(const std::string& id);
  absl::StatusOr<std::vector<rpc::PrefetchJob>> ListPrefetches();
  absl::StatusOr<rpc::PrefetchJob> CancelPrefetch(const std::string& id);
  absl::StatusOr<uint32_t> Unpin(const std::string& dataset, const std::string& prefetch_id);
  absl::Status ReportPrefetch(const std::string& job_id, const rpc::PrefetchNodeProgress& p);
  // Waits up to `wait` for the prefetch jobs of `node_id` to differ from `known_epoch` (0:
  // answers at once). CancelWatches ends every watch in flight, and later ones, at once.
  // Returns: meta's answer; Cancelled after CancelWatches; meta's errors.
  absl::StatusOr<rpc::WatchPrefetchesResponse> WatchPrefetches(const std::string& node_id,
                                                               uint64_t known_epoch,
                                                               std::chrono::milliseconds wait);
  void CancelWatches();
  absl::StatusOr<rpc::LocalityResponse> Locality(const std::string& dataset, uint32_t version);

  absl::StatusOr<rpc::Job> SubmitJob(const rpc::JobSpec& spec);
  absl::StatusOr<rpc::Job> GetJob(const std::string& ref);
  absl::StatusOr<rpc::ListJobsResponse> ListJobs();
  absl::StatusOr<rpc::Job> CancelJob(const std::string& ref);
  absl::StatusOr<rpc::Job> CompleteJob(const std::string& ref);

  // Writable volumes (meta/volumes.h).
  absl::StatusOr<rpc::Volume> AddVolume(const rpc::AddVolumeRequest& req);
  absl::StatusOr<std::vector<rpc::Volume>> ListVolumes();
  absl::Status RemoveVolume(const std::string& name);
  // One namespace operation. Returns: the reply; an ErrnoStatus (common/status.h) carrying the
  // errno meta answered (ENOENT, EEXIST, EBUSY, ...); meta's or the transport's errors.
  // A change retried on another meta replica after an attempt that may have been applied can
  // answer as if it was not the first (EEXIST for a mkdir that happened): callers look again.
  absl::StatusOr<rpc::VolumeOpReply> VolumeOp(const rpc::VolumeOpRequest& req);
  absl::StatusOr<rpc::VolumeStatusResponse> VolumeStatus(const std::string& name);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace ember::meta
