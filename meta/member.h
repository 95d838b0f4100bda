// MetaMember: one of several meta replicas (`ember meta --replica-id ID --etcd ...`;
// docs/meta-ha.md). It starts as a standby: it applies the leader's write stream
// (replication.h) and answers every meta RPC with FAILED_PRECONDITION "not the leader; leader is
// ADDRESS", which MetaClient follows. It campaigns in etcd whenever no leader key exists and it
// may lead (it is in the in-sync set, or the set is empty: a new cluster). On winning it becomes
// a full MetaServer over its own store, replicating every write to the standbys in sync. A
// leader that cannot renew its etcd lease in time exits (a supervisor restarts it as a standby):
// it must not serve once another replica may lead.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "meta/meta_server.h"

namespace grpc {
class Server;
}

namespace ember::meta {

class EtcdClient;
class MetaStore;
class ReplicaService;

class MetaMember {
 public:
  // REQUIRES: options.replica_id and options.etcd set. Returns: the member, serving as a
  // standby; errors opening the store or binding the address.
  static absl::StatusOr<std::unique_ptr<MetaMember>> Start(const MetaOptions& options);
  ~MetaMember();

  void Wait();
  void Shutdown();
  bool leading() const { return leading_; }
  int port() const { return port_; }

  // How long a lease lasts, and how often it is renewed.
  static constexpr int64_t kLeaseSeconds = 3;

 private:
  explicit MetaMember(const MetaOptions& options);
  absl::Status StartStandby();
  void KeepAliveLoop();
  // Exits a leader whose lease may have ended (kLeaseMargin before it could).
  void Watchdog();
  void CampaignLoop();
  // Returns: whether this replica won (then `term` is set).
  bool Campaign(uint64_t* term);
  void Promote(uint64_t term);
  void Lost(const std::string& why);
  bool Stopping() ABSL_LOCKS_EXCLUDED(mu_);

  MetaOptions options_;
  std::string advertise_;
  std::unique_ptr<EtcdClient> etcd_;
  std::atomic<int64_t> lease_{0};
  std::atomic<int64_t> renewed_at_ms_{0};  // steady clock, when the last good renewal was sent
  std::atomic<bool> leading_{false};
  int port_ = 0;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string leader_ ABSL_GUARDED_BY(mu_);  // "ID ADDRESS" as last read, for refusals
  // Standby: its store, replication service, and the server answering "not the leader".
  std::unique_ptr<MetaStore> store_;
  std::unique_ptr<ReplicaService> replica_;
  class NotLeader;
  std::unique_ptr<NotLeader> not_leader_;
  std::unique_ptr<grpc::Server> standby_server_;
  // Leader.
  std::unique_ptr<MetaServer> server_ ABSL_GUARDED_BY(mu_);
  bool store_empty_at_start_ = false;
  std::thread keepalive_, campaign_, watchdog_;
};

}  // namespace ember::meta
