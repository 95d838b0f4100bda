// PrefetchJobs: cluster prefetches (`ember prefetch`): a job names a dataset version, paths,
// nodes and a mode; meta stores it and hands it to its nodes with every heartbeat answer; the
// nodes do the work and report progress; a job ends when every node has finished or died.
//
// A job is written to the store before it exists in memory, and every change of its state or
// pin is written before memory changes. Progress reports are memory only (nodes send them twice
// a second, and a restarted meta gets them again).
//
// Thread-safe; one mutex, never held across a call into another unit (the catalog and the
// node registry are asked before it is taken).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "meta/catalog.h"
#include "meta/meta.pb.h"
#include "meta/node_registry.h"
#include "meta/store.h"

namespace ember::meta {

class PrefetchJobs {
 public:
  // REQUIRES: store, catalog and nodes outlive this.
  PrefetchJobs(MetaStore* store, DatasetCatalog* catalog, NodeRegistry* nodes);

  // Loads the stored jobs. Returns: Ok; the store's errors.
  absl::Status Load();

  // Validates and stores a new job. Returns: the job; NotFound (dataset, version, path, node);
  // FailedPrecondition (a named node is dead, no live node, a pin that does not fit);
  // InvalidArgument (replicas, paths); the store's errors. A `request_id` (the client's, for one
  // call however often it is retried) that started a job before gets that job back.
  absl::StatusOr<rpc::PrefetchJob> Start(const rpc::PrefetchSpec& spec,
                                         const std::string& request_id = "");
  // Returns: the job, settled (nodes that died marked, finished when all are); NotFound.
  absl::StatusOr<rpc::PrefetchJob> Get(const std::string& id);
  std::vector<rpc::PrefetchJob> List();
  // Stops a running job and releases its pin. Returns: the job; NotFound; the store's errors.
  absl::StatusOr<rpc::PrefetchJob> Cancel(const std::string& id);
  // Releases the pins of a dataset's jobs (or of one job). Returns: how many jobs had a pin;
  // NotFound; InvalidArgument (neither named); the store's errors.
  absl::StatusOr<uint32_t> Unpin(const std::string& dataset, const std::string& prefetch_id);
  // A node's progress on a job. Returns: Ok; NotFound.
  absl::Status Report(const std::string& job_id, const rpc::PrefetchNodeProgress& progress);
  // Running jobs a node takes part in, and recent ones so it can release their pins.
  std::vector<rpc::PrefetchJob> ForNode(const std::string& node_id);
  // Waits until the jobs changed since `known_epoch` (started, cancelled, unpinned), or until
  // `deadline`. Returns: the epoch now.
  uint64_t WaitForChange(uint64_t known_epoch, absl::Time deadline);
  // The state of a job, if it exists.
  std::optional<rpc::PrefetchJob::State> State(const std::string& id);

 private:
  // REQUIRES: mu_. Marks nodes that died mid-job and ends the job when every node is finished or
  // dead; the end is stored before memory shows it (if the store refuses, the job stays
  // RUNNING and the next look tries again).
  void SettleLocked(rpc::PrefetchJob* job, const NodeView& view) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MetaStore* const store_;
  DatasetCatalog* const catalog_;
  NodeRegistry* const nodes_;
  absl::Mutex mu_;
  std::map<std::string, rpc::PrefetchJob> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;  // bumped by every change a node acts on
};

}  // namespace ember::meta
