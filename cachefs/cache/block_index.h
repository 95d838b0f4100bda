// BlockIndex: the block cache's index, a small RocksDB at `DIR/index` holding one IndexRecord
// per resident block (index_record.h: its checksum, offset, length and prefetch pin). A record
// is written only after the block's bytes are in the cache file, so it is the commit point of a
// fill: a crash mid-write leaves no half block behind.
//
// Thread-safe (RocksDB is); BlockCache serializes what must be ordered.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cachefs/cache/index_record.h"

namespace rocksdb {
class DB;
}

namespace ember::cachefs {

class BlockIndex {
 public:
  // Opens (or creates) the index under `cache_dir`.
  // Returns: the index; FailedPrecondition naming the dir when RocksDB cannot open it.
  static absl::StatusOr<std::unique_ptr<BlockIndex>> Open(const std::string& cache_dir);
  ~BlockIndex();

  // Writes (or overwrites) a block's record. Returns: Ok; Internal with RocksDB's error.
  absl::Status Put(const IndexRecord& record);
  // Writes many records in one batch (all or none). Returns: Ok; Internal with RocksDB's error.
  absl::Status PutMany(const std::vector<IndexRecord>& records);
  // Removes a block's record. Returns: Ok; Internal with RocksDB's error.
  absl::Status Delete(const BlockAddr& addr);
  // Calls keep(record) for every record in key order (dataset, version, file, block), then
  // deletes the records it returned false for and those that do not decode (damaged).
  // Returns: how many records were deleted.
  size_t Load(const std::function<bool(const IndexRecord&)>& keep);

 private:
  explicit BlockIndex(rocksdb::DB* db);
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace ember::cachefs
