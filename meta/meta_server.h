// meta/: the metadata service. This header is its front door: `ember meta` and `ember up` start
// a MetaServer; everything else talks to meta through meta_client.h.
//
// meta/ owns datasets and their manifests, writable volumes' namespaces, block checksums, nodes
// and leases, block locations, prefetch jobs, training jobs and their placement, and the HTTP
// surface (status page, extender, /metrics). It reads origins only to list them (origin/), and
// never includes cachefs/.
//
// The service is a set of units, each owning one kind of state behind one mutex:
//   DatasetCatalog (catalog.h)        datasets, versions, manifests, version geometry
//   ChecksumLedger (checksum_ledger.h) block checksums, first writer wins
//   NodeRegistry   (node_registry.h)   nodes, labels, leases; versioned views for readers
//   LocationIndex  (location_index.h)  who holds which block; Locate; resident bytes
//   PrefetchJobs   (prefetch_jobs.h)   cluster prefetches
//   JobService     (job_service.h)     training jobs, queue, placement (pure logic: scheduler.h)
//   VolumeCatalog  (volumes.h)         writable volumes: their trees, write leases, commits
//   StatusSurface  (status_surface.h)  HTTP: status page and API, extender, /metrics
//   MetaService    (meta_service.h)    gRPC: translates, checks the token; no state
// Replicas (docs/meta-ha.md): MetaMember (member.h) runs one of several `ember meta
// --replica-id` processes: a standby applies the leader's write stream (replication.h) and
// becomes a MetaServer when etcd (etcd_client.h) elects it.
// The rule that keeps them apart: a unit never calls another unit while holding its own mutex
// (it asks others first, then locks). So no two units' locks ever nest, and a slow scan in one
// (a manifest, a store write) never stalls Locate or Heartbeat in another.
//
// Every unit writes to the store (store.h, RocksDB) before it changes memory, and a write the
// store refuses fails the RPC with that error: what a caller was told is what a restart finds.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http_server.h"
#include "meta/meta.pb.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace ember::meta {

class EtcdClient;

struct MetaOptions {
  std::string listen = "127.0.0.1:7370";  // host:port; port 0 picks a free one
  std::string data_dir;                   // RocksDB lives here
  // A node whose last heartbeat is older than this is dead: its locations are not returned.
  std::chrono::milliseconds lease{10'000};
  // HOST:PORT for HTTP (status page, /api/status, /metrics, /healthz, kube-scheduler extender at
  // /scheduler/filter and /scheduler/prioritize, admission webhook at /webhook/mutate); empty =
  // no HTTP.
  std::string http_listen;
  // HOST:PORT serving the same over HTTPS with this certificate (the Kubernetes API server calls
  // admission webhooks over HTTPS only); empty = none.
  std::string https_listen;
  HttpTls https_tls;
  // Cluster token every gRPC call must carry (empty: none required); HTTP requests must carry it
  // too (Authorization: Bearer) except for these paths (common/http_server.h).
  std::string token;
  std::vector<std::string> http_open_paths = {"/healthz"};
  // PEM files: with both set, gRPC is served over TLS only.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Replicas with TLS: the CA the replicas' certificates are signed by (each replica checks the
  // others' against it when it sends them its writes).
  std::string tls_ca_file;
  // Writes are refused (ResourceExhausted) while the data dir's file system has less free space
  // than this, before RocksDB could fail mid-write on a full disk.
  uint64_t reserve_bytes = 64ull << 20;

  // Replicas (member.h; docs/meta-ha.md): with replica_id set, `ember meta` runs as one of
  // several replicas that elect a leader in etcd and replicate its writes.
  std::string replica_id;
  std::string etcd;                          // etcd members, HOST:PORT,...
  std::string etcd_prefix = "/ember/meta/";  // the replicas' keys in etcd
  std::string advertise;                     // the address others reach this replica at (= listen)
  // How much of its recent write stream a leader keeps to catch standbys up; one further behind
  // gets a copy of the whole store.
  uint64_t replica_keep_bytes = 256ull << 20;
  // Set by MetaMember when this replica leads: the server replicates every store write.
  struct Leading {
    EtcdClient* etcd = nullptr;
    uint64_t term = 0;
    std::function<void(const std::string&)> lost;  // leadership lost: stop serving
    std::vector<rpc::ReplicaBatch> applied;        // its last batches as a standby (replication.h)
  };
  Leading leading;
};

// What meta's gRPC is served with: TLS from --tls-cert/--tls-key, or plaintext. Returns:
// InvalidArgument (one of the two missing); the files' read errors.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const MetaOptions& options);
// What a replica reaches the other replicas with: TLS checked against --tls-ca when it serves
// TLS, else plaintext. Returns: InvalidArgument (TLS without --tls-ca); read errors.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ReplicaChannelCredentials(
    const MetaOptions& options);

class MetaServer {
 public:
  // Opens the store and starts serving. Returns: Ok, or the store's error, or Unavailable when
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetaServer>> Start(const MetaOptions& options);
  ~MetaServer();

  int port() const;
  int http_port() const;
  // Blocks until Shutdown() is called from another thread.
  void Wait();
  void Shutdown();

 private:
  struct Parts;
  MetaServer();
  std::unique_ptr<Parts> parts_;
};

}  // namespace ember::meta
