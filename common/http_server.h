// HttpServer: an HTTP listener on its own thread (cpp-httplib) for the small surfaces meta and
// nodes serve: /metrics and /healthz everywhere, plus meta's status page, status API and
// scheduler extender. The caller adds its routes before the server starts listening.
//
// Thread-safe to stop from any thread; the destructor stops and joins.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace ember {

// Who may call: with a token, every request must carry `Authorization: Bearer TOKEN` (compared
// in constant time), except for the paths left open (an exact path, or a prefix ending in '/'):
// e.g. /healthz for probes, /metrics for a Prometheus without the token. Without a token,
// everything is open. A refused request gets 401 with a line saying what is missing.
struct HttpAccess {
  std::string token;
  std::vector<std::string> open_paths = {"/healthz"};
  // "/healthz,/metrics" -> paths. Returns: InvalidArgument for a path not starting with '/'.
  static absl::StatusOr<std::vector<std::string>> ParsePaths(const std::string& csv);
  bool Allows(const std::string& path, const std::string& authorization) const;
};

// Serving HTTPS instead of HTTP: a PEM certificate chain and its key (both or neither). The
// Kubernetes API server calls admission webhooks over HTTPS only.
struct HttpTls {
  std::string cert_file;
  std::string key_file;
};

class HttpServer {
 public:
  // Binds `listen` ("HOST:PORT"; port 0 picks a free one), lets `routes` add handlers, and
  // serves on a thread under `access`. Every server also answers GET /healthz ("ok") and GET
  // /metrics (the process's metrics::Global() registry). `flag` names the option in errors.
  // With `tls` set it serves HTTPS. Returns: InvalidArgument (not HOST:PORT; a certificate
  // without its key or the reverse); FailedPrecondition (cannot listen there; the certificate or
  // key cannot be read or do not match).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& listen, const std::string& flag,
      const std::function<void(httplib::Server&)>& routes, const HttpAccess& access = {},
      const HttpTls& tls = {});
  ~HttpServer();

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  void Stop();

 private:
  HttpServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
};

}  // namespace ember
