#include "meta/meta_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/secret.h"
#include "common/status.h"
#include "meta/meta.grpc.pb.h"

namespace ember::meta {

std::string ResolveMetaAddress(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv("EMBER_META"); env != nullptr && *env != '\0') return env;
  return kDefaultMetaAddress;
}

namespace {
// How a call is made. `keyed`: a call that changes something and is not naturally repeatable
// (starting or ending a prefetch or job) carries a request id, the same on each retry: meta
// answers a repeat with what the first attempt did. `maybe_applied`: set when a retry followed
// an attempt that may have happened.
struct CallOptions {
  bool keyed = false;
  bool* maybe_applied = nullptr;
};
}  // namespace

class MetaClient::Impl {
 public:
  Impl(const std::string& addresses, const MetaCredentials& creds,
       std::chrono::milliseconds timeout)
      : address(addresses), timeout(timeout) {
    if (!creds.token.empty()) bearer = absl::StrCat(kBearerPrefix, creds.token);
    std::shared_ptr<grpc::ChannelCredentials> channel_creds = grpc::InsecureChannelCredentials();
    if (!creds.tls_ca_file.empty()) {
      auto ca = ReadSmallFile(creds.tls_ca_file, "--tls-ca");
      if (!ca.ok()) {
        init_error = ca.status();
      } else {
        grpc::SslCredentialsOptions ssl;
        ssl.pem_root_certs = *ca;
        channel_creds = grpc::SslCredentials(ssl);
      }
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    // Reconnect quickly after meta restarts. MIN_RECONNECT_BACKOFF is gRPC's connect timeout:
    // long enough for a TLS handshake on a busy host (at 100 ms they were cut off), short enough
    // that a call queued on an address that does not answer fails over within a second.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // Several addresses: meta replicas (member.h), one of which leads.
    const std::vector<std::string> list = absl::StrSplit(addresses, ',', absl::SkipWhitespace());
    if (list.size() > 1) {
      // A leader that hangs (stopped, its host cut off) is given up within ~5 s by a call in
      // flight, which then goes to the next replica, rather than at the call's deadline.
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
      args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    }
    for (const std::string& a : list) {
      std::string addr(absl::StripAsciiWhitespace(a));
      auto channel = grpc::CreateCustomChannel(addr, channel_creds, args);
      endpoints.push_back({addr, channel, rpc::Meta::NewStub(channel)});
    }
    if (endpoints.empty()) init_error = absl::InvalidArgumentError("no meta address given");
    keeper = std::thread([this] { KeepConnecting(); });
  }
  ~Impl() {
    stopping = true;
    keeper.join();
  }

  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds t) const {
    ctx->set_deadline(std::chrono::system_clock::now() + t);
    if (!bearer.empty()) ctx->AddMetadata(kAuthMetadataKey, bearer);
  }

  // A new id for one call and its retries: 128 random bits in hex.
  static std::string NewRequestId() {
    thread_local std::mt19937_64 gen(std::random_device{}());
    return absl::StrCat(absl::Hex(gen(), absl::kZeroPad16), absl::Hex(gen(), absl::kZeroPad16));
  }

  absl::Status Convert(const grpc::Status& s, const std::string& at) const {
    if (s.ok()) return absl::OkStatus();
    auto code = static_cast<absl::StatusCode>(s.error_code());
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(
          absl::StrCat("meta unreachable at ", at, ": ", s.error_message()));
    }
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return absl::UnauthenticatedError(absl::StrCat("meta at ", at, ": ", s.error_message()));
    }
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::DeadlineExceededError(absl::StrCat("meta at ", at, " did not answer in time"));
    }
    return absl::Status(code, s.error_message());
  }

  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<rpc::Meta::Stub> stub;
  };
  // Keeps reconnecting endpoints moving: a call fails at once while its channel is down (so a
  // caller is never held up by a dead replica), and then nothing in this process polled the
  // channel's reconnection attempts; a TLS handshake (which needs this process to read the
  // server's answers) timed out again and again, and a client that had seen every replica go
  // down once never got back. While an endpoint is connecting, this thread waits on it.
  void KeepConnecting() {
    while (!stopping.load()) {
      bool waited = false;
      for (const Endpoint& e : endpoints) {
        const grpc_connectivity_state st = e.channel->GetState(/*try_to_connect=*/false);
        if (st != GRPC_CHANNEL_TRANSIENT_FAILURE && st != GRPC_CHANNEL_CONNECTING) continue;
        e.channel->WaitForStateChange(
            st, std::chrono::system_clock::now() + std::chrono::milliseconds(100));
        waited = true;
      }
      if (!waited) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  size_t Current() {
    absl::MutexLock lock(&current_mu);
    return current;
  }
  // After a failed call at endpoint `at`: whether to try again, and where. A replica that is
  // not the leader names it (follow it); an unreachable one makes way for the next address.
  // Waits a little once every address has been tried (an election takes a few seconds).
  // Sets *maybe_applied when the failed call may have happened there all the same.
  bool Retry(const grpc::Status& s, const grpc::ClientContext* ctx, size_t at, int* attempts,
             std::chrono::steady_clock::time_point deadline, bool* maybe_applied) {
    const bool not_leader = s.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
                            absl::StartsWith(s.error_message(), "not the leader");
    // Unreachable (no answer from meta itself), or a replica that lost the lead mid-call: the
    // call did not happen there. Meta's own Unavailable errors (a failing disk) are answers.
    const bool answered =
        ctx != nullptr && ctx->GetServerTrailingMetadata().count(kAnsweredMetadataKey) > 0;
    // A replica that shut its server down mid-call (standing down, stopping) cancels the call:
    // CANCELLED with no answer from meta is that, never ours (unary calls are not cancelled here;
    // the CI's MetaHaTest.KilledLeaderIsReplaced... met it on a read right after a failover).
    const bool unreachable =
        (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
         (!answered || absl::StrContains(s.error_message(), "no longer leads"))) ||
        (s.error_code() == grpc::StatusCode::CANCELLED && !answered);
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && endpoints.size() > 1) {
      // A replica that hangs (stopped, cut off): the call may have happened, so it is not
      // tried again, but the next one goes elsewhere.
      absl::MutexLock lock(&current_mu);
      if (current == at) current = (at + 1) % endpoints.size();
      return false;
    }
    if (!not_leader && !(unreachable && endpoints.size() > 1)) return false;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (unreachable) *maybe_applied = true;
    size_t next = (at + 1) % endpoints.size();
    if (auto pos = s.error_message().find("leader is "); not_leader && pos != std::string::npos) {
      const std::string named = s.error_message().substr(pos + 10);
      for (size_t i = 0; i < endpoints.size(); i++) {
        if (endpoints[i].address == named) next = i;
      }
    }
    {
      absl::MutexLock lock(&current_mu);
      if (current == at) current = next;
    }
    if (++*attempts % static_cast<int>(endpoints.size() + 1) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return true;
  }

  template <typename Req, typename Resp, typename Fn>
  absl::StatusOr<Resp> Unary(const Req& req, Fn fn, CallOptions call = {}) {
    if (!init_error.ok()) return init_error;
    // Per request type (the RPC's name, for every RPC but the few sharing one).
    static metrics::Histogram* const latency = metrics::Global().GetHistogram(
        "ember_meta_client_seconds", "Calls to meta from this process, by request type.",
        {{"request", Req::descriptor()->name()}});
    static metrics::Counter* const errors = metrics::Global().GetCounter(
        "ember_meta_client_errors_total", "Calls to meta that failed, by request type.",
        {{"request", Req::descriptor()->name()}});
    metrics::Timer timer(latency);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int attempts = 0;
    const std::string request_id = call.keyed ? NewRequestId() : "";
    bool applied_unused = false;
    bool* maybe_applied = call.maybe_applied != nullptr ? call.maybe_applied : &applied_unused;
    for (;;) {
      const size_t at = Current();
      grpc::ClientContext ctx;
      Prepare(&ctx, std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 deadline - std::chrono::steady_clock::now()),
                             std::chrono::milliseconds(1)));
      if (!request_id.empty()) ctx.AddMetadata(kRequestIdMetadataKey, request_id);
      Resp resp;
      grpc::Status s = (endpoints[at].stub.get()->*fn)(&ctx, req, &resp);
      if (s.ok()) return resp;
      if (Retry(s, &ctx, at, &attempts, deadline, maybe_applied)) continue;
      errors->Inc();
      return Convert(s, endpoints[at].address);
    }
  }

  template <typename Req, typename Fn>
  absl::StatusOr<rpc::DatasetProgress> Scan(const Req& req, Fn fn, const ProgressFn& progress) {
    if (!init_error.ok()) return init_error;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int attempts = 0;
    for (;;) {
      const size_t at = Current();
      grpc::ClientContext ctx;
      // Scans are long; only give up if meta goes silent for good (a day).
      Prepare(&ctx, std::chrono::hours(24));
      auto reader = (endpoints[at].stub.get()->*fn)(&ctx, req);
      rpc::DatasetProgress p, last;
      bool done = false, any = false;
      while (reader->Read(&p)) {
        any = true;
        if (progress) progress(p);
        if (p.done()) {
          last = p;
          done = true;
        }
      }
      grpc::Status s = reader->Finish();
      // Only a scan that never started goes elsewhere (one that did may have written).
      bool maybe_applied = false;
      if (!s.ok() && !any && Retry(s, &ctx, at, &attempts, deadline, &maybe_applied)) continue;
      if (!s.ok()) return Convert(s, endpoints[at].address);
      if (!done) return absl::InternalError("meta ended the scan without a result");
      return last;
    }
  }

  std::string address;
  std::chrono::milliseconds timeout;
  std::string bearer;
  absl::Status init_error;
  std::vector<Endpoint> endpoints;
  absl::Mutex current_mu;
  size_t current ABSL_GUARDED_BY(current_mu) = 0;
  // Watches in flight, so CancelWatches can end them.
  absl::Mutex watch_mu;
  std::set<grpc::ClientContext*> watches ABSL_GUARDED_BY(watch_mu);
  bool watches_cancelled ABSL_GUARDED_BY(watch_mu) = false;
  std::atomic<bool> stopping{false};
  std::thread keeper;  // KeepConnecting; last: started when everything above is ready
};

MetaClient::MetaClient(const std::string& address, std::chrono::milliseconds timeout)
    : MetaClient(address, MetaCredentials{}, timeout) {}

MetaClient::MetaClient(const std::string& address, const MetaCredentials& credentials,
                       std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>(address, credentials, timeout)), address_(address) {}

MetaClient::~MetaClient() = default;

absl::StatusOr<rpc::DatasetProgress> MetaClient::AddDataset(const std::string& name,
                                                            const std::string& origin,
                                                            uint64_t block_size,
                                                            const ProgressFn& progress) {
  rpc::AddDatasetRequest req;
  req.set_name(name);
  req.set_origin(origin);
  req.set_block_size(block_size);
  return impl_->Scan(req, &rpc::Meta::Stub::AddDataset, progress);
}

absl::StatusOr<rpc::DatasetProgress> MetaClient::RefreshDataset(const std::string& name,
                                                                const ProgressFn& progress) {
  rpc::RefreshDatasetRequest req;
  req.set_name(name);
  return impl_->Scan(req, &rpc::Meta::Stub::RefreshDataset, progress);
}

absl::StatusOr<std::vector<rpc::Dataset>> MetaClient::ListDatasets() {
  auto r = impl_->Unary<rpc::ListDatasetsRequest, rpc::ListDatasetsResponse>(
      rpc::ListDatasetsRequest(), &rpc::Meta::Stub::ListDatasets);
  if (!r.ok()) return r.status();
  return std::vector<rpc::Dataset>(r->datasets().begin(), r->datasets().end());
}

absl::StatusOr<rpc::Dataset> MetaClient::GetDataset(const std::string& name) {
  rpc::GetDatasetRequest req;
  req.set_name(name);
  return impl_->Unary<rpc::GetDatasetRequest, rpc::Dataset>(req, &rpc::Meta::Stub::GetDataset);
}

absl::Status MetaClient::RemoveDataset(const std::string& name, uint32_t version) {
  rpc::RemoveDatasetRequest req;
  req.set_name(name);
  req.set_version(version);
  bool maybe_applied = false;
  absl::Status st = impl_
                        ->Unary<rpc::RemoveDatasetRequest, rpc::RemoveDatasetResponse>(
                            req, &rpc::Meta::Stub::RemoveDataset, {.maybe_applied = &maybe_applied})
                        .status();
  // Retried on another replica after an attempt that may have removed it (the old leader died
  // before answering): not finding it then is the removal having happened.
  if (absl::IsNotFound(st) && maybe_applied) return absl::OkStatus();
  return st;
}

absl::StatusOr<rpc::ListManifestResponse> MetaClient::ListManifestPage(const std::string& name,
                                                                       uint32_t version,
                                                                       uint64_t after_file_id,
                                                                       uint32_t max_entries) {
  rpc::ListManifestRequest req;
  req.set_name(name);
  req.set_version(version);
  req.set_after_file_id(after_file_id);
  req.set_max_entries(max_entries);
  return impl_->Unary<rpc::ListManifestRequest, rpc::ListManifestResponse>(
      req, &rpc::Meta::Stub::ListManifest);
}

absl::Status MetaClient::ForEachManifestEntry(
    const std::string& name, uint32_t version,
    const std::function<void(const rpc::FileEntry&)>& fn) {
  uint64_t after = 0;
  uint32_t pinned = version;
  while (true) {
    auto page = ListManifestPage(name, pinned, after, 0);
    if (!page.ok()) return page.status();
    pinned = page->version();  // page through the version the first page resolved to
    for (const auto& e : page->entries()) fn(e);
    if (page->next_after_file_id() == 0) return absl::OkStatus();
    after = page->next_after_file_id();
  }
}

absl::StatusOr<rpc::RecordChecksumsResponse> MetaClient::RecordChecksums(
    const rpc::RecordChecksumsRequest& req) {
  return impl_->Unary<rpc::RecordChecksumsRequest, rpc::RecordChecksumsResponse>(
      req, &rpc::Meta::Stub::RecordChecksums);
}

absl::StatusOr<rpc::GetChecksumsResponse> MetaClient::GetChecksums(
    const rpc::GetChecksumsRequest& req) {
  return impl_->Unary<rpc::GetChecksumsRequest, rpc::GetChecksumsResponse>(
      req, &rpc::Meta::Stub::GetChecksums);
}

absl::StatusOr<rpc::RegisterNodeResponse> MetaClient::RegisterNode(const rpc::Node& node) {
  rpc::RegisterNodeRequest req;
  *req.mutable_node() = node;
  return impl_->Unary<rpc::RegisterNodeRequest, rpc::RegisterNodeResponse>(
      req, &rpc::Meta::Stub::RegisterNode);
}

absl::StatusOr<rpc::HeartbeatResponse> MetaClient::Heartbeat(const std::string& node_id,
                                                             const rpc::NodeStats& stats) {
  rpc::HeartbeatRequest req;
  req.set_node_id(node_id);
  *req.mutable_stats() = stats;
  return impl_->Unary<rpc::HeartbeatRequest, rpc::HeartbeatResponse>(req,
                                                                     &rpc::Meta::Stub::Heartbeat);
}

absl::StatusOr<std::vector<rpc::Node>> MetaClient::ListNodes() {
  auto r = impl_->Unary<rpc::ListNodesRequest, rpc::ListNodesResponse>(rpc::ListNodesRequest(),
                                                                       &rpc::Meta::Stub::ListNodes);
  if (!r.ok()) return r.status();
  return std::vector<rpc::Node>(r->nodes().begin(), r->nodes().end());
}

absl::Status MetaClient::ReportBlocks(const rpc::ReportBlocksRequest& req) {
  return impl_
      ->Unary<rpc::ReportBlocksRequest, rpc::ReportBlocksResponse>(req,
                                                                   &rpc::Meta::Stub::ReportBlocks)
      .status();
}

absl::StatusOr<rpc::LocateResponse> MetaClient::Locate(const rpc::LocateRequest& req) {
  return impl_->Unary<rpc::LocateRequest, rpc::LocateResponse>(req, &rpc::Meta::Stub::Locate);
}

absl::StatusOr<rpc::PrefetchJob> MetaClient::StartPrefetch(const rpc::PrefetchSpec& spec) {
  return impl_->Unary<rpc::PrefetchSpec, rpc::PrefetchJob>(spec, &rpc::Meta::Stub::StartPrefetch,
                                                           {.keyed = true});
}

absl::StatusOr<rpc::PrefetchJob> MetaClient::GetPrefetch(const std::string& id) {
  rpc::PrefetchId req;
  req.set_id(id);
  return impl_->Unary<rpc::PrefetchId, rpc::PrefetchJob>(req, &rpc::Meta::Stub::GetPrefetch);
}

absl::StatusOr<std::vector<rpc::PrefetchJob>> MetaClient::ListPrefetches() {
  auto r = impl_->Unary<rpc::ListPrefetchesRequest, rpc::ListPrefetchesResponse>(
      rpc::ListPrefetchesRequest(), &rpc::Meta::Stub::ListPrefetches);
  if (!r.ok()) return r.status();
  return std::vector<rpc::PrefetchJob>(r->jobs().begin(), r->jobs().end());
}

absl::StatusOr<rpc::PrefetchJob> MetaClient::CancelPrefetch(const std::string& id) {
  rpc::PrefetchId req;
  req.set_id(id);
  return impl_->Unary<rpc::PrefetchId, rpc::PrefetchJob>(req, &rpc::Meta::Stub::CancelPrefetch);
}

absl::StatusOr<uint32_t> MetaClient::Unpin(const std::string& dataset,
                                           const std::string& prefetch_id) {
  rpc::UnpinRequest req;
  req.set_dataset(dataset);
  req.set_prefetch_id(prefetch_id);
  auto r = impl_->Unary<rpc::UnpinRequest, rpc::UnpinResponse>(req, &rpc::Meta::Stub::Unpin);
  if (!r.ok()) return r.status();
  return r->unpinned();
}

absl::Status MetaClient::ReportPrefetch(const std::string& job_id,
                                        const rpc::PrefetchNodeProgress& p) {
  rpc::ReportPrefetchRequest req;
  req.set_job_id(job_id);
  *req.mutable_progress() = p;
  return impl_
      ->Unary<rpc::ReportPrefetchRequest, rpc::ReportPrefetchResponse>(
          req, &rpc::Meta::Stub::ReportPrefetch)
      .status();
}

absl::StatusOr<rpc::WatchPrefetchesResponse> MetaClient::WatchPrefetches(
    const std::string& node_id, uint64_t known_epoch, std::chrono::milliseconds wait) {
  if (!impl_->init_error.ok()) return impl_->init_error;
  rpc::WatchPrefetchesRequest req;
  req.set_node_id(node_id);
  req.set_known_epoch(known_epoch);
  req.set_wait_ms(static_cast<uint32_t>(wait.count()));
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, wait + impl_->timeout);
  {
    absl::MutexLock lock(&impl_->watch_mu);
    if (impl_->watches_cancelled) return absl::CancelledError("watches cancelled");
    impl_->watches.insert(&ctx);
  }
  rpc::WatchPrefetchesResponse resp;
  const size_t at = impl_->Current();
  grpc::Status s = impl_->endpoints[at].stub->WatchPrefetches(&ctx, req, &resp);
  {
    absl::MutexLock lock(&impl_->watch_mu);
    impl_->watches.erase(&ctx);
  }
  if (!s.ok()) {
    // The caller polls again: let that poll go where the leader is.
    int attempts = 0;
    bool maybe_applied = false;  // a read
    impl_->Retry(s, &ctx, at, &attempts, std::chrono::steady_clock::now() + std::chrono::seconds(1),
                 &maybe_applied);
    return impl_->Convert(s, impl_->endpoints[at].address);
  }
  return resp;
}

void MetaClient::CancelWatches() {
  absl::MutexLock lock(&impl_->watch_mu);
  impl_->watches_cancelled = true;
  for (grpc::ClientContext* ctx : impl_->watches) ctx->TryCancel();
}

absl::StatusOr<rpc::LocalityResponse> MetaClient::Locality(const std::string& dataset,
                                                           uint32_t version) {
  rpc::LocalityRequest req;
  req.set_dataset(dataset);
  req.set_version(version);
  return impl_->Unary<rpc::LocalityRequest, rpc::LocalityResponse>(req, &rpc::Meta::Stub::Locality);
}

absl::StatusOr<rpc::Job> MetaClient::SubmitJob(const rpc::JobSpec& spec) {
  return impl_->Unary<rpc::JobSpec, rpc::Job>(spec, &rpc::Meta::Stub::SubmitJob, {.keyed = true});
}

absl::StatusOr<rpc::Job> MetaClient::GetJob(const std::string& ref) {
  rpc::JobRef r;
  r.set_id(ref);
  return impl_->Unary<rpc::JobRef, rpc::Job>(r, &rpc::Meta::Stub::GetJob);
}

absl::StatusOr<rpc::ListJobsResponse> MetaClient::ListJobs() {
  return impl_->Unary<rpc::ListJobsRequest, rpc::ListJobsResponse>(rpc::ListJobsRequest(),
                                                                   &rpc::Meta::Stub::ListJobs);
}

absl::StatusOr<rpc::Job> MetaClient::CancelJob(const std::string& ref) {
  rpc::JobRef r;
  r.set_id(ref);
  return impl_->Unary<rpc::JobRef, rpc::Job>(r, &rpc::Meta::Stub::CancelJob, {.keyed = true});
}

absl::StatusOr<rpc::Job> MetaClient::CompleteJob(const std::string& ref) {
  rpc::JobRef r;
  r.set_id(ref);
  return impl_->Unary<rpc::JobRef, rpc::Job>(r, &rpc::Meta::Stub::CompleteJob, {.keyed = true});
}

absl::StatusOr<rpc::Volume> MetaClient::AddVolume(const rpc::AddVolumeRequest& req) {
  return impl_->Unary<rpc::AddVolumeRequest, rpc::Volume>(req, &rpc::Meta::Stub::AddVolume);
}

absl::StatusOr<std::vector<rpc::Volume>> MetaClient::ListVolumes() {
  auto r = impl_->Unary<rpc::ListVolumesRequest, rpc::ListVolumesResponse>(
      rpc::ListVolumesRequest(), &rpc::Meta::Stub::ListVolumes);
  if (!r.ok()) return r.status();
  return std::vector<rpc::Volume>(r->volumes().begin(), r->volumes().end());
}

absl::Status MetaClient::RemoveVolume(const std::string& name) {
  rpc::RemoveVolumeRequest req;
  req.set_name(name);
  bool maybe_applied = false;
  absl::Status st = impl_
                        ->Unary<rpc::RemoveVolumeRequest, rpc::RemoveVolumeResponse>(
                            req, &rpc::Meta::Stub::RemoveVolume, {.maybe_applied = &maybe_applied})
                        .status();
  if (absl::IsNotFound(st) && maybe_applied) return absl::OkStatus();  // as RemoveDataset
  return st;
}

absl::StatusOr<rpc::VolumeOpReply> MetaClient::VolumeOp(const rpc::VolumeOpRequest& req) {
  auto r = impl_->Unary<rpc::VolumeOpRequest, rpc::VolumeOpReply>(req, &rpc::Meta::Stub::VolumeOp);
  if (r.ok() && r->err() != 0) return ErrnoStatus(r->err(), r->message());
  return r;
}

absl::StatusOr<rpc::VolumeStatusResponse> MetaClient::VolumeStatus(const std::string& name) {
  rpc::VolumeStatusRequest req;
  req.set_name(name);
  return impl_->Unary<rpc::VolumeStatusRequest, rpc::VolumeStatusResponse>(
      req, &rpc::Meta::Stub::VolumeStatus);
}

}  // namespace ember::meta
