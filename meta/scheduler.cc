#include "meta/scheduler.h"

#include <algorithm>
#include <set>

namespace ember::meta {

bool PlacementScore::BetterThan(const PlacementScore& o) const {
  if (locality > o.locality + 1e-9) return true;
  if (locality < o.locality - 1e-9) return false;
  if (switches != o.switches) return switches < o.switches;
  if (racks != o.racks) return racks < o.racks;
  return leftover_gpus < o.leftover_gpus;
}

namespace {

struct Cand {
  const SchedNode* node;
  double locality;
  uint32_t free;
};

// Order: locality first, then best fit (fewest free GPUs that still fit), then id.
bool Before(const Cand& a, const Cand& b) {
  if (a.locality != b.locality) return a.locality > b.locality;
  if (a.free != b.free) return a.free < b.free;
  return a.node->id < b.node->id;
}

// Fills `req.workers` workers from `cands` (one domain), best nodes first. Each node takes at
// least one worker, so only the best `workers` nodes can be used: a partial sort suffices.
std::optional<Placement> Fill(const GangRequest& req, std::vector<Cand>& cands,
                              const std::string& domain, bool first_fit) {
  size_t k = std::min<size_t>(cands.size(), req.workers);
  if (!first_fit) std::partial_sort(cands.begin(), cands.begin() + k, cands.end(), Before);
  Placement p;
  p.domain = domain;
  double loc = 0;
  std::set<std::string> switches, racks;
  std::map<const SchedNode*, uint32_t> taken;
  for (const Cand& c : cands) {
    uint32_t free = c.free;
    while (free >= req.gpus_per_worker && p.nodes.size() < req.workers) {
      p.nodes.push_back(c.node->id);
      loc += c.locality;
      free -= req.gpus_per_worker;
      taken[c.node] += req.gpus_per_worker;
    }
    if (p.nodes.size() == req.workers) break;
  }
  if (p.nodes.size() < req.workers) return std::nullopt;
  for (const auto& [n, g] : taken) {
    switches.insert(n->sw);
    racks.insert(n->rack);
    p.score.leftover_gpus += n->gpus - n->used - g;
  }
  p.score.locality = loc / req.workers;
  p.score.switches = static_cast<int>(switches.size());
  p.score.racks = static_cast<int>(racks.size());
  return p;
}

}  // namespace

std::vector<Placement> PlaceGang(const GangRequest& req, const std::vector<SchedNode>& nodes,
                                 const LocalityFn& locality, int runners_up, bool first_fit) {
  if (req.gpus_per_worker == 0) return {};
  std::vector<Cand> all;
  all.reserve(nodes.size());
  uint64_t capacity = 0;
  for (const auto& n : nodes) {
    if (!n.alive || n.used >= n.gpus) continue;
    uint32_t free = n.gpus - n.used;
    if (free < req.gpus_per_worker) continue;
    all.push_back({&n, first_fit ? 0.0 : locality(n), free});
    capacity += free / req.gpus_per_worker;
  }
  if (req.workers == 0 || capacity < req.workers) return {};
  if (first_fit) {
    auto p = Fill(req, all, "cluster", true);
    if (!p) return {};
    return {*p};
  }
  // Domains by interned id (interned here when the caller did not).
  std::map<std::string, int> sw_ids, rack_ids;
  auto sw_of = [&](const SchedNode& n) {
    return n.sw_id >= 0 ? n.sw_id : sw_ids.emplace(n.sw, sw_ids.size()).first->second;
  };
  auto rack_of = [&](const SchedNode& n) {
    return n.rack_id >= 0 ? n.rack_id : rack_ids.emplace(n.rack, rack_ids.size()).first->second;
  };
  std::vector<Placement> found;
  auto domains = [&](auto key, const char* what) {
    std::vector<std::vector<Cand>> groups;
    for (const Cand& c : all) {
      size_t g = static_cast<size_t>(key(*c.node));
      if (groups.size() <= g) groups.resize(g + 1);
      groups[g].push_back(c);
    }
    for (auto& cands : groups) {
      if (cands.empty()) continue;
      std::string name = std::string(what) + " " +
                         (std::string(what) == "switch" ? cands[0].node->sw : cands[0].node->rack);
      if (auto p = Fill(req, cands, name, false)) found.push_back(std::move(*p));
    }
  };
  domains(sw_of, "switch");
  if (req.topology != Topology::kSameSwitch) domains(rack_of, "rack");
  if (req.topology == Topology::kNone) {
    if (auto p = Fill(req, all, "cluster", false)) found.push_back(std::move(*p));
  }
  std::sort(found.begin(), found.end(),
            [](const Placement& a, const Placement& b) { return a.score.BetterThan(b.score); });
  // Drop duplicates (the same node list reached through several domains).
  std::vector<Placement> out;
  std::set<std::vector<std::string>> seen;
  for (auto& p : found) {
    std::vector<std::string> key = p.nodes;
    std::sort(key.begin(), key.end());
    if (!seen.insert(key).second) continue;
    out.push_back(std::move(p));
    if (static_cast<int>(out.size()) > runners_up) break;
  }
  return out;
}

std::optional<std::string> PlaceOne(uint32_t gpus, const std::vector<SchedNode>& nodes,
                                    const LocalityFn& locality, const SchedNode* keep_near) {
  const SchedNode* best = nullptr;
  std::tuple<int, double, int> best_key{-1, 0, 0};
  for (const auto& n : nodes) {
    if (!n.alive || n.gpus < n.used + gpus) continue;
    int near = keep_near == nullptr                             ? 0
               : (!n.sw.empty() && n.sw == keep_near->sw)       ? 2
               : (!n.rack.empty() && n.rack == keep_near->rack) ? 1
                                                                : 0;
    std::tuple<int, double, int> key{near, locality(n), -static_cast<int>(n.gpus - n.used)};
    if (best == nullptr || key > best_key) {
      best = &n;
      best_key = key;
    }
  }
  if (best == nullptr) return std::nullopt;
  return best->id;
}

void JobQueue::Remove(const std::string& job_id) {
  queue_.erase(std::remove(queue_.begin(), queue_.end(), job_id), queue_.end());
}

std::vector<std::string> JobQueue::Schedule(
    const std::function<bool(const std::string&)>& try_place) {
  std::vector<std::string> placed;
  size_t i = 0;
  while (i < queue_.size()) {
    const std::string id = queue_[i];
    bool is_head = i == 0;
    if (!is_head && backfilled_past_head_ >= max_backfill_) break;  // the head's turn
    if (try_place(id)) {
      placed.push_back(id);
      queue_.erase(queue_.begin() + static_cast<long>(i));
      if (is_head) {
        backfilled_past_head_ = 0;
        blocked_head_.clear();
      } else {
        backfilled_past_head_++;
      }
      continue;
    }
    if (is_head && blocked_head_ != id) {
      blocked_head_ = id;
      backfilled_past_head_ = 0;
    }
    i++;
  }
  return placed;
}

}  // namespace ember::meta
