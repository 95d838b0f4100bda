#include "meta/replication.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/secret.h"
#include "common/status.h"
#include "meta/meta_client.h"

namespace ember::meta {
namespace {

rpc::ReplicaPosition ToProto(const MetaStore::Position& p) {
  rpc::ReplicaPosition out;
  out.set_term(p.term);
  out.set_seq(p.seq);
  return out;
}
MetaStore::Position FromProto(const rpc::ReplicaPosition& p) { return {p.term(), p.seq()}; }

constexpr auto kCatchUpEvery = std::chrono::milliseconds(300);
// A standby this few batches behind gets them with the leader's commits held back.
constexpr size_t kTailBatches = 64;

}  // namespace

Replicator::Replicator(EtcdClient* etcd, const Options& options, MetaStore::Position start,
                       std::function<void(const std::string&)> lost)
    : etcd_(etcd), options_(options), lost_(std::move(lost)) {
  {
    absl::MutexLock lock(&mu_);
    first_prev_ = start;
    last_ = start;
    if (!options_.seed.empty() && FromProto(options_.seed.back().at()) == start) {
      first_prev_ = FromProto(options_.seed.front().prev());
      for (const auto& b : options_.seed) {
        recent_bytes_ += b.batch().size();
        recent_.push_back({b});
      }
    }
  }
  catch_up_ = std::thread([this] { CatchUpLoop(); });
}

Replicator::~Replicator() {
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = true;
  }
  catch_up_.join();
}

void Replicator::Broken(const std::string& why) {
  if (lost_) lost_(why);
}

bool Replicator::Stopping() {
  absl::MutexLock lock(&stop_mu_);
  return stop_;
}

std::vector<std::string> Replicator::InSync() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, f] : followers_) {
    if (f->in_sync) out.push_back(id);
  }
  return out;
}

void Replicator::Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  if (!options_.token.empty()) {
    ctx->AddMetadata(kAuthMetadataKey, absl::StrCat(kBearerPrefix, options_.token));
  }
}

absl::StatusOr<rpc::ReplicaApplyResponse> Replicator::Send(Follower& f,
                                                           const rpc::ReplicaBatch& b) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.ack_timeout);
  rpc::ReplicaApplyResponse resp;
  grpc::Status s = f.stub->Apply(&ctx, b, &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return resp;
}

bool Replicator::SetInSync(const std::string& id, bool in_sync) {
  etcdserverpb::TxnRequest txn;
  auto* c = txn.add_compare();
  c->set_key(options_.keys.leader());
  c->set_target(etcdserverpb::Compare::CREATE);
  c->set_result(etcdserverpb::Compare::EQUAL);
  c->set_create_revision(static_cast<int64_t>(options_.term));
  auto* op = txn.add_success();
  if (in_sync) {
    op->mutable_request_put()->set_key(options_.keys.in_sync(id));
  } else {
    op->mutable_request_delete_range()->set_key(options_.keys.in_sync(id));
  }
  auto r = etcd_->Txn(txn);
  if (!r.ok()) {
    spdlog::warn("meta replica {}: cannot mark {} {} in etcd: {}", options_.self_id, id,
                 in_sync ? "in sync" : "out of sync", std::string(r.status().message()));
    return false;
  }
  return r->succeeded();
}

absl::Status Replicator::Ship(const MetaStore::Position& prev, const MetaStore::Position& at,
                              const std::string& batch, bool sync) {
  absl::MutexLock lock(&mu_);
  if (gone_) return absl::UnavailableError("this meta replica no longer leads");
  Entry e;
  *e.batch.mutable_prev() = ToProto(prev);
  *e.batch.mutable_at() = ToProto(at);
  e.batch.set_batch(batch);
  e.batch.set_sync(sync);
  // To every in-sync standby at once; then the answers, in turn.
  struct Call {
    std::string id;
    Follower* f;
    grpc::ClientContext ctx;
    rpc::ReplicaApplyResponse resp;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (auto& [id, f] : followers_) {
    if (!f->in_sync) continue;
    calls.push_back(std::make_unique<Call>());
    calls.back()->id = id;
    calls.back()->f = f.get();
  }
  // Shared with the callbacks: one may still be unlocking it when this thread wakes up.
  struct Answers {
    absl::Mutex mu;
    size_t got = 0, want = 0;
    bool All() const { return got == want; }
  };
  auto answers = std::make_shared<Answers>();
  answers->want = calls.size();
  for (auto& c : calls) {
    Prepare(&c->ctx, options_.ack_timeout);
    c->f->stub->async()->Apply(&c->ctx, &e.batch, &c->resp,
                               [answers, call = c.get()](grpc::Status st) {
                                 absl::MutexLock lock(&answers->mu);
                                 call->status = std::move(st);
                                 answers->got++;
                               });
  }
  {
    absl::MutexLock lock(&answers->mu);
    answers->mu.Await(absl::Condition(answers.get(), &Answers::All));
  }
  for (auto& c : calls) {
    if (c->status.ok()) continue;
    // Out of the set before the write is acknowledged: it may no longer campaign.
    spdlog::warn(
        "meta replica {}: standby {} did not take batch {}/{}: {}; dropping it from the "
        "in-sync set",
        options_.self_id, c->id, at.term, at.seq, c->status.error_message());
    if (!SetInSync(c->id, false)) {
      gone_ = true;
      std::string why = absl::StrCat("cannot drop standby ", c->id,
                                     " from the in-sync set: this replica no longer leads");
      if (lost_) lost_(why);
      return absl::UnavailableError(why);
    }
    c->f->in_sync = false;
    c->f->recorded = false;
  }
  recent_bytes_ += batch.size();
  recent_.push_back(std::move(e));
  last_ = at;
  while (recent_bytes_ > options_.keep_bytes && recent_.size() > 1) {
    recent_bytes_ -= recent_.front().batch.batch().size();
    first_prev_ = FromProto(recent_.front().batch.at());
    recent_.pop_front();
  }
  return absl::OkStatus();
}

void Replicator::CatchUpLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&stop_mu_);
      stop_mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(kCatchUpEvery));
      if (stop_) return;
    }
    auto members = etcd_->GetPrefix(options_.keys.members());
    if (!members.ok()) continue;
    std::vector<std::string> ids;
    {
      absl::MutexLock lock(&mu_);
      if (gone_) return;
      for (const auto& kv : *members) {
        std::string id = kv.key.substr(options_.keys.members().size());
        if (id == options_.self_id) continue;
        auto& f = followers_[id];
        if (f == nullptr || f->address != kv.value) {
          bool was_in_sync = f != nullptr && f->in_sync;
          f = std::make_shared<Follower>();
          f->address = kv.value;
          f->in_sync = was_in_sync;
          grpc::ChannelArguments args;
          args.SetMaxSendMessageSize(64 << 20);
          f->stub = rpc::MetaReplica::NewStub(grpc::CreateCustomChannel(
              kv.value,
              options_.channel_creds != nullptr ? options_.channel_creds
                                                : grpc::InsecureChannelCredentials(),
              args));
        }
        if (!f->in_sync) ids.push_back(id);
        // Current, but etcd did not take the key when it joined: until it does, the replica
        // may not campaign.
        if (f->in_sync && !f->recorded && SetInSync(id, true)) {
          f->recorded = true;
          spdlog::info("meta replica {}: standby {} is in sync at {}/{}", options_.self_id, id,
                       last_.term, last_.seq);
        }
      }
    }
    for (const auto& id : ids) CatchUp(id);
  }
}

void Replicator::CatchUp(const std::string& id) {
  std::shared_ptr<Follower> f;
  {
    absl::MutexLock lock(&mu_);
    f = followers_[id];
  }
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.ack_timeout);
  rpc::ReplicaApplyResponse pos;
  if (!f->stub->Position(&ctx, rpc::ReplicaPositionRequest(), &pos).ok()) return;
  MetaStore::Position at = FromProto(pos.position());
  // Ship what it lacks from the recent batches, outside the lock (commits go on meanwhile),
  // then, under the lock, the last few (at most kTailBatches) and into the set.
  for (int round = 0; round < 1000 && !Stopping(); round++) {
    std::vector<rpc::ReplicaBatch> todo;
    bool found;
    {
      absl::MutexLock lock(&mu_);
      if (gone_) return;
      // {0, 0} is where every store starts: the same data only if this one was empty too.
      found = at == first_prev_ && (options_.start_empty || !(at == MetaStore::Position{}));
      for (const Entry& e : recent_) {
        if (found) {
          todo.push_back(e.batch);
          if (todo.size() > kTailBatches) break;
        } else if (FromProto(e.batch.at()) == at) {
          found = true;
        }
      }
      if (found && todo.size() <= kTailBatches) {
        // The last few: shipped with commits held back (the lock), so a standby catches up
        // however fast the leader writes; then into the set. Shipped to from now on even if
        // etcd's answer is lost (the key may be there; the loop records it until it is):
        // shipping to a replica outside the set is harmless, not shipping to one inside it is
        // not.
        for (const auto& b : todo) {
          auto r = Send(*f, b);
          if (!r.ok()) return;  // tried again next round
          at = FromProto(r->position());
        }
        if (!(at == last_)) return;  // a standby answering out of turn: next round
        f->in_sync = true;
        f->recorded = SetInSync(id, true);
        if (f->recorded) {
          spdlog::info("meta replica {}: standby {} is in sync at {}/{}", options_.self_id, id,
                       at.term, at.seq);
        }
        return;
      }
      if (!found) {
        if (std::chrono::steady_clock::now() < f->next_snapshot) return;
        f->next_snapshot = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      }
    }
    if (!found) {
      // Off the kept batches (too far behind, or holding a batch this leader never had).
      spdlog::info(
          "meta replica {}: standby {} is at {}/{}, which the kept batches do not "
          "follow on from: sending it a copy of the store",
          options_.self_id, id, at.term, at.seq);
      auto installed = SendSnapshot(id, *f);
      if (!installed.ok()) {
        spdlog::warn("meta replica {}: copy of the store to {} failed: {}", options_.self_id, id,
                     std::string(installed.status().message()));
        return;
      }
      at = *installed;
      continue;
    }
    for (const auto& b : todo) {
      auto r = Send(*f, b);
      if (!r.ok()) return;  // tried again next round
      at = FromProto(r->position());
    }
  }
}

absl::StatusOr<MetaStore::Position> Replicator::SendSnapshot(const std::string& id, Follower& f) {
  namespace fs = std::filesystem;
  if (options_.store == nullptr) return absl::FailedPreconditionError("no store to copy");
  const std::string dir = absl::StrCat(options_.snapshot_dir, "/", id);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(options_.snapshot_dir, ec);
  RETURN_IF_ERROR(options_.store->Checkpoint(dir));
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(dir, e);
    }
  } cleanup{dir};
  grpc::ClientContext ctx;
  Prepare(&ctx, std::chrono::minutes(30));
  rpc::ReplicaApplyResponse resp;
  auto writer = f.stub->Install(&ctx, &resp);
  uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    rpc::SnapshotChunk chunk;
    chunk.set_file(e.path().filename().string());
    std::string buf(1 << 20, '\0');
    bool sent_any = false;
    while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
      chunk.set_data(buf.data(), static_cast<size_t>(in.gcount()));
      bytes += chunk.data().size();
      if (!writer->Write(chunk)) break;
      sent_any = true;
    }
    if (!sent_any) {
      chunk.clear_data();
      writer->Write(chunk);  // an empty file is a file too
    }
    if (in.bad() || Stopping()) {
      ctx.TryCancel();  // the standby must not put a partial copy in place
      writer->Finish().IgnoreError();
      return absl::CancelledError(absl::StrCat(
          "copy to ", id,
          " not finished: ", in.bad() ? "cannot read " + e.path().string() : "this replica stops"));
    }
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  spdlog::info("meta replica {}: {} installed a copy of the store ({} MiB) at {}/{}",
               options_.self_id, id, bytes >> 20, resp.position().term(), resp.position().seq());
  return FromProto(resp.position());
}

bool ReplicaService::Authorized(grpc::ServerContext* ctx) const {
  if (token_.empty()) return true;
  const auto& md = ctx->client_metadata();
  auto it = md.find(kAuthMetadataKey);
  return it != md.end() && TokenEqual(std::string_view(it->second.data(), it->second.size()),
                                      absl::StrCat(kBearerPrefix, token_));
}

grpc::Status ReplicaService::Apply(grpc::ServerContext* ctx, const rpc::ReplicaBatch* req,
                                   rpc::ReplicaApplyResponse* resp) {
  if (!Authorized(ctx)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "replication needs the cluster token");
  }
  absl::MutexLock lock(&mu_);  // applied and kept in the same order
  absl::Status st = store_->ApplyReplicated(FromProto(req->prev()), FromProto(req->at()),
                                            req->batch(), req->sync());
  *resp->mutable_position() = ToProto(store_->position());
  if (!st.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
  }
  recent_bytes_ += req->batch().size();
  recent_.push_back(*req);
  while (recent_bytes_ > keep_bytes_ && recent_.size() > 1) {
    recent_bytes_ -= recent_.front().batch().size();
    recent_.pop_front();
  }
  return grpc::Status::OK;
}

std::vector<rpc::ReplicaBatch> ReplicaService::Recent() {
  absl::MutexLock lock(&mu_);
  return {recent_.begin(), recent_.end()};
}

grpc::Status ReplicaService::Position(grpc::ServerContext* ctx, const rpc::ReplicaPositionRequest*,
                                      rpc::ReplicaApplyResponse* resp) {
  if (!Authorized(ctx)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "replication needs the cluster token");
  }
  absl::MutexLock lock(&mu_);
  *resp->mutable_position() = ToProto(store_->position());
  return grpc::Status::OK;
}

grpc::Status ReplicaService::Install(grpc::ServerContext* ctx,
                                     grpc::ServerReader<rpc::SnapshotChunk>* reader,
                                     rpc::ReplicaApplyResponse* resp) {
  namespace fs = std::filesystem;
  if (!Authorized(ctx)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "replication needs the cluster token");
  }
  if (!install_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this replica leads");
  }
  absl::MutexLock lock(&mu_);  // no batch applied meanwhile
  std::error_code ec;
  fs::remove_all(incoming_dir_, ec);
  fs::create_directories(incoming_dir_, ec);
  if (ec) return grpc::Status(grpc::StatusCode::INTERNAL, ec.message());
  std::map<std::string, std::ofstream> files;
  rpc::SnapshotChunk chunk;
  while (reader->Read(&chunk)) {
    const std::string& name = chunk.file();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad file name in store copy");
    }
    auto it = files.find(name);
    if (it == files.end()) {
      it = files.emplace(name, std::ofstream(incoming_dir_ + "/" + name, std::ios::binary)).first;
    }
    it->second.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    if (!it->second) return grpc::Status(grpc::StatusCode::INTERNAL, "cannot write " + name);
  }
  for (auto& [name, out] : files) {
    out.flush();
    if (!out) return grpc::Status(grpc::StatusCode::INTERNAL, "cannot write " + name);
  }
  // On disk before it replaces the store: a power loss after the swap must not leave a copy
  // RocksDB cannot open (or one missing batches the leader counts this replica as holding).
  for (const auto& [name, out] : files) {
    if (absl::Status st = SyncPath(incoming_dir_ + "/" + name); !st.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string(st.message()));
    }
  }
  if (absl::Status st = SyncPath(incoming_dir_); !st.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(st.message()));
  }
  files.clear();
  if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "copy cut short");
  auto installed = install_(incoming_dir_);
  if (!installed.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(installed.status().message()));
  }
  store_ = *installed;
  recent_.clear();
  recent_bytes_ = 0;
  *resp->mutable_position() = ToProto(store_->position());
  return grpc::Status::OK;
}

}  // namespace ember::meta
