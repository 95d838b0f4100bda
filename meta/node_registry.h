// NodeRegistry: the cluster's nodes, their labels and heartbeat leases.
//
// A node registers (id, address, labels, GPUs, capacity; written to the store before it counts)
// and heartbeats with its cache figures. A node silent longer than the lease is dead: readers of
// a NodeView see it so, and the node's blocks are not offered to others. After a meta restart
// every known node gets one lease to check in.
//
// Readers take a NodeView: an immutable, versioned membership (rebuilt only when a node
// registers, so a view costs a pointer copy and one pass over the leases) and the liveness of
// each member at the moment the view was taken.
//
// Thread-safe; one mutex, never held across a call into another unit.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "meta/meta.pb.h"
#include "meta/store.h"

namespace ember::meta {

// What the rest of meta needs of a node's registration.
struct NodeInfo {
  std::string id;
  std::string address;
  std::string sw;    // `switch` label ("" if none)
  std::string rack;  // `rack` label ("" if none)
  uint32_t gpus = 0;
  uint64_t capacity_bytes = 0;
};

struct Membership {
  uint64_t version = 0;                          // changes whenever a node registers
  std::vector<NodeInfo> nodes;                   // by slot, sorted by id
  std::unordered_map<std::string, size_t> slot;  // id -> index in nodes
};

struct NodeView {
  std::shared_ptr<const Membership> members;
  std::vector<bool> alive;                      // by slot, at the time of the view
  std::vector<int64_t> last_heartbeat_unix_ms;  // by slot
  int64_t lease_ms = 0;

  const NodeInfo* Find(const std::string& id) const;
  bool Alive(const std::string& id) const;
};

class NodeRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  // REQUIRES: the store outlives the registry.
  NodeRegistry(MetaStore* store, std::chrono::milliseconds lease);

  // Loads the registered nodes. Returns: Ok; the store's errors.
  absl::Status Load();
  // Registers (or re-registers) a node. Returns: Ok; InvalidArgument (no id or address); the
  // store's errors (the node is then not registered).
  absl::StatusOr<rpc::RegisterNodeResponse> Register(const rpc::Node& node);
  // Renews a lease and keeps the node's figures. Returns false if the node is unknown (it must
  // register again).
  bool Heartbeat(const std::string& node_id, const rpc::NodeStats& stats);

  NodeView View();
  // Every node as the API shows it: registration, state, last figures.
  std::vector<rpc::Node> List();
  bool Known(const std::string& node_id);
  // Logs and counts nodes whose lease ran out since the last call.
  void SweepLeases();

 private:
  struct Entry {
    rpc::Node node;  // registration, last heartbeat time and figures
    Clock::time_point last_heartbeat;
  };
  bool AliveLocked(const Entry& e, Clock::time_point now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void RebuildLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MetaStore* const store_;
  const std::chrono::milliseconds lease_;
  absl::Mutex mu_;
  std::map<std::string, Entry> nodes_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Membership> members_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> was_alive_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::meta
