#include "cachefs/cache/block_index.h"

#include <rocksdb/db.h>
#include <rocksdb/memtablerep.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ember::cachefs {

absl::StatusOr<std::unique_ptr<BlockIndex>> BlockIndex::Open(const std::string& cache_dir) {
  rocksdb::Options ro;
  ro.create_if_missing = true;
  ro.write_buffer_size = 8 << 20;
  ro.max_open_files = 64;
  // Written for every block stored, read only by Load's scan at start: an unsorted memtable,
  // sorted once when flushed, instead of a skiplist insert per record (a tiny-file prefetch
  // stores 200,000 records per node). Such a memtable takes one writer at a time.
  ro.memtable_factory.reset(new rocksdb::VectorRepFactory());
  ro.allow_concurrent_memtable_write = false;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(ro, cache_dir + "/index", &db);
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open cache index in '", cache_dir, "': ", s.ToString()));
  }
  return std::unique_ptr<BlockIndex>(new BlockIndex(db));
}

BlockIndex::BlockIndex(rocksdb::DB* db) : db_(db) {}

BlockIndex::~BlockIndex() {
  if (db_) db_->Close();
}

absl::Status BlockIndex::Put(const IndexRecord& r) {
  rocksdb::Status s =
      db_->Put(rocksdb::WriteOptions(), EncodeIndexKey(r.addr), EncodeIndexValue(r));
  if (!s.ok()) return absl::InternalError(s.ToString());
  return absl::OkStatus();
}

absl::Status BlockIndex::PutMany(const std::vector<IndexRecord>& records) {
  rocksdb::WriteBatch batch;
  for (const IndexRecord& r : records) batch.Put(EncodeIndexKey(r.addr), EncodeIndexValue(r));
  rocksdb::Status s = db_->Write(rocksdb::WriteOptions(), &batch);
  if (!s.ok()) return absl::InternalError(s.ToString());
  return absl::OkStatus();
}

absl::Status BlockIndex::Delete(const BlockAddr& addr) {
  rocksdb::Status s = db_->Delete(rocksdb::WriteOptions(), EncodeIndexKey(addr));
  if (!s.ok()) return absl::InternalError(s.ToString());
  return absl::OkStatus();
}

size_t BlockIndex::Load(const std::function<bool(const IndexRecord&)>& keep) {
  std::vector<std::string> stale_keys;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto rec = DecodeIndexRecord(std::string_view(it->key().data(), it->key().size()),
                                 std::string_view(it->value().data(), it->value().size()));
    if (!rec || !keep(*rec)) stale_keys.push_back(it->key().ToString());
  }
  // A record left behind is harmless: its block is forgotten again at the next start.
  for (const auto& k : stale_keys) db_->Delete(rocksdb::WriteOptions(), k).PermitUncheckedError();
  return stale_keys.size();
}

}  // namespace ember::cachefs
