// JobService: training jobs placed where their data is (`ember job`): the queue, GPU
// accounting, the scheduler pass, and recovery of workers whose node died. The placement logic
// itself is pure and lives in scheduler.h; this unit feeds it a snapshot of the nodes and each
// node's resident fraction of the job's dataset.
//
// Every change of a job (submitted, placed, moved, ended, warmed) is written to the store
// before memory shows it; a change the store refuses is not made (a placement is then retried
// by the next pass).
//
// Resident fractions come from the location index (LocationIndex::Resident) and are cached per
// dataset version until the index or the node membership changes, so a pass over a queue costs
// microseconds (docs/benchmarks.md).
//
// Thread-safe; one mutex. Other units (registry, catalog, location index, prefetch jobs) are only
// called with it released: a pass first takes a NodeView and the fractions it needs, then locks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "meta/catalog.h"
#include "meta/location_index.h"
#include "meta/meta.pb.h"
#include "meta/node_registry.h"
#include "meta/prefetch_jobs.h"
#include "meta/scheduler.h"
#include "meta/store.h"

namespace ember::meta {

class JobService {
 public:
  // REQUIRES: every unit passed in outlives this.
  JobService(MetaStore* store, DatasetCatalog* catalog, NodeRegistry* nodes,
             LocationIndex* locations, PrefetchJobs* prefetches);

  // Loads stored jobs (queued ones are queued again, running ones hold their GPUs).
  // Returns: Ok; the store's errors.
  absl::Status Load();

  // Queues a job and places it at once if it fits. Returns: the job; InvalidArgument (spec);
  // NotFound (dataset); FailedPrecondition (the gang could never fit the live cluster); the
  // store's errors. A `request_id` (the client's, for one call however often it is retried) that
  // submitted a job before gets that job back.
  absl::StatusOr<rpc::Job> Submit(const rpc::JobSpec& spec, const std::string& request_id = "");
  // By id, or by name (the newest job of that name). Returns: the job; NotFound.
  absl::StatusOr<rpc::Job> Get(const std::string& ref);
  rpc::ListJobsResponse List();
  // Completes or cancels a job, freeing its GPUs. Returns: the job; NotFound;
  // FailedPrecondition (already ended, unless by this `request_id`: a retried call); the store's
  // errors.
  absl::StatusOr<rpc::Job> End(const std::string& ref, rpc::Job::State state,
                               const std::string& request_id = "");

  // One scheduler pass: with `full`, recover workers of dead nodes and start warmed jobs; always
  // place queued jobs that fit. Called by meta's loop every 200 ms and after submit/end.
  void Pass(bool full);

  // Resident fraction per node of a dataset's latest version (the Kubernetes extender);
  // nullopt for an unknown dataset.
  std::optional<std::map<std::string, double>> Fractions(const std::string& dataset);
  size_t QueueLength();
  std::map<std::string, uint64_t> CountByState();

 private:
  struct Fraction {
    uint64_t generation = 0;       // of the location index
    uint64_t members_version = 0;  // of the node membership
    std::vector<double> by_slot;   // by membership slot
  };
  using FractionMap = std::map<std::pair<uint32_t, uint32_t>, const std::vector<double>*>;

  // Fractions of one dataset version, cached; computed with mu_ released.
  std::vector<double> FractionsOf(uint32_t dataset_id, uint32_t version, const NodeView& view)
      ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: mu_. The nodes as PlaceGang sees them: rebuilt when the membership changes, liveness
  // from the view, GPUs in use from gpus_used_.
  std::vector<SchedNode>& SnapshotLocked(const NodeView& view) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddUsedLocked(const std::string& node, int64_t gpus) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  rpc::Job* FindLocked(const std::string& ref) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_. Places a queued job if its gang fits; the placement is stored before it is
  // applied. Returns true if placed.
  bool TryPlaceLocked(rpc::Job* j, const FractionMap& fractions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_. Writes `next` and makes it the job's state. Returns the store's status.
  absl::Status CommitLocked(rpc::Job* j, rpc::Job next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MetaStore* const store_;
  DatasetCatalog* const catalog_;
  NodeRegistry* const nodes_;
  LocationIndex* const locations_;
  PrefetchJobs* const prefetches_;

  absl::Mutex mu_;
  std::map<std::string, rpc::Job> jobs_ ABSL_GUARDED_BY(mu_);
  JobQueue queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, uint32_t> gpus_used_ ABSL_GUARDED_BY(mu_);
  std::vector<SchedNode> sched_ ABSL_GUARDED_BY(mu_);
  uint64_t sched_version_ ABSL_GUARDED_BY(mu_) = 0;  // membership version sched_ was built from
  std::map<std::string, uint32_t> dataset_ids_ ABSL_GUARDED_BY(mu_);  // of jobs' datasets
  std::map<std::pair<uint32_t, uint32_t>, Fraction> fractions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::meta
