#include "meta/meta_server.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/http_server.h"
#include "common/secret.h"
#include "common/status.h"
#include "meta/catalog.h"
#include "meta/checksum_ledger.h"
#include "meta/job_service.h"
#include "meta/location_index.h"
#include "meta/meta_service.h"
#include "meta/node_registry.h"
#include "meta/prefetch_jobs.h"
#include "meta/replication.h"
#include "meta/status_surface.h"
#include "meta/store.h"
#include "meta/volumes.h"

namespace ember::meta {

// The units, in construction order (each may use the ones before it), and what serves them.
struct MetaServer::Parts {
  std::unique_ptr<ReplicaService> replica;  // replicas' leader only (refuses batches)
  std::unique_ptr<MetaStore> store;
  std::unique_ptr<DatasetCatalog> catalog;
  std::unique_ptr<ChecksumLedger> checksums;
  std::unique_ptr<NodeRegistry> nodes;
  std::unique_ptr<LocationIndex> locations;
  std::unique_ptr<PrefetchJobs> prefetches;
  std::unique_ptr<JobService> jobs;
  std::unique_ptr<VolumeCatalog> volumes;
  std::unique_ptr<StatusSurface> status;
  std::unique_ptr<MetaService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<HttpServer> https;
  int port = 0;
  // Replicas' leader only. Last: destroyed first (its catch-up thread uses the store), once the
  // server no longer takes calls that write.
  std::unique_ptr<Replicator> replicator;

  // Every 200 ms: lease expiries, the status page's samples, a full scheduler pass.
  std::thread loop;
  absl::Mutex loop_mu;
  bool loop_stop ABSL_GUARDED_BY(loop_mu) = false;

  void StartLoop() {
    loop = std::thread([this] {
      for (;;) {
        {
          absl::MutexLock lock(&loop_mu);
          loop_mu.AwaitWithTimeout(absl::Condition(&loop_stop), absl::Milliseconds(200));
          if (loop_stop) return;
        }
        nodes->SweepLeases();
        status->Sample();
        jobs->Pass(/*full=*/true);
      }
    });
  }
  void StopLoop() {
    {
      absl::MutexLock lock(&loop_mu);
      loop_stop = true;
    }
    if (loop.joinable()) loop.join();
  }
};

MetaServer::MetaServer() : parts_(std::make_unique<Parts>()) {}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const MetaOptions& options) {
  if (options.tls_cert_file.empty() && options.tls_key_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key, ReadSmallFile(options.tls_key_file, "--tls-key"));
  ASSIGN_OR_RETURN(pair.cert_chain, ReadSmallFile(options.tls_cert_file, "--tls-cert"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ReplicaChannelCredentials(
    const MetaOptions& options) {
  if (options.tls_cert_file.empty()) return grpc::InsecureChannelCredentials();
  if (options.tls_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "meta replicas serving TLS need --tls-ca: the CA their certificates are signed by "
        "(each replica checks the others' certificates against it)");
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSmallFile(options.tls_ca_file, "--tls-ca"));
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<MetaServer>> MetaServer::Start(const MetaOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir is required");
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create data dir '", options.data_dir, "': ", ec.message()));
  }
  std::unique_ptr<MetaServer> server(new MetaServer());
  Parts& p = *server->parts_;
  ASSIGN_OR_RETURN(p.store, MetaStore::Open(options.data_dir + "/meta.rocksdb",
                                            MetaStore::Options{options.reserve_bytes,
                                                               /*drop_orphans=*/
                                                               options.leading.etcd == nullptr}));
  if (options.leading.etcd != nullptr) {
    Replicator::Options ro;
    ro.self_id = options.replica_id;
    ro.keys.prefix = options.etcd_prefix;
    ro.term = options.leading.term;
    ro.token = options.token;
    ro.seed = options.leading.applied;
    ro.store = p.store.get();
    ro.snapshot_dir = options.data_dir + "/snapshots";
    ro.keep_bytes = options.replica_keep_bytes;
    ro.start_empty = p.store->Empty();
    ASSIGN_OR_RETURN(ro.channel_creds, ReplicaChannelCredentials(options));
    p.replicator = std::make_unique<Replicator>(options.leading.etcd, ro, p.store->position(),
                                                options.leading.lost);
    RETURN_IF_ERROR(p.store->Lead(options.leading.term, p.replicator.get()));
    p.replica = std::make_unique<ReplicaService>(p.store.get(), options.token);
  }
  p.catalog = std::make_unique<DatasetCatalog>(p.store.get());
  p.checksums = std::make_unique<ChecksumLedger>(p.store.get());
  p.nodes = std::make_unique<NodeRegistry>(p.store.get(), options.lease);
  p.locations = std::make_unique<LocationIndex>(p.store.get());
  p.prefetches = std::make_unique<PrefetchJobs>(p.store.get(), p.catalog.get(), p.nodes.get());
  p.jobs = std::make_unique<JobService>(p.store.get(), p.catalog.get(), p.nodes.get(),
                                        p.locations.get(), p.prefetches.get());
  p.volumes = std::make_unique<VolumeCatalog>(p.store.get(), p.catalog.get());
  RETURN_IF_ERROR(p.catalog->Load());
  RETURN_IF_ERROR(p.volumes->Load());
  RETURN_IF_ERROR(p.nodes->Load());
  RETURN_IF_ERROR(p.locations->Load());
  RETURN_IF_ERROR(p.prefetches->Load());
  RETURN_IF_ERROR(p.jobs->Load());
  p.status = std::make_unique<StatusSurface>(options.listen, p.catalog.get(), p.nodes.get(),
                                             p.locations.get(), p.prefetches.get(), p.jobs.get());
  p.status->RegisterMetrics();
  p.service = std::make_unique<MetaService>(
      MetaUnits{p.catalog.get(), p.checksums.get(), p.nodes.get(), p.locations.get(),
                p.prefetches.get(), p.jobs.get(), p.volumes.get()},
      options.token);
  p.StartLoop();

  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds, ServerCredentials(options));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, creds, &p.port);
  builder.RegisterService(p.service.get());
  if (p.replica) builder.RegisterService(p.replica.get());
  builder.SetMaxReceiveMessageSize(16 << 20);
  // Keep up to 16 idle request threads: gRPC's default (2) ended the threads of every burst of
  // node calls and started new ones for the next (clone, stacks, thread caches: ~6% of meta's
  // time in a small-file prefetch to 3 nodes).
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 16);
  // Clients of meta replicas ping every 2 s while a call is in flight (meta_client.cc): let
  // them (gRPC's default closes a connection that pings more often than every 5 minutes).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  p.server = builder.BuildAndStart();
  if (!p.server || p.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", options.listen,
                                               "' (in use, or not an address of this host)"));
  }
  spdlog::info("meta: serving on {} (port {}, {}, {}), data in {}", options.listen, p.port,
               options.tls_cert_file.empty() ? "plaintext" : "TLS",
               options.token.empty() ? "no token" : "token required", options.data_dir);
  if (!options.http_listen.empty()) {
    auto http =
        p.status->Serve(options.http_listen, HttpAccess{options.token, options.http_open_paths});
    if (!http.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot listen on --http ", options.http_listen,
                                                 ": ", http.status().message()));
    }
    p.http = std::move(*http);
    spdlog::info("meta: HTTP (status page, extender, webhook, /metrics) on {}:{}", p.http->host(),
                 p.http->port());
  }
  if (!options.https_listen.empty()) {
    if (options.https_tls.cert_file.empty() || options.https_tls.key_file.empty()) {
      return absl::InvalidArgumentError("--https needs --https-cert and --https-key");
    }
    auto https =
        p.status->Serve(options.https_listen, HttpAccess{options.token, options.http_open_paths},
                        options.https_tls);
    if (!https.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot serve --https ", options.https_listen,
                                                 ": ", https.status().message()));
    }
    p.https = std::move(*https);
    spdlog::info("meta: HTTPS (the same, for the admission webhook) on {}:{}", p.https->host(),
                 p.https->port());
  }
  return server;
}

MetaServer::~MetaServer() { Shutdown(); }

int MetaServer::port() const { return parts_->port; }
int MetaServer::http_port() const { return parts_->http ? parts_->http->port() : 0; }

void MetaServer::Wait() {
  if (parts_->server) parts_->server->Wait();
}

void MetaServer::Shutdown() {
  Parts& p = *parts_;
  if (p.http) p.http->Stop();
  if (p.https) p.https->Stop();
  p.StopLoop();
  if (p.server) p.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace ember::meta
