// Scheduler: places training jobs' workers on nodes where their dataset is warm.
//
// Pure logic over a snapshot of nodes and per-node locality, so it is testable without a cluster
// and the same code runs in meta and in the benchmark. Not thread-safe: meta calls it under its
// own lock.
//
// A job is a gang of P workers of G GPUs each: all are placed or none, and GPUs are never
// oversubscribed. Candidate placements are built per topology domain (each switch, each rack,
// and the whole cluster when the job allows) by filling nodes in order of locality, then best
// GPU fit; candidates are compared by, in order: resident fraction of the job's dataset on the
// chosen nodes (primary), fewest switches, fewest racks, least GPU fragmentation.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ember::meta {

struct SchedNode {
  std::string id;
  std::string sw;    // `switch` label
  std::string rack;  // `rack` label
  uint32_t gpus = 0;
  uint32_t used = 0;  // GPUs taken by placed workers
  bool alive = true;
  size_t slot = 0;  // the caller's index for this node (LocalityFn may use it)
  int sw_id = -1;   // interned switch / rack; -1: PlaceGang interns the labels itself
  int rack_id = -1;
};

enum class Topology { kNone, kSameSwitch, kSameRack };

struct GangRequest {
  uint32_t workers = 1;
  uint32_t gpus_per_worker = 1;
  Topology topology = Topology::kNone;
};

struct PlacementScore {
  double locality = 0;  // mean resident fraction over the workers' nodes
  int switches = 0;
  int racks = 0;
  uint32_t leftover_gpus = 0;  // free GPUs left on the chosen nodes (less = better fit)
  bool BetterThan(const PlacementScore& o) const;
};

struct Placement {
  std::vector<std::string> nodes;  // one per worker (a node may take several workers)
  PlacementScore score;
  std::string domain;  // "switch s1", "rack r1" or "cluster"
};

// Locality of the job's dataset on a node, 0..1.
using LocalityFn = std::function<double(const SchedNode& node)>;

// The best placement and up to `runners_up` others, or nothing if the gang cannot fit now.
// With `first_fit`, locality is ignored (the baseline a locality-blind scheduler gives).
std::vector<Placement> PlaceGang(const GangRequest& req, const std::vector<SchedNode>& nodes,
                                 const LocalityFn& locality, int runners_up = 2,
                                 bool first_fit = false);

// Places one worker (recovery after a node died): the live node with the best locality that has
// room, preferring the domain of `keep_near` (switch, then rack). nullopt if none has room.
std::optional<std::string> PlaceOne(uint32_t gpus, const std::vector<SchedNode>& nodes,
                                    const LocalityFn& locality, const SchedNode* keep_near);

// FIFO with backfill. The head waits until it fits; while it waits, later jobs that fit now may
// start, but only `max_backfill` times in a row: after that nothing overtakes the head until it
// starts, so it cannot starve (running jobs finish and free their GPUs).
class JobQueue {
 public:
  explicit JobQueue(int max_backfill = 8) : max_backfill_(max_backfill) {}
  void Push(const std::string& job_id) { queue_.push_back(job_id); }
  void Remove(const std::string& job_id);
  const std::vector<std::string>& jobs() const { return queue_; }
  // One pass: calls try_place(id) in order until a job cannot be placed and backfill is closed.
  // try_place returns true if it placed the job. Returns the ids placed, in order.
  std::vector<std::string> Schedule(const std::function<bool(const std::string&)>& try_place);

 private:
  std::vector<std::string> queue_;
  int max_backfill_;
  int backfilled_past_head_ = 0;
  std::string blocked_head_;
};

}  // namespace ember::meta
