// index_bench: writes a cache index holding every block of a dataset, for bench/bench_memory.sh
// (agent memory with a large index). Not a test.
//
//   index_bench META DATASET CACHE_DIR
//
// Asks meta for the dataset's manifest and writes, straight into CACHE_DIR/index (RocksDB, the
// records BlockCache::Insert would write), one record per block of every file, with a sparse
// cache file of the right size for each; prints the number of blocks. The bytes are holes, so
// the blocks fail verification if read: the benchmark only loads the index and reports it.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "cachefs/cache/index_record.h"
#include "meta/meta_client.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: index_bench META DATASET CACHE_DIR\n");
    return 2;
  }
  const std::string dataset = argv[2], dir = argv[3];
  ember::meta::MetaClient meta(argv[1]);
  auto ds = meta.GetDataset(dataset);
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ds.status().message()).c_str());
    return 1;
  }
  std::filesystem::create_directories(dir);
  rocksdb::Options ro;
  ro.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(ro, dir + "/index", &raw);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  const uint64_t bs = ds->block_size();
  const uint32_t version = ds->latest_version();
  uint64_t blocks = 0;
  absl::Status st = meta.ForEachManifestEntry(dataset, version, [&](const auto& f) {
    if (f.type() != ember::rpc::FileEntry::FILE || f.size() == 0) return;
    std::string cdir = absl::StrCat(dir, "/blocks/", ds->id(), "/", version);
    std::filesystem::create_directories(cdir);
    std::string path = absl::StrCat(cdir, "/", f.file_id());
    int fd = open(path.c_str(), O_WRONLY | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(f.size())) != 0) {
      std::perror(path.c_str());
      std::exit(1);
    }
    close(fd);
    rocksdb::WriteBatch batch;
    for (uint64_t i = 0; i * bs < f.size(); i++) {
      ember::cachefs::IndexRecord r;
      r.addr = {ds->id(), version, f.file_id(), i};
      r.offset = i * bs;
      r.length = static_cast<uint32_t>(std::min(bs, f.size() - r.offset));
      r.checksum = i;
      batch.Put(ember::cachefs::EncodeIndexKey(r.addr), ember::cachefs::EncodeIndexValue(r));
      blocks++;
    }
    rocksdb::Status ws = db->Write(rocksdb::WriteOptions(), &batch);
    if (!ws.ok()) {
      std::fprintf(stderr, "%s\n", ws.ToString().c_str());
      std::exit(1);
    }
  });
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 1;
  }
  db->Flush(rocksdb::FlushOptions());
  std::printf("%llu\n", static_cast<unsigned long long>(blocks));
  return 0;
}
