// EtcdClient: the few etcd v3 calls meta's leader election needs (etcd.proto), over gRPC to
// one or more etcd members. A call that finds a member unreachable tries the next one, so a
// client rides out the loss of etcd members as long as etcd itself has a quorum.
//
// Thread-safe (gRPC stubs are; the member in use is behind a mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "meta/etcd.grpc.pb.h"

namespace ember::meta {

class EtcdClient {
 public:
  // `endpoints`: comma-separated HOST:PORT (an http:// prefix is accepted and dropped).
  // Returns: the client; InvalidArgument for an empty list.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(
      const std::string& endpoints, std::chrono::milliseconds timeout = std::chrono::seconds(2));

  struct Kv {
    std::string key;
    std::string value;
    int64_t create_revision = 0;
    int64_t mod_revision = 0;
    int64_t lease = 0;
  };

  // A lease of `ttl_seconds`. Returns: its id; etcd's errors as Unavailable naming the member.
  absl::StatusOr<int64_t> Grant(int64_t ttl_seconds);
  // Renews a lease. Returns: the TTL it has again; NotFound when it has expired.
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  absl::Status Revoke(int64_t lease);
  // Returns: the key, or nullopt when absent.
  absl::StatusOr<std::optional<Kv>> Get(const std::string& key);
  // Every key starting with `prefix`, in key order.
  absl::StatusOr<std::vector<Kv>> GetPrefix(const std::string& prefix);
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // An etcd transaction as etcd takes it. Returns: etcd's answer (succeeded: the compares held).
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& txn);

  // The end of the key range of every key starting with `prefix` (etcd's "range_end").
  static std::string PrefixEnd(const std::string& prefix);

 private:
  struct Member {
    std::string address;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  };
  explicit EtcdClient(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  // Calls fn(member, ctx) on the member in use, then on the others while they are unreachable.
  template <typename Fn>
  absl::Status Call(const char* what, Fn fn);

  const std::chrono::milliseconds timeout_;
  std::vector<Member> members_;
  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ember::meta
