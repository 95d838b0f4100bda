#include "meta/member.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/status.h"
#include "meta/etcd_client.h"
#include "meta/replication.h"
#include "meta/store.h"

namespace ember::meta {
namespace {

constexpr auto kCampaignEvery = std::chrono::milliseconds(300);
constexpr auto kRenewEvery = std::chrono::milliseconds(1000);
// A leader stops this long before its lease could have ended (counted from the renewal it sent).
constexpr auto kLeaseMargin = std::chrono::milliseconds(500);

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// Every meta RPC on a standby: "not the leader", naming the leader when known.
class MetaMember::NotLeader final : public grpc::CallbackGenericService {
 public:
  explicit NotLeader(MetaMember* m) : m_(m) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    std::string leader;
    {
      absl::MutexLock lock(&m_->mu_);
      leader = m_->leader_;
    }
    std::string msg = "not the leader; ";
    if (auto sp = leader.find(' '); sp != std::string::npos) {
      absl::StrAppend(&msg, "leader is ", leader.substr(sp + 1));
    } else {
      absl::StrAppend(&msg, "no leader yet");
    }
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(const std::string& msg) {
        Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, msg));
      }
      void OnDone() override { delete this; }
    };
    return new Reactor(msg);
  }

 private:
  MetaMember* m_;
};

MetaMember::MetaMember(const MetaOptions& options) : options_(options) {
  advertise_ = options.advertise.empty() ? options.listen : options.advertise;
}

absl::StatusOr<std::unique_ptr<MetaMember>> MetaMember::Start(const MetaOptions& options) {
  if (options.replica_id.empty() || options.etcd.empty()) {
    return absl::InvalidArgumentError("meta replicas need --replica-id and --etcd");
  }
  if (options.replica_id.find_first_of(" /") != std::string::npos) {
    return absl::InvalidArgumentError("--replica-id must not contain spaces or '/'");
  }
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir is required");
  std::unique_ptr<MetaMember> m(new MetaMember(options));
  ASSIGN_OR_RETURN(m->etcd_, EtcdClient::Connect(options.etcd));
  RETURN_IF_ERROR(m->StartStandby());
  if (m->options_.advertise.empty() && m->port_ != 0) {
    // --listen with port 0: others reach this replica on the port it got.
    auto colon = m->options_.listen.rfind(':');
    m->advertise_ = absl::StrCat(m->options_.listen.substr(0, colon), ":", m->port_);
    m->options_.listen = m->advertise_;
  }
  m->keepalive_ = std::thread([p = m.get()] { p->KeepAliveLoop(); });
  m->watchdog_ = std::thread([p = m.get()] { p->Watchdog(); });
  m->campaign_ = std::thread([p = m.get()] { p->CampaignLoop(); });
  return m;
}

absl::Status MetaMember::StartStandby() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options_.data_dir, ec);
  const std::string path = options_.data_dir + "/meta.rocksdb";
  const std::string old = path + ".old", incoming = path + ".incoming";
  // A copy of the leader's store being put in place when this replica died: finish or undo.
  if (!fs::exists(path) && fs::exists(old)) fs::rename(old, path, ec);
  fs::remove_all(old, ec);
  fs::remove_all(incoming, ec);
  ASSIGN_OR_RETURN(store_, MetaStore::Open(path, MetaStore::Options{options_.reserve_bytes,
                                                                    /*drop_orphans=*/false}));
  auto install = [this, path, old](const std::string& dir) -> absl::StatusOr<MetaStore*> {
    store_.reset();
    std::error_code e;
    fs::rename(path, old, e);
    if (!e) fs::rename(dir, path, e);
    if (e)
      return absl::InternalError(absl::StrCat("cannot put the store copy in place: ", e.message()));
    RETURN_IF_ERROR(SyncPath(options_.data_dir));  // the swap itself survives a power loss
    fs::remove_all(old, e);
    ASSIGN_OR_RETURN(store_, MetaStore::Open(path, MetaStore::Options{options_.reserve_bytes}));
    const MetaStore::Position at = store_->position();
    spdlog::info("meta replica {}: installed a copy of the leader's store at {}/{}",
                 options_.replica_id, at.term, at.seq);
    return store_.get();
  };
  replica_ = std::make_unique<ReplicaService>(store_.get(), options_.token, incoming, install);
  not_leader_ = std::make_unique<NotLeader>(this);
  grpc::ServerBuilder builder;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds, ServerCredentials(options_));
  RETURN_IF_ERROR(ReplicaChannelCredentials(options_).status());  // refused now, not at lead
  builder.AddListeningPort(options_.listen, creds, &port_);
  builder.RegisterService(replica_.get());
  builder.RegisterCallbackGenericService(not_leader_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  standby_server_ = builder.BuildAndStart();
  if (!standby_server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", options_.listen, "'"));
  }
  const MetaStore::Position at = store_->position();
  store_empty_at_start_ = store_->Empty();
  spdlog::info("meta replica {}: standby on {} (store at {}/{}), etcd {}", options_.replica_id,
               options_.listen, at.term, at.seq, options_.etcd);
  return absl::OkStatus();
}

MetaMember::~MetaMember() { Shutdown(); }

bool MetaMember::Stopping() {
  absl::MutexLock lock(&mu_);
  return stop_;
}

void MetaMember::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  if (campaign_.joinable()) campaign_.join();
  if (keepalive_.joinable()) keepalive_.join();
  if (watchdog_.joinable()) watchdog_.join();
  {
    absl::MutexLock lock(&mu_);
    if (server_) server_->Shutdown();
  }
  if (standby_server_) standby_server_->Shutdown(std::chrono::system_clock::now());
  // Let the others take over at once rather than after the lease's TTL.
  if (int64_t lease = lease_.load(); lease != 0) (void)etcd_->Revoke(lease);
}

void MetaMember::Wait() {
  while (!Stopping()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  MetaServer* server;
  {
    absl::MutexLock lock(&mu_);  // not held while waiting: Shutdown takes it
    server = server_.get();
  }
  if (server != nullptr) server->Wait();
}

void MetaMember::Lost(const std::string& why) {
  spdlog::critical("meta replica {}: {}; exiting (it must not serve on)", options_.replica_id, why);
  spdlog::default_logger()->flush();
  _exit(75);
}

void MetaMember::Watchdog() {
  // Apart from the renewals, which may wait on etcd longer than the lease has left.
  while (!Stopping()) {
    if (leading_ &&
        NowMs() - renewed_at_ms_.load() > MetaMember::kLeaseSeconds * 1000 - kLeaseMargin.count()) {
      Lost("its etcd lease could not be renewed in time: another replica may lead");
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
  }
}

void MetaMember::KeepAliveLoop() {
  while (!Stopping()) {
    const int64_t sent = NowMs();
    int64_t lease = lease_.load();
    bool ok = false;
    if (lease != 0) {
      auto r = etcd_->KeepAlive(lease);
      ok = r.ok();
      if (!ok && absl::IsNotFound(r.status())) {
        if (leading_) Lost("its etcd lease expired");
        lease_ = lease = 0;
      }
    }
    if (ok) {
      renewed_at_ms_ = sent;
    } else if (leading_) {
      if (sent - renewed_at_ms_.load() > MetaMember::kLeaseSeconds * 1000 - kLeaseMargin.count()) {
        Lost("its etcd lease could not be renewed in time");
      }
    }
    if (lease == 0 && !leading_) {
      auto g = etcd_->Grant(kLeaseSeconds);
      if (g.ok() &&
          etcd_->Put(ReplicaKeys{options_.etcd_prefix}.member(options_.replica_id), advertise_, *g)
              .ok()) {
        lease_ = *g;
        renewed_at_ms_ = sent;
      } else if (!g.ok()) {
        spdlog::warn("meta replica {}: etcd: {}", options_.replica_id,
                     std::string(g.status().message()));
      }
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(kRenewEvery));
  }
}

bool MetaMember::Campaign(uint64_t* term) {
  const ReplicaKeys keys{options_.etcd_prefix};
  const int64_t lease = lease_.load();
  if (lease == 0) return false;
  // Twice: as a replica in the in-sync set, or as any replica of a cluster that never had a
  // leader (then every replica's store is empty).
  for (int attempt = 0; attempt < 2; attempt++) {
    etcdserverpb::TxnRequest txn;
    auto* no_leader = txn.add_compare();
    no_leader->set_key(keys.leader());
    no_leader->set_target(etcdserverpb::Compare::CREATE);
    no_leader->set_result(etcdserverpb::Compare::EQUAL);
    no_leader->set_create_revision(0);
    auto* may = txn.add_compare();
    if (attempt == 0) {
      may->set_key(keys.in_sync(options_.replica_id));
      may->set_target(etcdserverpb::Compare::CREATE);
      may->set_result(etcdserverpb::Compare::GREATER);
      may->set_create_revision(0);
    } else {
      may->set_key(keys.initialized());
      may->set_target(etcdserverpb::Compare::CREATE);
      may->set_result(etcdserverpb::Compare::EQUAL);
      may->set_create_revision(0);
      txn.add_success()->mutable_request_put()->set_key(keys.initialized());
    }
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keys.leader());
    put->set_value(absl::StrCat(options_.replica_id, " ", advertise_));
    put->set_lease(lease);
    auto r = etcd_->Txn(txn);
    if (!r.ok() || !r->succeeded()) continue;
    auto leader = etcd_->Get(keys.leader());
    if (!leader.ok() || !leader->has_value() ||
        (*leader)->value != absl::StrCat(options_.replica_id, " ", advertise_)) {
      return false;
    }
    *term = static_cast<uint64_t>((*leader)->create_revision);
    return true;
  }
  return false;
}

void MetaMember::CampaignLoop() {
  const ReplicaKeys keys{options_.etcd_prefix};
  bool told_not_in_sync = false;
  // An empty store holds none of the writes its in-sync key (if one is left from before: a new
  // disk) vouches for: out of the set first, then it may campaign.
  bool left = !store_empty_at_start_;
  while (!Stopping()) {
    if (!left) {
      etcdserverpb::TxnRequest out;
      out.add_success()->mutable_request_delete_range()->set_key(keys.in_sync(options_.replica_id));
      left = etcd_->Txn(out).ok();
      if (!left) {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(kCampaignEvery));
        continue;
      }
    }
    auto leader = etcd_->Get(keys.leader());
    if (leader.ok()) {
      absl::MutexLock lock(&mu_);
      leader_ = leader->has_value() ? (*leader)->value : std::string();
    }
    // A campaign etcd committed but whose answer was lost: the key is this replica's.
    if (leader.ok() && leader->has_value() &&
        (*leader)->value == absl::StrCat(options_.replica_id, " ", advertise_) &&
        (*leader)->lease == lease_.load() && lease_.load() != 0) {
      Promote(static_cast<uint64_t>((*leader)->create_revision));
      return;
    }
    if (leader.ok() && !leader->has_value() && lease_.load() != 0) {
      uint64_t term = 0;
      if (Campaign(&term)) {
        Promote(term);
        return;
      }
      if (!told_not_in_sync) {
        spdlog::info(
            "meta replica {}: no leader, and this replica may not lead (not in the "
            "in-sync set); waiting for one that may",
            options_.replica_id);
        told_not_in_sync = true;
      }
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(kCampaignEvery));
  }
}

void MetaMember::Promote(uint64_t term) {
  const ReplicaKeys keys{options_.etcd_prefix};
  leading_ = true;
  // The in-sync set is this replica alone until standbys catch up with it: a replica that was
  // in sync with the last leader may hold a batch this one lacks, so it must not lead next.
  auto in_sync = etcd_->GetPrefix(keys.in_syncs());
  if (!in_sync.ok()) Lost(std::string(in_sync.status().message()));
  etcdserverpb::TxnRequest txn;
  auto* c = txn.add_compare();
  c->set_key(keys.leader());
  c->set_target(etcdserverpb::Compare::CREATE);
  c->set_result(etcdserverpb::Compare::EQUAL);
  c->set_create_revision(static_cast<int64_t>(term));
  for (const auto& kv : *in_sync) {
    if (kv.key != keys.in_sync(options_.replica_id)) {
      txn.add_success()->mutable_request_delete_range()->set_key(kv.key);
    }
  }
  txn.add_success()->mutable_request_put()->set_key(keys.in_sync(options_.replica_id));
  auto r = etcd_->Txn(txn);
  if (!r.ok() || !r->succeeded()) {
    Lost(r.ok() ? "its leader key was gone before it could serve"
                : std::string(r.status().message()));
  }
  // The standby's server and store make way for the leader's (same address, same store).
  standby_server_->Shutdown(std::chrono::system_clock::now());
  standby_server_.reset();
  std::vector<rpc::ReplicaBatch> applied = replica_->Recent();
  replica_.reset();
  store_.reset();
  MetaOptions o = options_;
  o.leading = {etcd_.get(), term, [this](const std::string& why) { Lost(why); },
               std::move(applied)};
  auto server = MetaServer::Start(o);
  if (!server.ok()) Lost(absl::StrCat("cannot start serving: ", server.status().message()));
  spdlog::info("meta replica {}: leads (term {}) on {}", options_.replica_id, term,
               options_.listen);
  absl::MutexLock lock(&mu_);
  server_ = std::move(*server);
}

}  // namespace ember::meta
