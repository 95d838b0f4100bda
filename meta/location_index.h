// LocationIndex: which node holds which block, as per-(file, node) bitmaps.
//
// Memory (sized for 10M-file datasets, docs/architecture.md "memory"): one ordered B-tree entry
// per file held anywhere (16-byte key, holders inline: 16 bytes per holder, the first two in the
// entry itself); a file's bitmap of up to 64 blocks is a word in its holder, longer ones live in a
// side map; node ids are interned. Per node, how many files of each dataset version it holds.
//
// Soft state: nodes send a full report when they register and small increments afterwards; the
// bitmaps are persisted (unsynced) only so that a restarted meta answers at once, and losing
// them loses nothing (nodes report again). A report's bitmaps are written to the store before
// memory changes, so memory never claims what the store refused.
//
// One function computes what a node holds of a dataset version (Resident), for the locality
// API, the status page, the scheduler and the Kubernetes extender alike.
//
// Thread-safe; one mutex, never held across a call into another unit (callers pass in what
// they need of others: a NodeView, a version's file sizes).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/ids.h"
#include "meta/meta.pb.h"
#include "meta/node_registry.h"
#include "meta/store.h"

namespace ember::meta {

class LocationIndex {
 public:
  using FileKey = MetaStore::FileKey;

  // REQUIRES: the store outlives the index.
  explicit LocationIndex(MetaStore* store) : store_(store) {}

  // Loads the persisted bitmaps. Returns: Ok; the store's errors.
  absl::Status Load();

  // A node's report, its addresses already checked against the catalog: with full_start, the
  // node's earlier bitmaps are forgotten first; `files` replace whole bitmaps; `added` and
  // `removed` flip single bits. Returns: Ok; the store's errors (nothing changed then).
  struct FileBitmap {
    FileKey key;
    std::string bitmap;  // bit i = block i
  };
  absl::Status Apply(const std::string& node, bool full_start, const std::vector<FileBitmap>& files,
                     const std::vector<BlockAddr>& added, const std::vector<BlockAddr>& removed);

  // Per block: the live nodes holding it (the asker included), with address and labels; for a
  // block nobody holds, whether no live node other than `self` holds any block of its dataset
  // version (`dataset_unheld`: the asker then need not ask again for a while). `node_table`:
  // holders as Holders.node_refs into resp->nodes, each node named once.
  void Locate(const std::vector<BlockAddr>& blocks, const std::string& self, const NodeView& view,
              rpc::LocateResponse* resp, bool node_table = false);

  // What each node holds of a dataset version, in exact bytes (last blocks included).
  struct NodeResidency {
    uint64_t bytes = 0;
    uint64_t blocks = 0;
  };
  struct Residency {
    uint64_t total_bytes = 0;
    uint64_t total_blocks = 0;
    std::map<std::string, NodeResidency> by_node;  // nodes holding something, live or dead
    std::vector<uint64_t> replicas_histogram;      // [k] = blocks held by k live nodes
    uint64_t anywhere_bytes = 0;                   // on at least one live node
    uint64_t anywhere_blocks = 0;
    uint64_t generation = 0;  // of the index when computed
  };
  Residency Resident(uint32_t dataset_id, uint32_t version, const std::vector<uint64_t>& file_sizes,
                     uint64_t block_size, const NodeView& view);

  // Forgets a dataset's locations (version 0: all versions) in memory; the catalog removes the
  // stored ones with the dataset.
  void Drop(uint32_t dataset_id, uint32_t version);
  // Changes whenever any bitmap changes: cached results computed from the index use it.
  uint64_t generation();

 private:
  // One node's blocks of one file.
  struct Held {
    uint32_t node = 0;  // index in node_names_
    uint32_t big = 0;   // 1: the bitmap is in big_ (more than 64 blocks)
    uint64_t bits = 0;  // bit i = block i, unless big
  };
  using Holders = absl::InlinedVector<Held, 2>;
  using DsVersion = std::pair<uint32_t, uint32_t>;

  uint32_t NodeIdLocked(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The holder's bitmap as bytes (trimmed).
  std::string BitmapLocked(const FileKey& k, const Held& h) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool TestLocked(const FileKey& k, const Held& h, uint64_t i) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Sets (an empty bitmap: removes) the node's bitmap of file k.
  void SetLocked(const FileKey& k, uint32_t node, std::string bitmap)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_. The node's bitmap of `k` in `next`, started from memory unless full_start.
  std::string& NextBitmapLocked(uint32_t node, const FileKey& k, bool full_start,
                                std::map<FileKey, std::string>* next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HeldByOthersLocked(uint32_t ds, uint32_t version, const std::string& self,
                          const NodeView& view) ABSL_SHARED_LOCKS_REQUIRED(mu_);

  MetaStore* const store_;
  absl::Mutex mu_;
  absl::btree_map<FileKey, Holders> locations_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<FileKey, uint32_t>, std::string> big_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> node_names_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> node_ids_ ABSL_GUARDED_BY(mu_);
  // node -> (dataset, version) -> files of it the node holds something of.
  std::map<uint32_t, std::map<DsVersion, uint64_t>> node_versions_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace ember::meta
