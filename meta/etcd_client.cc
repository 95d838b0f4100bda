#include "meta/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ember::meta {

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const std::string& endpoints,
                                                                std::chrono::milliseconds timeout) {
  std::unique_ptr<EtcdClient> c(new EtcdClient(timeout));
  for (absl::string_view e : absl::StrSplit(endpoints, ',', absl::SkipWhitespace())) {
    e = absl::StripAsciiWhitespace(e);
    absl::ConsumePrefix(&e, "http://");
    while (absl::ConsumeSuffix(&e, "/")) {
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    // Not MIN_RECONNECT_BACKOFF: gRPC also takes it as the connect timeout, and etcd can take
    // longer than 100 ms to send its first SETTINGS frame.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto channel =
        grpc::CreateCustomChannel(std::string(e), grpc::InsecureChannelCredentials(), args);
    c->members_.push_back({std::string(e), etcdserverpb::KV::NewStub(channel),
                           etcdserverpb::Lease::NewStub(channel)});
  }
  if (c->members_.empty()) {
    return absl::InvalidArgumentError("--etcd needs at least one HOST:PORT of an etcd member");
  }
  return c;
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(end.back() + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

template <typename Fn>
absl::Status EtcdClient::Call(const char* what, Fn fn) {
  size_t start;
  {
    absl::MutexLock lock(&mu_);
    start = current_;
  }
  grpc::Status s;
  for (size_t i = 0; i < members_.size(); i++) {
    Member& m = members_[(start + i) % members_.size()];
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
    s = fn(m, &ctx);
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      current_ = (start + i) % members_.size();
      return absl::OkStatus();
    }
    // Another member may answer: unreachable, or it has no leader (partitioned away).
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("etcd ", what, " at ", m.address, ": ", s.error_message()));
    }
  }
  return absl::UnavailableError(
      absl::StrCat("etcd ", what, ": no member answered (last: ", s.error_message(), ")"));
}

absl::StatusOr<int64_t> EtcdClient::Grant(int64_t ttl_seconds) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_seconds);
  etcdserverpb::LeaseGrantResponse resp;
  absl::Status st = Call("lease grant", [&](Member& m, grpc::ClientContext* ctx) {
    return m.lease->LeaseGrant(ctx, req, &resp);
  });
  if (!st.ok()) return st;
  if (!resp.error().empty()) return absl::UnavailableError("etcd lease grant: " + resp.error());
  return resp.id();
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  etcdserverpb::LeaseKeepAliveResponse resp;
  absl::Status st = Call("lease keep-alive", [&](Member& m, grpc::ClientContext* ctx) {
    auto stream = m.lease->LeaseKeepAlive(ctx);
    etcdserverpb::LeaseKeepAliveRequest req;
    req.set_id(lease);
    if (!stream->Write(req) || !stream->Read(&resp)) {
      stream->WritesDone();
      grpc::Status s = stream->Finish();
      return s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream ended") : s;
    }
    stream->WritesDone();
    ctx->TryCancel();  // one renewal per stream: do not wait for etcd to close it
    return grpc::Status::OK;
  });
  if (!st.ok()) return st;
  if (resp.ttl() <= 0) return absl::NotFoundError("etcd lease expired");
  return resp.ttl();
}

absl::Status EtcdClient::Revoke(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseRevokeResponse resp;
  return Call("lease revoke", [&](Member& m, grpc::ClientContext* ctx) {
    return m.lease->LeaseRevoke(ctx, req, &resp);
  });
}

namespace {
EtcdClient::Kv FromProto(const etcdserverpb::KeyValue& kv) {
  return {kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()};
}
}  // namespace

absl::StatusOr<std::optional<EtcdClient::Kv>> EtcdClient::Get(const std::string& key) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  etcdserverpb::RangeResponse resp;
  absl::Status st = Call(
      "get", [&](Member& m, grpc::ClientContext* ctx) { return m.kv->Range(ctx, req, &resp); });
  if (!st.ok()) return st;
  if (resp.kvs_size() == 0) return std::optional<Kv>();
  return std::optional<Kv>(FromProto(resp.kvs(0)));
}

absl::StatusOr<std::vector<EtcdClient::Kv>> EtcdClient::GetPrefix(const std::string& prefix) {
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  etcdserverpb::RangeResponse resp;
  absl::Status st = Call(
      "get", [&](Member& m, grpc::ClientContext* ctx) { return m.kv->Range(ctx, req, &resp); });
  if (!st.ok()) return st;
  std::vector<Kv> out;
  for (const auto& kv : resp.kvs()) out.push_back(FromProto(kv));
  return out;
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  return Call("put",
              [&](Member& m, grpc::ClientContext* ctx) { return m.kv->Put(ctx, req, &resp); });
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const etcdserverpb::TxnRequest& txn) {
  etcdserverpb::TxnResponse resp;
  absl::Status st =
      Call("txn", [&](Member& m, grpc::ClientContext* ctx) { return m.kv->Txn(ctx, txn, &resp); });
  if (!st.ok()) return st;
  return resp;
}

}  // namespace ember::meta
