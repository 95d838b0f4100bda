#include "meta/store.h"

#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/memtablerep.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "meta/store_keys.h"

namespace ember::meta {
namespace {

constexpr size_t kManifestBatch = 4096;

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsIOError()) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

// Where the store is in the leader's stream (default column family).
constexpr char kPositionKey[] = "repl/pos";

std::string EncodePosition(const MetaStore::Position& p) {
  std::string v;
  PutBe64(&v, p.term);
  PutBe64(&v, p.seq);
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetaStore>> MetaStore::Open(const std::string& dir,
                                                           const Options& store_options) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.IncreaseParallelism(2);
  // Small memtables: meta's working set is manifests written once, read in pages.
  options.write_buffer_size = 16 << 20;
  options.max_write_buffer_number = 2;
  rocksdb::ColumnFamilyOptions cf_options(options);
  // Checksums are asked for every block located, mostly unclaimed ones (a swarm prefetch polls
  // for others' blocks): bloom filters answer those misses without a skiplist or block search.
  rocksdb::ColumnFamilyOptions checksum_options(options);
  checksum_options.memtable_prefix_bloom_size_ratio = 0.05;
  checksum_options.memtable_whole_key_filtering = true;
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  checksum_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Locations: a row per file a node stores, read back only by the scan at start: an unsorted
  // memtable (sorted at flush; one writer at a time), not a skiplist insert per row (a quarter
  // of meta's CPU in a tiny-file prefetch to 3 nodes, 600,000 rows).
  options.allow_concurrent_memtable_write = false;
  rocksdb::ColumnFamilyOptions location_options(options);
  location_options.memtable_factory.reset(new rocksdb::VectorRepFactory());
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  for (const char* name : {rocksdb::kDefaultColumnFamilyName.c_str(), "datasets", "manifests",
                           "checksums", "nodes", "locations", "volumes"}) {
    cfs.emplace_back(name, std::string(name) == "checksums"   ? checksum_options
                           : std::string(name) == "locations" ? location_options
                                                              : cf_options);
  }
  std::unique_ptr<MetaStore> store(new MetaStore());
  store->dir_ = dir;
  store->options_ = store_options;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, cfs, &store->handles_, &db);
  if (!s.ok()) return FromRocks(s, absl::StrCat("cannot open meta store at '", dir, "'"));
  store->db_.reset(db);
  store->datasets_ = store->handles_[1];
  store->manifests_ = store->handles_[2];
  store->checksums_ = store->handles_[3];
  store->nodes_ = store->handles_[4];
  store->locations_ = store->handles_[5];
  store->volumes_ = store->handles_[6];
  RETURN_IF_ERROR(store->ReadPosition());
  if (!store_options.drop_orphans) return store;
  if (absl::Status st = store->DropOrphanManifests(); !st.ok()) {
    if (!absl::IsResourceExhausted(st)) return st;
    // Orphans cost only space; they go at a start with room to spare.
  }
  return store;
}

absl::Status MetaStore::CheckSpace() {
  struct statvfs vfs;
  if (statvfs(dir_.c_str(), &vfs) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot check free space of '", dir_, "': ", strerror(errno)));
  }
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (free_bytes < options_.reserve_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("meta's data dir '", dir_, "' has ", free_bytes >> 20, " MiB free, below the ",
                     options_.reserve_bytes >> 20,
                     " MiB kept in reserve: writes are refused until space is "
                     "freed"));
  }
  return absl::OkStatus();
}

absl::Status MetaStore::ReadPosition() {
  std::string v;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kPositionKey, &v);
  if (s.IsNotFound()) return absl::OkStatus();
  RETURN_IF_ERROR(FromRocks(s, "read replication position"));
  if (v.size() != 16) return absl::DataLossError("replication position record is corrupt");
  absl::MutexLock lock(&commit_mu_);
  position_ = {GetBe(v, 0, 8), GetBe(v, 8, 8)};
  return absl::OkStatus();
}

MetaStore::Position MetaStore::position() {
  absl::MutexLock lock(&commit_mu_);
  return position_;
}

absl::Status MetaStore::Lead(uint64_t term, Shipper* shipper) {
  absl::MutexLock lock(&commit_mu_);
  if (shipper != nullptr && term <= position_.term) {
    return absl::FailedPreconditionError(
        absl::StrCat("term ", term, " is not after this store's ", position_.term,
                     " (etcd's revisions went back: a new etcd, or another --etcd-prefix?)"));
  }
  term_ = term;
  shipper_ = shipper;
  return absl::OkStatus();
}

bool MetaStore::Empty() {
  for (auto* h : handles_) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), h));
    it->SeekToFirst();
    if (it->Valid()) return false;
  }
  return true;
}

absl::Status MetaStore::Commit(rocksdb::WriteBatch* batch, bool sync, const std::string& what) {
  RETURN_IF_ERROR(CheckSpace());
  rocksdb::WriteOptions w;
  w.sync = sync;
  bool replicating;
  {
    absl::MutexLock lock(&commit_mu_);
    replicating = shipper_ != nullptr;
  }
  // Not replicating: concurrent writes stay concurrent (RocksDB groups their commits). A store
  // starts replicating (Lead) before it serves anyone.
  if (!replicating) return FromRocks(db_->Write(w, batch), what);
  absl::MutexLock lock(&commit_mu_);
  if (!ship_failed_.empty()) return absl::InternalError(ship_failed_);
  const Position prev = position_;
  const Position at{term_, prev.seq + 1};
  batch->Put(kPositionKey, EncodePosition(at));
  // On the standbys first: a leader never holds a write they lack (it may lack one they hold,
  // if it dies here: that write was never acknowledged).
  RETURN_IF_ERROR(shipper_->Ship(prev, at, batch->Data(), sync));
  if (absl::Status st = FromRocks(db_->Write(w, batch), what); !st.ok()) {
    // The standbys are ahead of this store now: it can no longer lead.
    ship_failed_ = absl::StrCat("this meta replica could not write a batch its standbys hold (",
                                st.message(), ")");
    shipper_->Broken(ship_failed_);  // another replica must lead
    return absl::InternalError(ship_failed_);
  }
  position_ = at;
  return absl::OkStatus();
}

absl::Status MetaStore::ApplyReplicated(const Position& prev, const Position& at,
                                        const std::string& batch, bool sync) {
  RETURN_IF_ERROR(CheckSpace());
  absl::MutexLock lock(&commit_mu_);
  if (shipper_ != nullptr) {
    return absl::FailedPreconditionError("this meta replica leads: it takes no batches");
  }
  if (!(prev == position_) || at.seq != prev.seq + 1 || at.term < prev.term) {
    return absl::FailedPreconditionError(absl::StrCat(
        "batch ", at.term, "/", at.seq, " (after ", prev.term, "/", prev.seq,
        ") does not follow on from this replica's ", position_.term, "/", position_.seq));
  }
  rocksdb::WriteBatch b(batch);
  rocksdb::WriteOptions w;
  w.sync = sync;
  RETURN_IF_ERROR(FromRocks(db_->Write(w, &b), "apply replicated batch"));
  position_ = at;
  return absl::OkStatus();
}

absl::Status MetaStore::Checkpoint(const std::string& dir) {
  rocksdb::Checkpoint* raw = nullptr;
  RETURN_IF_ERROR(FromRocks(rocksdb::Checkpoint::Create(db_.get(), &raw), "checkpoint"));
  std::unique_ptr<rocksdb::Checkpoint> cp(raw);
  return FromRocks(cp->CreateCheckpoint(dir), absl::StrCat("checkpoint into '", dir, "'"));
}

MetaStore::~MetaStore() {
  if (db_) {
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
    db_->Close();
  }
}

absl::StatusOr<rpc::Dataset> MetaStore::GetDataset(const std::string& name) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), datasets_, name, &value);
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat("unknown dataset '", name, "'"));
  RETURN_IF_ERROR(FromRocks(s, "read dataset"));
  rpc::Dataset ds;
  if (!ds.ParseFromString(value)) {
    return absl::DataLossError(absl::StrCat("dataset record '", name, "' is corrupt"));
  }
  return ds;
}

absl::StatusOr<std::vector<rpc::Dataset>> MetaStore::ListDatasets() {
  std::vector<rpc::Dataset> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), datasets_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    rpc::Dataset ds;
    if (!ds.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(
          absl::StrCat("dataset record '", it->key().ToString(), "' is corrupt"));
    }
    out.push_back(std::move(ds));
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "list datasets"));
  return out;
}

absl::Status MetaStore::PutDataset(const rpc::Dataset& ds) {
  rocksdb::WriteBatch b;
  b.Put(datasets_, ds.name(), ds.SerializeAsString());
  return Commit(&b, true, "write dataset");
}

absl::StatusOr<uint32_t> MetaStore::AllocateDatasetId() {
  std::string value;
  uint32_t next = 1;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), "next_dataset_id", &value);
  if (s.ok() && value.size() == 4) {
    next = static_cast<uint32_t>(GetBe(value, 0, 4));
  } else if (!s.IsNotFound()) {
    RETURN_IF_ERROR(FromRocks(s, "read dataset id counter"));
  }
  std::string nv;
  PutBe32(&nv, next + 1);
  rocksdb::WriteBatch b;
  b.Put("next_dataset_id", nv);
  RETURN_IF_ERROR(Commit(&b, true, "write id counter"));
  return next;
}

absl::Status MetaStore::DeletePrefixRange(rocksdb::ColumnFamilyHandle* cf, const std::string& begin,
                                          const std::string& end) {
  rocksdb::WriteBatch b;
  b.DeleteRange(cf, begin, end);
  return Commit(&b, true, "delete range");
}

absl::Status MetaStore::DeleteDataset(const rpc::Dataset& ds) {
  // The record goes first: a crash midway leaves only orphans, dropped at the next open.
  rocksdb::WriteBatch b;
  b.Delete(datasets_, ds.name());
  RETURN_IF_ERROR(Commit(&b, true, "delete dataset"));
  std::string begin = DatasetPrefix(ds.id()), end = DatasetPrefix(ds.id() + 1);
  ForgetChecksums();
  for (auto* cf : {manifests_, checksums_, locations_}) {
    RETURN_IF_ERROR(DeletePrefixRange(cf, begin, end));
  }
  ForgetChecksums();  // and what was read meanwhile
  return absl::OkStatus();
}

absl::Status MetaStore::ApplyVolumeChange(const VolumeChange& change) {
  rocksdb::WriteBatch b;
  for (const auto& k : change.erase) b.Delete(volumes_, k);
  for (const auto& [k, v] : change.put) b.Put(volumes_, k, v);
  for (const auto& [addr, sum] : change.checksums) {
    std::string v;
    PutBe64(&v, sum);
    b.Put(checksums_, BlockKey(addr), v);
  }
  // Synced: a change acknowledged to a writer (fsync, rename) must survive a power loss.
  RETURN_IF_ERROR(Commit(&b, true, "write volume"));
  absl::MutexLock lock(&recent_mu_);
  for (const auto& [addr, sum] : change.checksums) RememberChecksumLocked(addr, sum);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> MetaStore::GetVolumeKey(const std::string& key) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), volumes_, key, &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  RETURN_IF_ERROR(FromRocks(s, "read volume"));
  return std::optional<std::string>(std::move(value));
}

absl::Status MetaStore::ScanVolumeKeys(
    const std::string& prefix, const std::string& from,
    const std::function<bool(const std::string&, const std::string&)>& fn) {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), volumes_));
  for (it->Seek(from < prefix ? prefix : from); it->Valid() && it->key().starts_with(prefix);
       it->Next()) {
    if (!fn(it->key().ToString(), it->value().ToString())) break;
  }
  return FromRocks(it->status(), "list volume");
}

absl::Status MetaStore::DeleteVolumeKeys(const std::string& prefix, uint32_t dataset_id) {
  rocksdb::WriteBatch b;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), volumes_));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    b.Delete(volumes_, it->key());
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "list volume"));
  RETURN_IF_ERROR(Commit(&b, true, "delete volume"));
  ForgetChecksums();
  RETURN_IF_ERROR(
      DeletePrefixRange(checksums_, DatasetPrefix(dataset_id), DatasetPrefix(dataset_id + 1)));
  ForgetChecksums();
  return absl::OkStatus();
}

absl::Status MetaStore::DeleteVersionData(uint32_t dataset_id, uint32_t version) {
  std::string begin = VersionPrefix(dataset_id, version);
  std::string end = VersionPrefix(dataset_id, version + 1);
  if (version == UINT32_MAX) end = DatasetPrefix(dataset_id + 1);
  ForgetChecksums();
  for (auto* cf : {manifests_, checksums_, locations_}) {
    RETURN_IF_ERROR(DeletePrefixRange(cf, begin, end));
  }
  ForgetChecksums();  // and what was read meanwhile
  return absl::OkStatus();
}

absl::Status MetaStore::DropOrphanManifests() {
  ASSIGN_OR_RETURN(std::vector<rpc::Dataset> all, ListDatasets());
  std::set<std::pair<uint32_t, uint32_t>> valid;
  for (const auto& ds : all) {
    for (const auto& v : ds.versions()) valid.insert({ds.id(), v.version()});
  }
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), manifests_));
  it->SeekToFirst();
  while (it->Valid()) {
    std::string_view key(it->key().data(), it->key().size());
    if (key.size() < 8) {
      it->Next();
      continue;
    }
    uint32_t ds = static_cast<uint32_t>(GetBe(key, 0, 4));
    uint32_t ver = static_cast<uint32_t>(GetBe(key, 4, 4));
    if (!valid.count({ds, ver})) RETURN_IF_ERROR(DeleteVersionData(ds, ver));
    // Jump to the next (dataset, version) prefix.
    if (ver == UINT32_MAX) {
      if (ds == UINT32_MAX) break;
      it->Seek(DatasetPrefix(ds + 1));
    } else {
      it->Seek(VersionPrefix(ds, ver + 1));
    }
  }
  return FromRocks(it->status(), "scan manifests");
}

MetaStore::ManifestWriter::ManifestWriter(MetaStore* store, uint32_t dataset_id, uint32_t version)
    : store_(store),
      dataset_id_(dataset_id),
      version_(version),
      batch_(std::make_unique<rocksdb::WriteBatch>()) {}

MetaStore::ManifestWriter::~ManifestWriter() = default;

absl::Status MetaStore::ManifestWriter::Add(const rpc::FileEntry& entry) {
  batch_->Put(store_->manifests_, FileKeyBytes(dataset_id_, version_, entry.file_id()),
              entry.SerializeAsString());
  if (++pending_ >= kManifestBatch) return Finish();
  return absl::OkStatus();
}

absl::Status MetaStore::ManifestWriter::Finish() {
  if (pending_ == 0) return absl::OkStatus();
  RETURN_IF_ERROR(store_->Commit(batch_.get(), false, "write manifest"));
  batch_->Clear();
  pending_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<rpc::FileEntry>> MetaStore::ReadManifest(uint32_t dataset_id,
                                                                    uint32_t version,
                                                                    uint64_t after_file_id,
                                                                    size_t max_entries) {
  std::vector<rpc::FileEntry> out;
  if (after_file_id == UINT64_MAX) return out;  // nothing after the last possible id
  std::string prefix = VersionPrefix(dataset_id, version);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), manifests_));
  for (it->Seek(FileKeyBytes(dataset_id, version, after_file_id + 1));
       it->Valid() && it->key().starts_with(prefix) && out.size() < max_entries; it->Next()) {
    rpc::FileEntry e;
    if (!e.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError("manifest entry is corrupt");
    }
    out.push_back(std::move(e));
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "read manifest"));
  return out;
}

absl::Status MetaStore::ForEachEntry(uint32_t dataset_id, uint32_t version,
                                     const std::function<bool(const rpc::FileEntry&)>& fn) {
  std::string prefix = VersionPrefix(dataset_id, version);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), manifests_));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    rpc::FileEntry e;
    if (!e.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError("manifest entry is corrupt");
    }
    if (!fn(e)) break;
  }
  return FromRocks(it->status(), "read manifest");
}

void MetaStore::RememberChecksumLocked(const BlockAddr& addr, uint64_t sum) {
  if (recent_new_.size() >= kRecentChecksums / 2) {
    recent_old_ = std::move(recent_new_);
    recent_new_ = ChecksumMap();
  }
  recent_new_[addr] = sum;
}

void MetaStore::ForgetChecksums() {
  absl::MutexLock lock(&recent_mu_);
  recent_new_ = ChecksumMap();
  recent_old_ = ChecksumMap();
  recent_forgotten_++;
}

absl::StatusOr<std::optional<uint64_t>> MetaStore::GetChecksum(const BlockAddr& addr) {
  uint64_t forgotten = 0;
  {
    absl::MutexLock lock(&recent_mu_);
    if (auto it = recent_new_.find(addr); it != recent_new_.end()) return {it->second};
    if (auto it = recent_old_.find(addr); it != recent_old_.end()) return {it->second};
    forgotten = recent_forgotten_;
  }
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), checksums_, BlockKey(addr), &value);
  if (s.IsNotFound()) return std::optional<uint64_t>();
  RETURN_IF_ERROR(FromRocks(s, "read checksum"));
  if (value.size() != 8) return absl::DataLossError("checksum record is corrupt");
  const uint64_t sum = GetBe(value, 0, 8);
  absl::MutexLock lock(&recent_mu_);
  // Not if a delete forgot the recent ones meanwhile: the value read may be the deleted one.
  if (forgotten == recent_forgotten_) RememberChecksumLocked(addr, sum);
  return std::optional<uint64_t>(sum);
}

absl::Status MetaStore::PutChecksums(const std::vector<std::pair<BlockAddr, uint64_t>>& items) {
  rocksdb::WriteBatch batch;
  for (const auto& [addr, sum] : items) {
    std::string v;
    PutBe64(&v, sum);
    batch.Put(checksums_, BlockKey(addr), v);
  }
  // Unsynced: the WAL survives a crash of meta; nodes re-record anything lost on power loss.
  RETURN_IF_ERROR(Commit(&batch, false, "write checksums"));
  absl::MutexLock lock(&recent_mu_);
  for (const auto& [addr, sum] : items) RememberChecksumLocked(addr, sum);
  return absl::OkStatus();
}

absl::Status MetaStore::PutNode(const rpc::Node& node) {
  rocksdb::WriteBatch b;
  b.Put(nodes_, node.id(), node.SerializeAsString());
  return Commit(&b, true, "write node");
}

absl::StatusOr<std::vector<rpc::Node>> MetaStore::ListNodes() {
  std::vector<rpc::Node> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), nodes_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    rpc::Node n;
    if (!n.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError("node record is corrupt");
    }
    out.push_back(std::move(n));
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "list nodes"));
  return out;
}

absl::Status MetaStore::PutPrefetch(const rpc::PrefetchJob& job) {
  rocksdb::WriteBatch b;
  b.Put("prefetch/" + job.id(), job.SerializeAsString());
  return Commit(&b, true, "write prefetch");
}

absl::StatusOr<std::vector<rpc::PrefetchJob>> MetaStore::ListPrefetches() {
  std::vector<rpc::PrefetchJob> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("prefetch/"); it->Valid() && it->key().starts_with("prefetch/"); it->Next()) {
    rpc::PrefetchJob j;
    if (j.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      out.push_back(std::move(j));
    }
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "list prefetches"));
  return out;
}

absl::Status MetaStore::PutJob(const rpc::Job& job) {
  rocksdb::WriteBatch b;
  b.Put("job/" + job.id(), job.SerializeAsString());
  return Commit(&b, false, "write job");
}

absl::StatusOr<std::vector<rpc::Job>> MetaStore::ListJobs() {
  std::vector<rpc::Job> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("job/"); it->Valid() && it->key().starts_with("job/"); it->Next()) {
    rpc::Job j;
    if (j.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      out.push_back(std::move(j));
    }
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "list jobs"));
  return out;
}

absl::Status MetaStore::PutLocations(const std::vector<LocationWrite>& writes) {
  rocksdb::WriteBatch batch;
  for (const LocationWrite& w : writes) {
    std::string k = FileKeyBytes(w.key.dataset_id, w.key.version, w.key.file_id);
    k += w.node_id;
    if (w.bitmap.empty()) {
      batch.Delete(locations_, k);
    } else {
      batch.Put(locations_, k, w.bitmap);
    }
  }
  // Soft state: nodes re-report, so no sync.
  return Commit(&batch, false, "write locations");
}

absl::Status MetaStore::ForEachLocation(
    const std::function<void(const FileKey&, const std::string&, const std::string&)>& fn) {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), locations_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    std::string_view k(it->key().data(), it->key().size());
    if (k.size() <= 16) continue;
    FileKey fk{static_cast<uint32_t>(GetBe(k, 0, 4)), static_cast<uint32_t>(GetBe(k, 4, 4)),
               GetBe(k, 8, 8)};
    fn(fk, std::string(k.substr(16)), it->value().ToString());
  }
  return FromRocks(it->status(), "read locations");
}

}  // namespace ember::meta
