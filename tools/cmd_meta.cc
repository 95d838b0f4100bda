// `ember meta`: run the metadata service.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/http_server.h"
#include "common/units.h"
#include "meta/member.h"
#include "meta/meta_client.h"
#include "meta/meta_server.h"
#include "tools/cli.h"

namespace ember::tools {

namespace {

// Serves until SIGTERM / SIGINT, then shuts down.
template <typename Server>
void ServeUntilSignal(Server& server) {
  std::thread waiter([&] {
    int sig = WaitForTerminationSignal();
    spdlog::info("meta: signal {}, shutting down", sig);
    server.Shutdown();
  });
  server.Wait();
  waiter.join();
}

}  // namespace

void AddMetaCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("meta", "Run the metadata service");
  struct Opts {
    std::string listen = meta::kDefaultMetaAddress;
    std::string data_dir;
    std::string lease = "10s";
    std::string http;
    std::string token_file;
    std::string tls_cert;
    std::string tls_key;
    std::string tls_ca;
    std::string reserve = "64MiB";
    std::string http_open = "/healthz";
    std::string https;
    std::string https_cert;
    std::string https_key;
    std::string replica_id;
    std::string etcd;
    std::string etcd_prefix = "/ember/meta/";
    std::string advertise;
    std::string replica_keep = "256MiB";
  };
  auto opts = std::make_shared<Opts>();
  cmd->add_option("--listen", opts->listen, "HOST:PORT to serve gRPC on")->capture_default_str();
  cmd->add_option("--data-dir", opts->data_dir, "Directory for the RocksDB store")->required();
  cmd->add_option("--lease", opts->lease, "Node lease: a node silent this long is dead")
      ->capture_default_str();
  cmd->add_option("--http", opts->http,
                  "HOST:PORT for HTTP: the status page (/), /api/status, /metrics, /healthz "
                  "the kube-scheduler extender (/scheduler/filter, /scheduler/prioritize) and the "
                  "admission webhook (/webhook/mutate)");
  cmd->add_option("--https", opts->https,
                  "HOST:PORT serving what --http serves over HTTPS (the Kubernetes API server "
                  "calls the admission webhook /webhook/mutate over HTTPS only)");
  cmd->add_option("--https-cert", opts->https_cert, "PEM certificate chain for --https");
  cmd->add_option("--https-key", opts->https_key, "PEM private key of --https-cert");
  cmd->add_option("--http-open", opts->http_open,
                  "With a cluster token, HTTP paths served without it (comma-separated; a path "
                  "ending in / covers what is below it), e.g. /healthz,/metrics for probes and a "
                  "Prometheus without the token, /scheduler/ for kube-scheduler's extender, "
                  "/webhook/mutate for the admission webhook")
      ->capture_default_str();
  cmd->add_option("--reserve", opts->reserve,
                  "Free space the data dir's file system must keep: below it meta refuses "
                  "writes (clear errors, nothing lost) instead of failing mid-write")
      ->capture_default_str();
  cmd->add_option("--token-file", opts->token_file,
                  "File holding the cluster token every caller must send (default "
                  "$EMBER_TOKEN_FILE)");
  cmd->add_option("--tls-cert", opts->tls_cert, "PEM certificate chain: serve gRPC over TLS");
  cmd->add_option("--tls-key", opts->tls_key, "PEM private key of --tls-cert");
  cmd->add_option("--tls-ca", opts->tls_ca,
                  "With --replica-id and --tls-cert: PEM CA the replicas' certificates are "
                  "signed by (replicas check each other's against it; each certificate must name "
                  "every address the replica is reached at)");
  cmd->add_option("--replica-id", opts->replica_id,
                  "Run as one of several meta replicas (with --etcd): a leader elected in etcd "
                  "serves, the others follow its writes and take over when it fails "
                  "(docs/meta-ha.md). Give clients and nodes every replica's address: "
                  "--meta A,B,C");
  cmd->add_option("--etcd", opts->etcd, "etcd members for --replica-id: HOST:PORT,...");
  cmd->add_option("--etcd-prefix", opts->etcd_prefix,
                  "Where the replicas keep their keys in etcd (one prefix per meta cluster)")
      ->capture_default_str();
  cmd->add_option("--replica-keep", opts->replica_keep,
                  "How much of its recent writes a leading replica keeps to catch standbys up; "
                  "a standby further behind gets a copy of the whole store")
      ->capture_default_str();
  cmd->add_option("--advertise", opts->advertise,
                  "HOST:PORT other replicas and clients reach this replica at (default --listen)");
  cmd->callback([opts] {
    if (auto s = ValidateHostPort("--listen", opts->listen); !s.ok()) Fail(s);
    auto lease = ParseDuration(opts->lease);
    if (!lease.ok()) Fail(lease.status());
    if (lease->count() < 100) Fail("--lease must be at least 100ms");
    auto reserve = ParseSize(opts->reserve);
    if (!reserve.ok()) Fail(reserve.status());
    BlockTerminationSignals();
    meta::MetaOptions options;
    options.listen = opts->listen;
    options.data_dir = opts->data_dir;
    options.lease = *lease;
    options.http_listen = opts->http;
    options.https_listen = opts->https;
    options.https_tls = {opts->https_cert, opts->https_key};
    MetaFlags token_only;
    token_only.token_file = opts->token_file;
    options.token = ResolveCredentials(token_only).token;
    options.tls_cert_file = opts->tls_cert;
    options.tls_key_file = opts->tls_key;
    options.tls_ca_file = opts->tls_ca;
    options.reserve_bytes = *reserve;
    auto open_paths = HttpAccess::ParsePaths(opts->http_open);
    if (!open_paths.ok()) Fail(absl::StrCat("--http-open: ", open_paths.status().message()));
    options.http_open_paths = *open_paths;
    if (!opts->replica_id.empty() || !opts->etcd.empty()) {
      if (opts->replica_id.empty() || opts->etcd.empty()) {
        Fail("meta replicas need both --replica-id and --etcd");
      }
      options.replica_id = opts->replica_id;
      options.etcd = opts->etcd;
      options.etcd_prefix = opts->etcd_prefix;
      options.advertise = opts->advertise;
      auto keep = ParseSize(opts->replica_keep);
      if (!keep.ok()) Fail(absl::StrCat("--replica-keep: ", keep.status().message()));
      options.replica_keep_bytes = *keep;
      auto member = meta::MetaMember::Start(options);
      if (!member.ok()) Fail(member.status());
      ServeUntilSignal(**member);
      return;
    }
    auto server = meta::MetaServer::Start(options);
    if (!server.ok()) Fail(server.status());
    ServeUntilSignal(**server);
  });
}

}  // namespace ember::tools
