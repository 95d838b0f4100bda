#include "meta/node_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/metrics.h"
#include "common/status.h"
#include "common/units.h"

namespace ember::meta {
namespace {

std::string Label(const rpc::Node& n, const char* key) {
  auto it = n.labels().find(key);
  return it == n.labels().end() ? "" : it->second;
}

}  // namespace

const NodeInfo* NodeView::Find(const std::string& id) const {
  if (!members) return nullptr;
  auto it = members->slot.find(id);
  return it == members->slot.end() ? nullptr : &members->nodes[it->second];
}

bool NodeView::Alive(const std::string& id) const {
  if (!members) return false;
  auto it = members->slot.find(id);
  return it != members->slot.end() && alive[it->second];
}

NodeRegistry::NodeRegistry(MetaStore* store, std::chrono::milliseconds lease)
    : store_(store), lease_(lease), members_(std::make_shared<Membership>()) {}

absl::Status NodeRegistry::Load() {
  ASSIGN_OR_RETURN(std::vector<rpc::Node> nodes, store_->ListNodes());
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  for (auto& n : nodes) {
    std::string id = n.id();
    nodes_[id] = Entry{std::move(n), now};  // one lease to check in
  }
  RebuildLocked();
  return absl::OkStatus();
}

bool NodeRegistry::AliveLocked(const Entry& e, Clock::time_point now) const {
  return now - e.last_heartbeat <= lease_;
}

void NodeRegistry::RebuildLocked() {
  auto m = std::make_shared<Membership>();
  m->version = members_->version + 1;
  for (const auto& [id, e] : nodes_) {
    m->slot[id] = m->nodes.size();
    m->nodes.push_back(NodeInfo{id, e.node.address(), Label(e.node, "switch"),
                                Label(e.node, "rack"), e.node.gpus(), e.node.capacity_bytes()});
  }
  members_ = std::move(m);
}

absl::StatusOr<rpc::RegisterNodeResponse> NodeRegistry::Register(const rpc::Node& in) {
  if (in.id().empty()) return absl::InvalidArgumentError("node id is empty");
  if (in.address().empty()) return absl::InvalidArgumentError("node address is empty");
  rpc::Node n = in;
  n.set_registered_unix_ms(NowUnixMs());
  n.set_last_heartbeat_unix_ms(NowUnixMs());
  n.set_state(rpc::Node::ALIVE);
  RETURN_IF_ERROR(store_->PutNode(n));
  {
    absl::MutexLock lock(&mu_);
    nodes_[n.id()] = Entry{n, Clock::now()};
    RebuildLocked();
  }
  spdlog::info("meta: node {} registered at {} ({} GPUs, capacity {} bytes)", n.id(), n.address(),
               n.gpus(), n.capacity_bytes());
  rpc::RegisterNodeResponse resp;
  const uint32_t lease = static_cast<uint32_t>(lease_.count());
  resp.set_lease_ms(lease);
  resp.set_heartbeat_interval_ms(std::max<uint32_t>(lease / 3, 50));
  return resp;
}

bool NodeRegistry::Heartbeat(const std::string& node_id, const rpc::NodeStats& stats) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return false;
  const Clock::time_point now = Clock::now();
  if (!AliveLocked(it->second, now)) spdlog::info("meta: node {} is back", node_id);
  it->second.last_heartbeat = now;
  it->second.node.set_last_heartbeat_unix_ms(NowUnixMs());
  *it->second.node.mutable_stats() = stats;
  return true;
}

NodeView NodeRegistry::View() {
  NodeView v;
  v.lease_ms = lease_.count();
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  v.members = members_;
  v.alive.reserve(members_->nodes.size());
  v.last_heartbeat_unix_ms.reserve(members_->nodes.size());
  for (const auto& [id, e] : nodes_) {  // slot order
    v.alive.push_back(AliveLocked(e, now));
    v.last_heartbeat_unix_ms.push_back(e.node.last_heartbeat_unix_ms());
  }
  return v;
}

std::vector<rpc::Node> NodeRegistry::List() {
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  std::vector<rpc::Node> out;
  out.reserve(nodes_.size());
  for (const auto& [id, e] : nodes_) {
    out.push_back(e.node);
    out.back().set_state(AliveLocked(e, now) ? rpc::Node::ALIVE : rpc::Node::DEAD);
  }
  return out;
}

bool NodeRegistry::Known(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  return nodes_.count(node_id) > 0;
}

void NodeRegistry::SweepLeases() {
  static metrics::Counter* const expiries = metrics::Global().GetCounter(
      "ember_meta_lease_expiries_total", "Nodes declared dead because their lease ran out.");
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : nodes_) {
    const bool alive = AliveLocked(e, now);
    auto [it, fresh] = was_alive_.emplace(id, alive);
    if (!fresh && it->second && !alive) {
      expiries->Inc();
      spdlog::warn("meta: node {} missed its lease; its blocks are hidden until it returns", id);
    }
    it->second = alive;
  }
}

}  // namespace ember::meta
