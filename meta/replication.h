// Meta replicas (docs/meta-ha.md): a leader and standbys, each with its own RocksDB; etcd
// decides who leads and who is in sync. This file has the two halves of the write stream:
//   Replicator      the leader's: every store commit (MetaStore::Shipper) goes to each in-sync
//                   standby before it is acknowledged; a standby that fails is dropped from the
//                   in-sync set in etcd first (a transaction guarded by the leader's key, so a
//                   deposed leader cannot do it). Standbys that are behind are caught up from the
//                   recent batches it keeps, then added to the set.
//   ReplicaService  a standby's: applies batches that follow on from its position.
// The election itself (who campaigns, when) is member.h's.
//
// etcd keys under a prefix P (default "/ember/meta/"):
//   P leader          "ID ADDRESS" on the leader's lease; its create revision is the term
//   P member/ID       ADDRESS on each replica's lease: who the leader should replicate to
//   P in-sync/ID      present while replica ID holds every acknowledged write
//   P initialized     created by the first leader of the cluster (before it, anyone may lead)
#pragma once

#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "meta/etcd_client.h"
#include "meta/meta.grpc.pb.h"
#include "meta/store.h"

namespace ember::meta {

struct ReplicaKeys {
  std::string prefix = "/ember/meta/";
  std::string leader() const { return prefix + "leader"; }
  std::string member(const std::string& id) const { return prefix + "member/" + id; }
  std::string members() const { return prefix + "member/"; }
  std::string in_sync(const std::string& id) const { return prefix + "in-sync/" + id; }
  std::string in_syncs() const { return prefix + "in-sync/"; }
  // Created by the first leader: from then on only in-sync replicas may lead.
  std::string initialized() const { return prefix + "initialized"; }
};

class Replicator final : public MetaStore::Shipper {
 public:
  struct Options {
    std::string self_id;
    ReplicaKeys keys;
    uint64_t term = 0;               // the leader key's create revision
    std::string token;               // the cluster token, sent to the standbys
    size_t keep_bytes = 256u << 20;  // recent batches kept to catch standbys up
    std::chrono::milliseconds ack_timeout{1000};
    // The batches this replica applied last as a standby (ReplicaService::Recent), oldest
    // first, ending at `start`: a replica that was a little behind the last leader catches up
    // from them too.
    std::vector<rpc::ReplicaBatch> seed;
    // A standby the kept batches cannot catch up gets a copy of the whole store, made here
    // (same file system as the store: hard links).
    MetaStore* store = nullptr;
    std::string snapshot_dir;
    // The store held nothing when this replica began to lead: a standby at {0, 0} is then
    // current. Otherwise {0, 0} is an empty store (or one from before replication) and gets a
    // copy.
    bool start_empty = false;
    // How standbys are reached (TLS or plaintext; null: plaintext).
    std::shared_ptr<grpc::ChannelCredentials> channel_creds;
  };
  // `start`: the store's position when this replica began to lead. `lost`: called (once) when
  // this replica finds it no longer leads (it must stop serving). Starts the catch-up thread.
  Replicator(EtcdClient* etcd, const Options& options, MetaStore::Position start,
             std::function<void(const std::string&)> lost);
  ~Replicator() override;

  absl::Status Ship(const MetaStore::Position& prev, const MetaStore::Position& at,
                    const std::string& batch, bool sync) override ABSL_LOCKS_EXCLUDED(mu_);
  void Broken(const std::string& why) override;

  // The replicas now in sync (not this one).
  std::vector<std::string> InSync() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    rpc::ReplicaBatch batch;
  };
  struct Follower {
    std::string address;
    std::unique_ptr<rpc::MetaReplica::Stub> stub;
    bool in_sync = false;   // shipped every batch
    bool recorded = false;  // and P in-sync/ID is in etcd (retried until it is)
    std::chrono::steady_clock::time_point next_snapshot{};
  };
  // A call's deadline and the cluster token.
  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const;
  absl::StatusOr<rpc::ReplicaApplyResponse> Send(Follower& f, const rpc::ReplicaBatch& b);
  // Puts (or deletes) P in-sync/ID if this replica still leads. Returns: whether it did.
  bool SetInSync(const std::string& id, bool in_sync);
  void CatchUpLoop();
  void CatchUp(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  bool Stopping() ABSL_LOCKS_EXCLUDED(stop_mu_);
  // Sends the follower a copy of the store. Returns: its position after installing it.
  absl::StatusOr<MetaStore::Position> SendSnapshot(const std::string& id, Follower& f);

  EtcdClient* etcd_;
  const Options options_;
  const std::function<void(const std::string&)> lost_;
  absl::Mutex mu_;  // held across a Ship (one numbered stream)
  std::deque<Entry> recent_ ABSL_GUARDED_BY(mu_);
  size_t recent_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  MetaStore::Position first_prev_ ABSL_GUARDED_BY(mu_);  // prev of recent_.front()
  MetaStore::Position last_ ABSL_GUARDED_BY(mu_);        // the newest position
  std::map<std::string, std::shared_ptr<Follower>> followers_ ABSL_GUARDED_BY(mu_);
  bool gone_ ABSL_GUARDED_BY(mu_) = false;  // lost leadership
  absl::Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread catch_up_;
};

// A standby's end of the stream (also served by the leader, which refuses batches).
class ReplicaService final : public rpc::MetaReplica::Service {
 public:
  // Keeps the last `keep_bytes` of batches it applied (Recent).
  // `install(dir)`: replaces the store with the copy received into `dir`; returns the new one.
  // Unset: Install is refused (a leader's service).
  using InstallFn = std::function<absl::StatusOr<MetaStore*>(const std::string& dir)>;
  ReplicaService(MetaStore* store, std::string token, std::string incoming_dir = "",
                 InstallFn install = {}, size_t keep_bytes = 64u << 20)
      : store_(store),
        token_(std::move(token)),
        incoming_dir_(std::move(incoming_dir)),
        install_(std::move(install)),
        keep_bytes_(keep_bytes) {}
  grpc::Status Apply(grpc::ServerContext* ctx, const rpc::ReplicaBatch* req,
                     rpc::ReplicaApplyResponse* resp) override;
  grpc::Status Position(grpc::ServerContext* ctx, const rpc::ReplicaPositionRequest* req,
                        rpc::ReplicaApplyResponse* resp) override;
  grpc::Status Install(grpc::ServerContext* ctx, grpc::ServerReader<rpc::SnapshotChunk>* reader,
                       rpc::ReplicaApplyResponse* resp) override;
  // The batches applied lately, oldest first (each follows on from the one before).
  std::vector<rpc::ReplicaBatch> Recent() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool Authorized(grpc::ServerContext* ctx) const;
  absl::Mutex mu_;
  MetaStore* store_ ABSL_GUARDED_BY(mu_);
  const std::string token_;
  const std::string incoming_dir_;
  const InstallFn install_;
  const size_t keep_bytes_;
  std::deque<rpc::ReplicaBatch> recent_ ABSL_GUARDED_BY(mu_);
  size_t recent_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ember::meta
