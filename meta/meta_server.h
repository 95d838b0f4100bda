// MetaServer: the metadata service, a gRPC server over a RocksDB store (see meta.proto).
//
// Holds datasets and their versioned manifests, block checksums (first writer wins), nodes with
// heartbeat leases, and block locations (soft state, kept in memory as per-file bitmaps and
// persisted for a fast restart). Every RPC handler converts absl::Status to grpc::Status at its
// end; nothing throws out of a handler. Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace grpc {
class Server;
}
namespace httplib {
class Server;
}

namespace ember::meta {

struct MetaOptions {
  std::string listen = "127.0.0.1:7370";  // host:port; port 0 picks a free one
  std::string data_dir;                   // RocksDB lives here
  // A node whose last heartbeat is older than this is dead: its locations are not returned.
  std::chrono::milliseconds lease{10'000};
  // HOST:PORT for HTTP (kube-scheduler extender at /scheduler/filter and /scheduler/prioritize,
  // /healthz); empty = no HTTP.
  std::string http_listen;
  // Cluster token every gRPC call must carry (empty: none required).
  std::string token;
  // PEM files: with both set, gRPC is served over TLS only.
  std::string tls_cert_file;
  std::string tls_key_file;
};

class MetaServiceImpl;

class MetaServer {
 public:
  // Opens the store and starts serving. Returns: Ok, or the store's error, or Unavailable when
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetaServer>> Start(const MetaOptions& options);
  ~MetaServer();

  int port() const { return port_; }
  int http_port() const { return http_port_; }
  // Blocks until Shutdown() is called from another thread.
  void Wait();
  void Shutdown();

 private:
  MetaServer() = default;
  std::unique_ptr<MetaServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int http_port_ = 0;
};

}  // namespace ember::meta
