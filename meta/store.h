// MetaStore: meta's durable state in RocksDB, one column family per kind of record.
//
//   datasets   name                                  -> rpc::Dataset
//   manifests  dataset_id|version|file_id (BE)       -> rpc::FileEntry
//   checksums  dataset_id|version|file_id|index (BE) -> XXH3-64 (8 bytes LE)
//   nodes      node id                               -> rpc::Node
//   locations  dataset_id|version|file_id|node id    -> block bitmap (soft state)
//   volumes    writable volumes' namespaces: keys and values are meta/volumes.cc's
//   default    "next_dataset_id"                     -> counter
//
// This is the only file that sees RocksDB types; errors are converted to absl::Status here.
// Thread-safe (RocksDB is); read-modify-write sequences are the caller's to serialize.
//
// Every write goes through one funnel (Commit): a RocksDB WriteBatch. With a Shipper set (meta
// replicas, replication.h), the funnel numbers each batch (term, seq), stamps that position into
// the batch itself (key "repl/pos"), and hands it to the shipper before writing it here: a write
// is on the in-sync standbys before the leader acknowledges it. A standby applies the leader's
// batches with ApplyReplicated, which checks they follow on from what it has.
//
// Every write first checks the data dir's free space and is refused (ResourceExhausted) below a
// reserve: RocksDB as packaged here aborts the process when a write fails for lack of space
// after an earlier sync, so meta must not let it get there. Callers then fail the RPC with that
// error and change nothing in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/ids.h"
#include "meta/meta.pb.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
class WriteBatch;
}  // namespace rocksdb

namespace ember::meta {

class MetaStore {
 public:
  // Opens or creates the store under `dir`, and drops manifests left behind by a scan that was
  // interrupted (a crash between the first manifest page and the dataset record).
  // Returns: Ok, or Internal / IOError text from RocksDB naming the directory.
  struct Options {
    uint64_t reserve_bytes = 64ull << 20;  // free space the data dir must keep for writes
    // Drop manifests of scans that never finished. Not on meta replicas: a standby's store may
    // be in the middle of a scan the leader is still shipping, and a leader's deletions at open
    // would not reach its standbys (such orphans cost only space there).
    bool drop_orphans = true;
  };
  static absl::StatusOr<std::unique_ptr<MetaStore>> Open(const std::string& dir,
                                                         const Options& options);
  static absl::StatusOr<std::unique_ptr<MetaStore>> Open(const std::string& dir) {
    return Open(dir, Options());
  }
  ~MetaStore();

  // Every write below returns: Ok; ResourceExhausted (the reserve, above); Unavailable or
  // Internal naming what RocksDB said.

  // ---- datasets ----
  // Returns: the dataset, NotFound.
  absl::StatusOr<rpc::Dataset> GetDataset(const std::string& name);
  absl::StatusOr<std::vector<rpc::Dataset>> ListDatasets();
  absl::Status PutDataset(const rpc::Dataset& ds);  // synced
  absl::StatusOr<uint32_t> AllocateDatasetId();     // synced; ids are never reused
  // Deletes the record and every manifest, checksum and location of the dataset.
  absl::Status DeleteDataset(const rpc::Dataset& ds);
  // Deletes one version's manifest, checksums and locations (not the dataset record).
  absl::Status DeleteVersionData(uint32_t dataset_id, uint32_t version);

  // ---- manifests ----
  // Buffers entries and writes them in batches. Call Finish() to write the last batch.
  class ManifestWriter {
   public:
    ManifestWriter(MetaStore* store, uint32_t dataset_id, uint32_t version);
    ~ManifestWriter();
    absl::Status Add(const rpc::FileEntry& entry);
    absl::Status Finish();

   private:
    MetaStore* store_;
    uint32_t dataset_id_, version_;
    std::unique_ptr<rocksdb::WriteBatch> batch_;
    size_t pending_ = 0;
  };
  // Entries with file_id > after_file_id, in id order, at most max_entries of them.
  absl::StatusOr<std::vector<rpc::FileEntry>> ReadManifest(uint32_t dataset_id, uint32_t version,
                                                           uint64_t after_file_id,
                                                           size_t max_entries);
  // Calls fn for every entry of a version, in id order; stops early if fn returns false.
  absl::Status ForEachEntry(uint32_t dataset_id, uint32_t version,
                            const std::function<bool(const rpc::FileEntry&)>& fn);

  // ---- checksums ----
  // The last ~500,000 recorded or read are also kept in memory (a prefetch's other nodes ask for
  // the checksums the first one just recorded): ~20 MB at most.
  absl::StatusOr<std::optional<uint64_t>> GetChecksum(const BlockAddr& addr)
      ABSL_LOCKS_EXCLUDED(recent_mu_);
  absl::Status PutChecksums(const std::vector<std::pair<BlockAddr, uint64_t>>& items)
      ABSL_LOCKS_EXCLUDED(recent_mu_);

  // ---- nodes ----
  absl::Status PutNode(const rpc::Node& node);  // synced
  absl::StatusOr<std::vector<rpc::Node>> ListNodes();

  // ---- prefetch jobs (default column family, key "prefetch/<id>") ----
  absl::Status PutPrefetch(const rpc::PrefetchJob& job);
  absl::StatusOr<std::vector<rpc::PrefetchJob>> ListPrefetches();

  // ---- scheduler jobs (default column family, key "job/<id>") ----
  absl::Status PutJob(const rpc::Job& job);
  absl::StatusOr<std::vector<rpc::Job>> ListJobs();

  // ---- locations ----
  struct FileKey {
    uint32_t dataset_id = 0;
    uint32_t version = 0;
    uint64_t file_id = 0;
    friend auto operator<=>(const FileKey&, const FileKey&) = default;
  };
  // An empty bitmap deletes the record. One batch, unsynced (soft state).
  struct LocationWrite {
    FileKey key;
    std::string node_id;
    std::string bitmap;
  };
  absl::Status PutLocations(const std::vector<LocationWrite>& writes);
  absl::Status ForEachLocation(const std::function<void(const FileKey&, const std::string& node_id,
                                                        const std::string& bitmap)>& fn);

  // ---- volumes (meta/volumes.h owns the keys and values) ----
  // One change of a volume's namespace: written in one synced batch, with the checksums of
  // contents it commits (checksums column family), so a commit is whole or absent.
  struct VolumeChange {
    std::vector<std::pair<std::string, std::string>> put;
    std::vector<std::string> erase;
    std::vector<std::pair<BlockAddr, uint64_t>> checksums;
  };
  absl::Status ApplyVolumeChange(const VolumeChange& change) ABSL_LOCKS_EXCLUDED(recent_mu_);
  // Returns: the value; nullopt when absent; the store's errors.
  absl::StatusOr<std::optional<std::string>> GetVolumeKey(const std::string& key);
  // Calls fn(key, value) for keys starting with `prefix` from `from` on (>= from), in key order,
  // until fn returns false.
  absl::Status ScanVolumeKeys(
      const std::string& prefix, const std::string& from,
      const std::function<bool(const std::string& key, const std::string& value)>& fn);
  // Deletes every key starting with `prefix` and the checksums of `dataset_id` (one batch).
  absl::Status DeleteVolumeKeys(const std::string& prefix, uint32_t dataset_id);

  // ---- replication (meta replicas: replication.h) ----
  // Where a store is in the leader's stream of batches: the (term, seq) of the last batch it
  // applied. {0, 0} for a store that never took part in replication.
  struct Position {
    uint64_t term = 0;
    uint64_t seq = 0;
    friend bool operator==(const Position&, const Position&) = default;
  };
  Position position() ABSL_LOCKS_EXCLUDED(commit_mu_);
  // What a leader's store does with each batch before writing it: ship it to the standbys.
  // Ship returns only when every in-sync standby has it (or has been dropped from the set);
  // an error fails the write (nothing is written here then).
  class Shipper {
   public:
    virtual ~Shipper() = default;
    virtual absl::Status Ship(const Position& prev, const Position& at, const std::string& batch,
                              bool sync) = 0;
    // This store failed a write its standbys hold: it must not lead any more.
    virtual void Broken(const std::string& why) = 0;
  };
  // From now on every write is batch `seq + 1, + 2, ...` of `term`. Returns: Ok;
  // FailedPrecondition when `term` is not after the position's term.
  // REQUIRES: the shipper outlives the store's writes, or is unset (nullptr) first.
  absl::Status Lead(uint64_t term, Shipper* shipper) ABSL_LOCKS_EXCLUDED(commit_mu_);
  // Whether the store holds nothing at all (a new replica's).
  bool Empty();
  // A standby's side: applies the leader's batch `at` if it follows on from this store's
  // position (`prev` == position()). Returns: Ok; FailedPrecondition when it does not follow
  // on (the leader then catches this standby up, or it needs a fresh copy); the write's errors.
  absl::Status ApplyReplicated(const Position& prev, const Position& at, const std::string& batch,
                               bool sync) ABSL_LOCKS_EXCLUDED(commit_mu_);
  // A consistent copy of the whole store in `dir` (which must not exist; hard links where it
  // can), for a standby that cannot catch up from recent batches. The copy's position is in it.
  absl::Status Checkpoint(const std::string& dir);

 private:
  MetaStore() = default;
  absl::Status DropOrphanManifests();
  // Returns: Ok; ResourceExhausted when the data dir has less free space than the reserve.
  absl::Status CheckSpace();
  // The one way anything is written (above). Returns: Ok; the shipper's or RocksDB's errors.
  absl::Status Commit(rocksdb::WriteBatch* batch, bool sync, const std::string& what)
      ABSL_LOCKS_EXCLUDED(commit_mu_);
  absl::Status ReadPosition();
  absl::Status DeletePrefixRange(rocksdb::ColumnFamilyHandle* cf, const std::string& begin,
                                 const std::string& end);

  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::ColumnFamilyHandle* datasets_ = nullptr;
  rocksdb::ColumnFamilyHandle* manifests_ = nullptr;
  rocksdb::ColumnFamilyHandle* checksums_ = nullptr;
  rocksdb::ColumnFamilyHandle* nodes_ = nullptr;
  rocksdb::ColumnFamilyHandle* locations_ = nullptr;
  rocksdb::ColumnFamilyHandle* volumes_ = nullptr;
  std::string dir_;
  Options options_;

  // Serializes commits when replicating (one numbered stream); position_ is what was applied.
  absl::Mutex commit_mu_;
  Position position_ ABSL_GUARDED_BY(commit_mu_);
  uint64_t term_ ABSL_GUARDED_BY(commit_mu_) = 0;  // the term this store leads in
  Shipper* shipper_ ABSL_GUARDED_BY(commit_mu_) = nullptr;
  std::string ship_failed_ ABSL_GUARDED_BY(commit_mu_);  // set: commits refused (Commit)

  // Checksums lately read or written, in two generations: the newer one fills up to
  // kRecentChecksums / 2, then becomes the older one (the one before it is dropped). Cleared
  // when a dataset or version is deleted (its ids may return).
  static constexpr size_t kRecentChecksums = 1u << 19;
  using ChecksumMap = absl::flat_hash_map<BlockAddr, uint64_t>;  // common/ids.h hashes it
  void RememberChecksumLocked(const BlockAddr& addr, uint64_t sum)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(recent_mu_);
  void ForgetChecksums() ABSL_LOCKS_EXCLUDED(recent_mu_);
  absl::Mutex recent_mu_;
  ChecksumMap recent_new_ ABSL_GUARDED_BY(recent_mu_);
  ChecksumMap recent_old_ ABSL_GUARDED_BY(recent_mu_);
  uint64_t recent_forgotten_ ABSL_GUARDED_BY(recent_mu_) = 0;  // ForgetChecksums calls
};

}  // namespace ember::meta
