#include "cachefs/cache/block_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "cachefs/cache/block_buffer.h"
#include "cachefs/cache/block_index.h"
#include "cachefs/cache/cache_files.h"
#include "cachefs/cache/index_record.h"
#include "cachefs/cache/scrubber.h"
#include "tests/testing/testing.h"

namespace ember::cachefs {
namespace {

constexpr uint32_t kBlock = 64 << 10;

// small_max: files of at most this many bytes are packed into segments (0: none).
std::unique_ptr<BlockCache> OpenCache(const std::string& dir, uint64_t capacity,
                                      uint64_t small_max = 0, bool direct_writes = true) {
  BlockCache::Options o;
  o.dir = dir;
  o.capacity_bytes = capacity;
  o.expected_block_size = kBlock;
  o.small_file_max = small_max;
  o.direct_writes = direct_writes;
  auto c = BlockCache::Open(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

std::string ReadHold(const BlockHold& p) {
  std::string s(p.length, '\0');
  EXPECT_EQ(pread(p.fd, s.data(), p.length, static_cast<off_t>(p.offset)),
            static_cast<ssize_t>(p.length));
  return s;
}

// Buffers of at least one O_DIRECT unit are aligned for it; shorter ones (a tiny file's block)
// come from malloc, and a direct-writing cache stores them (through the page cache) all the same,
// in a file's cache file as in a segment.
TEST(BlockCacheTest, ShortBlockBuffersAreStoredByADirectWritingCache) {
  for (size_t n : {size_t{4096}, size_t{8193}, size_t{1} << 20}) {
    BlockBuffer b(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % BlockBuffer::kAlign, 0u) << n;
  }
  testing::TempDir dir;
  auto cache = OpenCache(dir.path(), 64ull * kBlock, /*small_max=*/4096);
  for (size_t n : {size_t{1}, size_t{2500}, size_t{4095}}) {
    BlockBuffer b(n);
    for (size_t i = 0; i < n; i++) b.data()[i] = static_cast<char>('a' + (i + n) % 26);
    // The tail block of a larger file (its cache file) and a small file's only block (a segment).
    const BlockAddr tail{1, 1, 30 + n, 1}, only{1, 1, 40 + n, 0};
    ASSERT_EQ(cache->Insert(tail, kBlock + n, kBlock, b.view(), BlockChecksum(b.data(), n)),
              BlockCache::InsertResult::kStored);
    ASSERT_EQ(cache->Insert(only, n, 0, b.view(), BlockChecksum(b.data(), n)),
              BlockCache::InsertResult::kStored);
    for (const BlockAddr& a : {tail, only}) {
      auto h = cache->Acquire(a);
      ASSERT_NE(h, nullptr);
      EXPECT_EQ(h->segment != 0, a == only) << n;
      std::string out(n, '\0');
      ASSERT_TRUE(cache->ReadVerified(*h, h->offset, n, out.data()).ok()) << n;
      EXPECT_EQ(out, std::string(b.view())) << n;
    }
  }
}

// Direct (O_DIRECT) and buffered writes store the same bytes: from an aligned BlockBuffer, from
// unaligned memory (written buffered), with an unaligned tail; the bytes read back right through
// the page cache afterwards, and a buffered read before the write does not leave stale zeros.
TEST(BlockCacheTest, DirectAndBufferedWritesStoreTheSameBytes) {
  for (bool direct : {true, false}) {
    testing::TempDir dir;
    auto cache = OpenCache(dir.path(), 64ull * kBlock, 0, direct);
    const uint64_t file_size = 3ull * kBlock + 777;
    testing::WriteRandomFile(dir.Sub("want"), file_size, direct ? 1 : 2);
    std::string want = testing::ReadFile(dir.Sub("want"));
    // Block 1 first, then a buffered read of the whole file (zeros where blocks are missing)
    // that puts block 0's and 2's ranges in the page cache before they are written.
    BlockBuffer b1(kBlock);
    memcpy(b1.data(), want.data() + kBlock, kBlock);
    ASSERT_EQ(cache->Insert({1, 1, 9, 1}, file_size, kBlock, b1.view(), 1),
              BlockCache::InsertResult::kStored);
    {
      int fd = open(cache->FilePath({1, 1, 9, 0}).c_str(), O_RDONLY);
      std::string before(file_size, 'x');
      ASSERT_EQ(pread(fd, before.data(), file_size, 0), static_cast<ssize_t>(file_size));
      EXPECT_EQ(before.substr(0, kBlock), std::string(kBlock, '\0'));
      close(fd);
    }
    std::string unaligned =
        "." + want.substr(0, kBlock);  // data() + 1 is not 4 KiB-aligned: buffered
    ASSERT_EQ(cache->Insert({1, 1, 9, 0}, file_size, 0, std::string_view(unaligned).substr(1), 2),
              BlockCache::InsertResult::kStored);
    BlockBuffer tail(2 * kBlock + 777 - kBlock);  // blocks 2 (kBlock) and a 777-byte block 3
    memcpy(tail.data(), want.data() + 2 * kBlock, tail.size());
    ASSERT_EQ(
        cache->Insert({1, 1, 9, 2}, file_size, 2ull * kBlock, tail.view().substr(0, kBlock), 3),
        BlockCache::InsertResult::kStored);
    ASSERT_EQ(cache->Insert({1, 1, 9, 3}, file_size, 3ull * kBlock, tail.view().substr(kBlock), 4),
              BlockCache::InsertResult::kStored);
    int fd = open(cache->FilePath({1, 1, 9, 0}).c_str(), O_RDONLY);
    std::string got(file_size, '\0');
    ASSERT_EQ(pread(fd, got.data(), file_size, 0), static_cast<ssize_t>(file_size));
    close(fd);
    EXPECT_TRUE(got == want) << (direct ? "direct" : "buffered");
  }
}

TEST(BlockCacheTest, StoresInPlaceAndSurvivesReopen) {
  testing::TempDir dir;
  std::string b0(kBlock, 'a'), b2(100, 'c');  // last block of a 2*kBlock+100 file is short
  uint64_t file_size = 2ull * kBlock + 100;
  {
    auto cache = OpenCache(dir.path(), 10ull * kBlock);
    BlockAddr a0{1, 1, 7, 0}, a2{1, 1, 7, 2};
    EXPECT_EQ(cache->Acquire(a0), nullptr);
    EXPECT_EQ(cache->Insert(a0, file_size, 0, b0, BlockChecksum(b0.data(), b0.size())),
              BlockCache::InsertResult::kStored);
    EXPECT_EQ(cache->Insert(a2, file_size, 2ull * kBlock, b2, BlockChecksum(b2.data(), 100)),
              BlockCache::InsertResult::kStored);
    auto hold = cache->Acquire(a2);
    ASSERT_NE(hold, nullptr);
    EXPECT_EQ(ReadHold(*hold), b2);
    EXPECT_TRUE(hold->checked);
    // The cache file is the dataset file, sparse where blocks are missing.
    struct stat st;
    ASSERT_EQ(stat(cache->FilePath(a0).c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), file_size);
    std::vector<BlockAddr> added, removed;
    cache->TakeChanges(&added, &removed);
    EXPECT_EQ(added.size(), 2u);
    EXPECT_EQ(cache->GetStats().used_bytes, kBlock + 100u);
    int files = 0;
    cache->ForEachResidentFile([&](uint32_t, uint32_t, uint64_t file, const std::string& bm) {
      files++;
      EXPECT_EQ(file, 7u);
      EXPECT_EQ(bm, std::string("\x05", 1));
    });
    EXPECT_EQ(files, 1);
  }
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  auto hold = cache->Acquire({1, 1, 7, 0});
  ASSERT_NE(hold, nullptr);
  EXPECT_FALSE(hold->checked);  // nothing loaded from disk is trusted
  EXPECT_EQ(ReadHold(*hold), b0);
  EXPECT_EQ(hold->checksum, BlockChecksum(b0.data(), b0.size()));
  EXPECT_EQ(cache->Acquire({1, 1, 7, 1}), nullptr);
  EXPECT_EQ(cache->GetStats().resident_blocks, 2u);
}

TEST(BlockCacheTest, CapacityIsHardAndHeldBlocksStay) {
  testing::TempDir dir;
  auto cache = OpenCache(dir.path(), 3ull * kBlock);
  std::string data(kBlock, 'z');
  uint64_t fsize = 100ull * kBlock;
  for (uint64_t i = 0; i < 3; i++) {
    ASSERT_EQ(cache->Insert({1, 1, 1, i}, fsize, i * kBlock, data, 9),
              BlockCache::InsertResult::kStored);
  }
  // Hold every block: nothing can be evicted, so a newcomer is not admitted.
  std::vector<BlockHoldPtr> holds;
  for (uint64_t i = 0; i < 3; i++) holds.push_back(cache->Acquire({1, 1, 1, i}));
  for (int k = 0; k < 5; k++) cache->Acquire({1, 1, 1, 50});  // make the newcomer hot
  EXPECT_EQ(cache->Insert({1, 1, 1, 50}, fsize, 50ull * kBlock, data, 9),
            BlockCache::InsertResult::kNotAdmitted);
  EXPECT_LE(cache->GetStats().used_bytes, 3ull * kBlock);
  holds.clear();
  // Released, the hot newcomer evicts a cold block and its range becomes a hole.
  EXPECT_EQ(cache->Insert({1, 1, 1, 50}, fsize, 50ull * kBlock, data, 9),
            BlockCache::InsertResult::kStored);
  EXPECT_EQ(cache->GetStats().resident_blocks, 3u);
  EXPECT_EQ(cache->GetStats().evictions, 1u);
  EXPECT_LE(cache->GetStats().used_bytes, 3ull * kBlock);
  struct stat st;
  ASSERT_EQ(stat(cache->FilePath({1, 1, 1, 0}).c_str(), &st), 0);
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, 3ull * kBlock + 4096);
}

TEST(BlockCacheTest, EvictsTheLeastRecentlyUsedBlock) {
  testing::TempDir dir;
  auto cache = OpenCache(dir.path(), 4ull * kBlock);
  std::string data(kBlock, 'r');
  uint64_t fsize = 100ull * kBlock;
  for (uint64_t i = 0; i < 4; i++) {
    ASSERT_EQ(cache->Insert({1, 1, 1, i}, fsize, i * kBlock, data, 9),
              BlockCache::InsertResult::kStored);
  }
  // Use 0, 1 and 3 again: 2 is now the least recent, then 0.
  for (uint64_t i : {0, 1, 3}) cache->Acquire({1, 1, 1, i});
  for (int k = 0; k < 5; k++) cache->Acquire({1, 1, 1, 60});  // a hot newcomer (admitted)
  ASSERT_EQ(cache->Insert({1, 1, 1, 60}, fsize, 60ull * kBlock, data, 9),
            BlockCache::InsertResult::kStored);
  EXPECT_FALSE(cache->Resident({1, 1, 1, 2}));
  for (uint64_t i : {0, 1, 3, 60}) EXPECT_TRUE(cache->Resident({1, 1, 1, i})) << i;
  for (int k = 0; k < 5; k++) cache->Acquire({1, 1, 1, 61});
  ASSERT_EQ(cache->Insert({1, 1, 1, 61}, fsize, 61ull * kBlock, data, 9),
            BlockCache::InsertResult::kStored);
  EXPECT_FALSE(cache->Resident({1, 1, 1, 0}));
  EXPECT_TRUE(cache->Resident({1, 1, 1, 1}));
  // Dropping entries (front, middle, back) keeps the list whole: eviction still works after.
  EXPECT_TRUE(cache->Drop({1, 1, 1, 61}));
  EXPECT_TRUE(cache->Drop({1, 1, 1, 1}));
  EXPECT_EQ(cache->GetStats().resident_blocks, 2u);
  for (uint64_t i = 70; i < 74; i++) {
    for (int k = 0; k < 10; k++) cache->Acquire({1, 1, 1, i});  // hotter than 60
    ASSERT_EQ(cache->Insert({1, 1, 1, i}, fsize, i * kBlock, data, 9),
              BlockCache::InsertResult::kStored);
  }
  EXPECT_EQ(cache->GetStats().resident_blocks, 4u);
  EXPECT_LE(cache->GetStats().used_bytes, 4ull * kBlock);
}

TEST(BlockCacheTest, DropWhileHeldPunchesAfterRelease) {
  testing::TempDir dir;
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  std::string data(kBlock, 'q');
  BlockAddr a{2, 1, 3, 0};
  ASSERT_EQ(cache->Insert(a, kBlock, 0, data, 1), BlockCache::InsertResult::kStored);
  auto hold = cache->Acquire(a);
  cache->Drop(a);
  EXPECT_FALSE(cache->Resident(a));
  EXPECT_EQ(cache->Acquire(a), nullptr);
  EXPECT_EQ(ReadHold(*hold), data);  // the reader holding it still gets its bytes
  hold.reset();
  EXPECT_EQ(cache->GetStats().used_bytes, 0u);
  int fd = open(cache->FilePath(a).c_str(), O_RDONLY);
  std::string after(kBlock, 'x');
  ASSERT_EQ(pread(fd, after.data(), kBlock, 0), static_cast<ssize_t>(kBlock));
  close(fd);
  EXPECT_EQ(after, std::string(kBlock, '\0'));  // punched
}

TEST(BlockCacheTest, MissingCacheFileIsForgottenOnOpen) {
  testing::TempDir dir;
  std::string path;
  {
    auto cache = OpenCache(dir.path(), 10ull * kBlock);
    std::string data(kBlock, 'm');
    ASSERT_EQ(cache->Insert({1, 1, 1, 0}, kBlock, 0, data, 1), BlockCache::InsertResult::kStored);
    path = cache->FilePath({1, 1, 1, 0});
  }
  unlink(path.c_str());
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  EXPECT_EQ(cache->GetStats().resident_blocks, 0u);
  EXPECT_EQ(cache->Acquire({1, 1, 1, 0}), nullptr);
}

// At start, index records that do not decode, blocks beyond the end of a cache file that was
// cut short, and blocks of a cache file that is gone are forgotten (and never served).
TEST(BlockCacheTest, DamagedRecordsAndShortFilesAreForgottenAtStart) {
  testing::TempDir dir;
  std::string data(kBlock, 'k');
  {
    auto cache = OpenCache(dir.path(), 20ull * kBlock);
    for (uint64_t f : {7, 8}) {
      for (uint64_t i = 0; i < 3; i++) {
        ASSERT_EQ(cache->Insert({1, 1, f, i}, 3ull * kBlock, i * kBlock, data,
                                BlockChecksum(data.data(), kBlock)),
                  BlockCache::InsertResult::kStored);
      }
    }
  }
  // File 7 cut short in its second block; a record of file 8 damaged.
  ASSERT_EQ(truncate((dir.path() + "/blocks/1/1/7").c_str(), kBlock + 10), 0);
  {
    rocksdb::DB* db = nullptr;
    rocksdb::Options o;
    ASSERT_TRUE(rocksdb::DB::Open(o, dir.path() + "/index", &db).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), EncodeIndexKey({1, 1, 8, 1}), "garbage").ok());
    delete db;
  }
  auto cache = OpenCache(dir.path(), 20ull * kBlock);
  EXPECT_TRUE(cache->Resident({1, 1, 7, 0}));
  EXPECT_FALSE(cache->Resident({1, 1, 7, 1}));
  EXPECT_FALSE(cache->Resident({1, 1, 7, 2}));
  EXPECT_TRUE(cache->Resident({1, 1, 8, 0}));
  EXPECT_FALSE(cache->Resident({1, 1, 8, 1}));
  EXPECT_TRUE(cache->Resident({1, 1, 8, 2}));
  EXPECT_EQ(cache->GetStats().resident_blocks, 3u);
}

// Reads of blocks loaded from the index are checked before any byte goes out, and a bad copy is
// quarantined: out of the cache, counted and logged once, its listener told.
// Many readers of a block nobody checked yet (loaded after a restart; or just stored O_DIRECT,
// its pages not in the page cache) : one reads and checks all of it, the others wait and copy.
TEST(BlockCacheTest, ConcurrentReadersOfAnUncheckedBlockCheckItOnce) {
  testing::TempDir dir;
  const uint64_t big = 8ull << 20;  // long enough to check that the readers overlap
  std::string good(big, '\0');
  for (size_t i = 0; i < good.size(); i++) good[i] = static_cast<char>(i * 131 + (i >> 12));
  {
    auto cache = OpenCache(dir.path(), 4 * big);
    ASSERT_EQ(cache->Insert({1, 1, 2, 0}, big, 0, good, BlockChecksum(good.data(), big)),
              BlockCache::InsertResult::kStored);
  }
  auto cache = OpenCache(dir.path(), 4 * big);
  auto hold = cache->Acquire({1, 1, 2, 0});
  ASSERT_NE(hold, nullptr);
  ASSERT_FALSE(hold->checked);
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; t++) {
    readers.emplace_back([&, t] {
      std::string out(4096, '\0');
      const uint64_t pos = static_cast<uint64_t>(t) * 100000;
      if (!cache->ReadVerified(*hold, pos, out.size(), out.data()).ok() ||
          out != good.substr(pos, out.size())) {
        wrong++;
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(cache->GetStats().verifications, 1u);
}

TEST(BlockCacheTest, LoadedBlocksAreCheckedOnReadAndBadOnesQuarantined) {
  testing::TempDir dir;
  std::string good(kBlock, 'g'), bad(kBlock, 'b');
  {
    auto cache = OpenCache(dir.path(), 10ull * kBlock);
    ASSERT_EQ(
        cache->Insert({1, 1, 2, 0}, 2ull * kBlock, 0, good, BlockChecksum(good.data(), kBlock)),
        BlockCache::InsertResult::kStored);
    ASSERT_EQ(
        cache->Insert({1, 1, 2, 1}, 2ull * kBlock, kBlock, bad, BlockChecksum(bad.data(), kBlock)),
        BlockCache::InsertResult::kStored);
    EXPECT_TRUE(
        cache->Acquire({1, 1, 2, 0})->checked);  // stored by this agent: its fill checked it
  }
  {  // Damage block 1 on disk while no agent runs.
    int fd = open((dir.path() + "/blocks/1/1/2").c_str(), O_WRONLY);
    ASSERT_EQ(pwrite(fd, "x", 1, kBlock + 5), 1);
    close(fd);
  }
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  std::vector<BlockAddr> quarantined;
  cache->SetQuarantineListener([&](const BlockAddr& a) { quarantined.push_back(a); });
  auto hold = cache->Acquire({1, 1, 2, 0});
  ASSERT_NE(hold, nullptr);
  EXPECT_FALSE(hold->checked);  // nothing loaded from disk is trusted
  std::string out(100, '\0');
  ASSERT_TRUE(cache->ReadVerified(*hold, 10, 100, out.data()).ok());
  EXPECT_EQ(out, good.substr(10, 100));
  EXPECT_TRUE(cache->Acquire({1, 1, 2, 0})->checked);
  EXPECT_EQ(cache->GetStats().verifications, 1u);
  ASSERT_TRUE(cache->ReadVerified(*hold, 200, 100, out.data()).ok());
  EXPECT_EQ(cache->GetStats().verifications, 1u);  // still in the page cache: not again

  auto damaged = cache->Acquire({1, 1, 2, 1});
  ASSERT_NE(damaged, nullptr);
  EXPECT_EQ(cache->ReadVerified(*damaged, kBlock, 100, out.data()).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_NE(out, std::string(100, 'x'));
  EXPECT_FALSE(cache->Resident({1, 1, 2, 1}));
  // A second reader of the same bad copy gets no bytes either, and it is counted once.
  EXPECT_EQ(cache->ReadVerified(*damaged, kBlock, 100, out.data()).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(cache->GetStats().checksum_failures, 1u);
  ASSERT_EQ(cache->GetStats().recent_corruptions.size(), 1u);
  EXPECT_NE(cache->GetStats().recent_corruptions[0].find("blocks/1/1/2"), std::string::npos);
  EXPECT_EQ(quarantined, (std::vector<BlockAddr>{{1, 1, 2, 1}}));
  std::vector<BlockAddr> added, removed;
  cache->TakeChanges(&added, &removed);
  EXPECT_EQ(removed, (std::vector<BlockAddr>{{1, 1, 2, 1}}));  // meta stops sending peers here
}

// Someone else writing a cache file (through the page cache, so no eviction is needed) is seen
// by its ctime: the file's blocks are checked again, and the bad one is never served.
TEST(BlockCacheTest, AForeignWriteIsCaughtAtTheNextRead) {
  testing::TempDir dir;
  std::string data(2 * kBlock, 'd');
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  for (uint64_t i = 0; i < 2; i++) {
    ASSERT_EQ(cache->Insert({1, 1, 3, i}, 2ull * kBlock, i * kBlock, data.substr(0, kBlock),
                            BlockChecksum(data.data(), kBlock)),
              BlockCache::InsertResult::kStored);
  }
  auto h0 = cache->Acquire({1, 1, 3, 0});
  auto h1 = cache->Acquire({1, 1, 3, 1});
  std::string out(64, '\0');
  ASSERT_TRUE(cache->ReadVerified(*h0, 0, 64, out.data()).ok());
  ASSERT_TRUE(cache->ReadVerified(*h1, kBlock, 64, out.data()).ok());
  int fd = open((dir.path() + "/blocks/1/1/3").c_str(), O_WRONLY);
  ASSERT_EQ(pwrite(fd, "XXXX", 4, kBlock + 8), 4);
  close(fd);
  EXPECT_EQ(cache->ReadVerified(*h1, kBlock, 64, out.data()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(out.substr(8, 4) == "XXXX", false);
  // The untouched block is checked again (its file changed) and served.
  const uint64_t before = cache->GetStats().verifications;
  ASSERT_TRUE(cache->ReadVerified(*h0, 0, 64, out.data()).ok());
  EXPECT_EQ(out, data.substr(0, 64));
  EXPECT_EQ(cache->GetStats().verifications, before + 1);
  EXPECT_EQ(cache->GetStats().foreign_changes, 1u);
  EXPECT_FALSE(cache->AllChecked({h0, h1}));
}

// A block whose pages left the page cache is checked again when next read (its copy on disk may
// have rotted meanwhile); one still in memory is not.
TEST(BlockCacheTest, PagesThatLeftMemoryAreCheckedAgain) {
  testing::TempDir dir;
  std::string data(kBlock, 'p');
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  ASSERT_EQ(cache->Insert({1, 1, 4, 0}, kBlock, 0, data, BlockChecksum(data.data(), kBlock)),
            BlockCache::InsertResult::kStored);
  auto h = cache->Acquire({1, 1, 4, 0});
  std::string out(4096, '\0');
  ASSERT_TRUE(cache->ReadVerified(*h, 4096, 4096, out.data()).ok());
  ASSERT_TRUE(cache->ReadVerified(*h, 8192, 4096, out.data()).ok());
  EXPECT_EQ(cache->GetStats().verifications, 1u);
  // Evict the file's (clean) pages from the page cache. Pages still under the first read's
  // asynchronous readahead are locked and stay: ask again until the page read next is gone. That
  // readahead can also bring the page back after it was seen gone (a few runs in a hundred):
  // then the read finds it in memory, rightly unchecked, and the eviction is tried again.
  int fd = open((dir.path() + "/blocks/1/1/4").c_str(), O_RDONLY);
  ASSERT_EQ(fsync(fd), 0);  // clean pages can be dropped
  for (int round = 0; round < 20 && cache->GetStats().verifications < 2; round++) {
    bool dropped = false;
    for (int i = 0; i < 200 && !dropped; i++) {
      ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
      dropped = !PagesCached(fd, 8192, 4096).value_or(false);
      if (!dropped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(dropped) << "the page cache kept the block's pages";
    out.assign(4096, '\0');
    ASSERT_TRUE(cache->ReadVerified(*h, 8192, 4096, out.data()).ok());
    EXPECT_EQ(out, data.substr(8192, 4096));
  }
  close(fd);
  EXPECT_EQ(cache->GetStats().verifications, 2u);
}

// A quarantined block that is still held (a passthrough open reads its file) is written again in
// place when refilled: the holder's fd then reads the good bytes.
TEST(BlockCacheTest, AHeldQuarantinedBlockIsRepairedInPlace) {
  testing::TempDir dir;
  std::string good(kBlock, 'r');
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  ASSERT_EQ(cache->Insert({1, 1, 5, 0}, kBlock, 0, good, BlockChecksum(good.data(), kBlock)),
            BlockCache::InsertResult::kStored);
  auto held = cache->Acquire({1, 1, 5, 0});
  int fd = open((dir.path() + "/blocks/1/1/5").c_str(), O_WRONLY);
  ASSERT_EQ(pwrite(fd, "bad", 3, 100), 3);
  close(fd);
  std::string out(16, '\0');
  ASSERT_EQ(cache->ReadVerified(*held, 96, 16, out.data()).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(cache->Resident({1, 1, 5, 0}));
  EXPECT_EQ(cache->Insert({1, 1, 5, 0}, kBlock, 0, good, BlockChecksum(good.data(), kBlock)),
            BlockCache::InsertResult::kStored);
  EXPECT_TRUE(cache->Resident({1, 1, 5, 0}));
  ASSERT_EQ(pread(held->fd, out.data(), 16, 96), 16);
  EXPECT_EQ(out, good.substr(96, 16));
  auto again = cache->Acquire({1, 1, 5, 0});
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again->generation, held->generation);
  EXPECT_TRUE(cache->ReadVerified(*again, 96, 16, out.data()).ok());
  held.reset();  // the old hold's end does not punch the repaired block
  EXPECT_TRUE(cache->Resident({1, 1, 5, 0}));
}

// The scrubber reads every block from the disk at its pace and quarantines a bad one that nobody
// reads.
TEST(BlockCacheTest, TheScrubberFindsABadBlockNobodyReads) {
  testing::TempDir dir;
  std::string data(kBlock, 's');
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  for (uint64_t i = 0; i < 3; i++) {
    ASSERT_EQ(cache->Insert({1, 1, 6, i}, 3ull * kBlock, i * kBlock, data,
                            BlockChecksum(data.data(), kBlock)),
              BlockCache::InsertResult::kStored);
  }
  int fd = open((dir.path() + "/blocks/1/1/6").c_str(), O_WRONLY);
  ASSERT_EQ(pwrite(fd, "rot", 3, 2 * kBlock + 77), 3);
  fsync(fd);
  close(fd);
  Scrubber scrubber(cache.get(), 64ull << 20);
  ASSERT_TRUE(testing::WaitFor([&] { return !cache->Resident({1, 1, 6, 2}); }));
  EXPECT_TRUE(cache->Resident({1, 1, 6, 0}));
  EXPECT_TRUE(testing::WaitFor([&] { return scrubber.GetProgress().passes >= 1; }));
  const Scrubber::Progress p = scrubber.GetProgress();
  EXPECT_EQ(p.bad, 1u);
  EXPECT_GE(p.blocks, 3u);
}

// The background pass's pace counts each block as at least 64 KiB: a tiny block costs a disk
// read and the checks around it like a large one's first chunk, so a cache of tiny files is not
// scrubbed at 400 reads a second (1 MiB/s of 2.5 KB blocks: 5% of an agent's CPU during a tiny
// cold epoch). 1 MiB/s here: 16 tiny blocks a second, where bytes alone allowed all 200 at once.
TEST(BlockCacheTest, TheScrubbersPaceCountsTinyBlocksAsDiskReads) {
  testing::TempDir dir;
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  std::string data(1000, 't');
  for (uint64_t f = 0; f < 200; f++) {
    ASSERT_EQ(cache->Insert({1, 1, 100 + f, 0}, data.size(), 0, data,
                            BlockChecksum(data.data(), data.size())),
              BlockCache::InsertResult::kStored);
  }
  Scrubber scrubber(cache.get(), 1 << 20);
  ASSERT_TRUE(testing::WaitFor([&] { return scrubber.GetProgress().pass_done >= 2; }));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const Scrubber::Progress p = scrubber.GetProgress();
  EXPECT_LT(p.pass_done, 60u);
  EXPECT_EQ(p.passes, 0u);
  EXPECT_EQ(p.bad, 0u);
}

TEST(BlockCacheTest, UnwritableDirIsAClearError) {
  BlockCache::Options o;
  o.dir = "/proc/ember-no-such-dir";
  o.capacity_bytes = 1 << 20;
  auto c = BlockCache::Open(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("not writable"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace ember::cachefs

namespace ember::cachefs {
namespace {

int64_t NowMsForTest() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TEST(BlockCachePinTest, PinnedBlocksSurvivePressureUntilExpiry) {
  testing::TempDir dir;
  auto cache = OpenCache(dir.path(), 4ull * kBlock);
  std::string data(kBlock, 'p');
  uint64_t fsize = 100ull * kBlock;
  for (uint64_t i = 0; i < 4; i++) {
    ASSERT_EQ(cache->Insert({1, 1, 1, i}, fsize, i * kBlock, data, 1),
              BlockCache::InsertResult::kStored);
  }
  const int64_t until = NowMsForTest() + 600;
  for (uint64_t i = 0; i < 2; i++) EXPECT_TRUE(cache->SetPin({1, 1, 1, i}, until));
  EXPECT_FALSE(cache->SetPin({1, 1, 1, 77}, until));  // not resident
  EXPECT_EQ(cache->GetStats().pinned_bytes, 2ull * kBlock);
  EXPECT_EQ(cache->GetStats().pinned_bytes_by_dataset.at(1), 2ull * kBlock);
  // Hot newcomers: only the unpinned blocks can make room.
  for (uint64_t i = 10; i < 20; i++) {
    for (int k = 0; k < 5; k++) cache->Acquire({2, 1, 1, i});
    cache->Insert({2, 1, 1, i}, fsize, i * kBlock, data, 1);
  }
  EXPECT_TRUE(cache->Resident({1, 1, 1, 0}));
  EXPECT_TRUE(cache->Resident({1, 1, 1, 1}));
  EXPECT_FALSE(cache->Resident({1, 1, 1, 2}));
  EXPECT_LE(cache->GetStats().used_bytes, 4ull * kBlock);
  // Pins survive a restart.
  cache.reset();
  cache = OpenCache(dir.path(), 4ull * kBlock);
  EXPECT_EQ(cache->GetStats().pinned_bytes, 2ull * kBlock);
  // After expiry they are ordinary blocks again.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_EQ(cache->GetStats().pinned_bytes, 0u);
  for (uint64_t i = 30; i < 40; i++) {
    for (int k = 0; k < 5; k++) cache->Acquire({3, 1, 1, i});
    cache->Insert({3, 1, 1, i}, fsize, i * kBlock, data, 1);
  }
  EXPECT_FALSE(cache->Resident({1, 1, 1, 0}));
  EXPECT_FALSE(cache->Resident({1, 1, 1, 1}));
}

}  // namespace
}  // namespace ember::cachefs

namespace ember::cachefs {
namespace {

std::string Bytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& c : s) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

size_t CountFiles(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    n += e.is_regular_file();
  }
  return n;
}

// Small files go into segments, packed end to end: no cache file each, their holds point into
// the segment, their bytes read back checked, and all of it survives a restart. A file over the
// limit keeps its own cache file.
TEST(SegmentTest, SmallFilesArePackedAndSurviveARestart) {
  testing::TempDir dir;
  std::vector<std::string> data;
  {
    auto cache = OpenCache(dir.path(), 1ull << 30, 16 << 10);
    for (uint64_t f = 1; f <= 300; f++) {
      data.push_back(Bytes(1000 + f * 37 % 3000, f));
      const std::string& d = data.back();
      ASSERT_EQ(cache->Insert({1, 1, f, 0}, d.size(), 0, d, BlockChecksum(d.data(), d.size())),
                BlockCache::InsertResult::kStored);
    }
    const std::string big = Bytes(20 << 10, 999);
    ASSERT_EQ(
        cache->Insert({1, 1, 1000, 0}, big.size(), 0, big, BlockChecksum(big.data(), big.size())),
        BlockCache::InsertResult::kStored);
    EXPECT_EQ(CountFiles(dir.Sub("segments")), 1u);
    EXPECT_EQ(CountFiles(dir.Sub("blocks")), 1u);  // the big one only
    auto h = cache->Acquire({1, 1, 7, 0});
    ASSERT_TRUE(h);
    EXPECT_NE(h->segment, 0u);
    EXPECT_EQ(ReadHold(*h), data[6]);
    int backing_fd = -1;
    EXPECT_FALSE(cache->OpenBacking({1, 1, 7, 0}, &backing_fd));  // no passthrough for these
    auto hb = cache->Acquire({1, 1, 1000, 0});
    ASSERT_TRUE(hb);
    EXPECT_EQ(hb->segment, 0u);
  }
  auto cache = OpenCache(dir.path(), 1ull << 30, 16 << 10);
  EXPECT_EQ(cache->GetStats().resident_blocks, 301u);
  for (uint64_t f = 1; f <= 300; f++) {
    auto h = cache->Acquire({1, 1, f, 0});
    ASSERT_TRUE(h) << f;
    std::string got(h->length, '\0');
    ASSERT_TRUE(cache->ReadVerified(*h, h->offset, h->length, got.data()).ok()) << f;
    EXPECT_EQ(got, data[f - 1]) << f;
  }
  // Appends after a restart go to a new segment.
  const std::string d = Bytes(500, 5);
  ASSERT_EQ(cache->Insert({1, 1, 5000, 0}, d.size(), 0, d, BlockChecksum(d.data(), d.size())),
            BlockCache::InsertResult::kStored);
  EXPECT_EQ(CountFiles(dir.Sub("segments")), 2u);
}

// A batch (write-behind's): small objects packed end to end in one segment by one write,
// a large block in its own file, a block already resident left as it is; every record in one
// index write, all of it read back checked after a restart.
TEST(SegmentTest, ABatchIsPackedInOrderAndSurvivesARestart) {
  testing::TempDir dir;
  std::vector<std::string> data;
  const std::string big = Bytes(20 << 10, 999);
  {
    auto cache = OpenCache(dir.path(), 1ull << 30, 16 << 10);
    const std::string first = Bytes(700, 1);
    ASSERT_EQ(cache->Insert({1, 1, 1, 0}, first.size(), 0, first,
                            BlockChecksum(first.data(), first.size())),
              BlockCache::InsertResult::kStored);
    for (uint64_t f = 1; f <= 200; f++)
      data.push_back(f == 1 ? first : Bytes(100 + f * 53 % 4000, f));
    std::vector<BlockCache::InsertItem> items;
    for (uint64_t f = 1; f <= 200; f++) {
      const std::string& d = data[f - 1];
      items.push_back({{1, 1, f, 0}, d.size(), 0, d, BlockChecksum(d.data(), d.size())});
      if (f == 100)
        items.push_back(
            {{1, 1, 1000, 0}, big.size(), 0, big, BlockChecksum(big.data(), big.size())});
    }
    std::vector<BlockCache::InsertResult> got = cache->InsertMany(items);
    ASSERT_EQ(got.size(), items.size());
    for (size_t i = 0; i < got.size(); i++)
      EXPECT_EQ(got[i], BlockCache::InsertResult::kStored) << i;
    EXPECT_EQ(CountFiles(dir.Sub("segments")), 1u);
    EXPECT_EQ(CountFiles(dir.Sub("blocks")), 1u);
    // End to end in the order given (the one resident before stays where it was).
    for (uint64_t f = 3; f <= 200; f++) {
      auto prev = cache->Acquire({1, 1, f - 1, 0});
      auto h = cache->Acquire({1, 1, f, 0});
      ASSERT_TRUE(prev && h) << f;
      EXPECT_EQ(h->segment, prev->segment);
      EXPECT_EQ(h->offset, prev->offset + prev->length) << f;
    }
  }
  auto cache = OpenCache(dir.path(), 1ull << 30, 16 << 10);
  EXPECT_EQ(cache->GetStats().resident_blocks, 201u);
  for (uint64_t f = 1; f <= 200; f++) {
    auto h = cache->Acquire({1, 1, f, 0});
    ASSERT_TRUE(h) << f;
    std::string got(h->length, '\0');
    ASSERT_TRUE(cache->ReadVerified(*h, h->offset, h->length, got.data()).ok()) << f;
    EXPECT_EQ(got, data[f - 1]) << f;
  }
  auto hb = cache->Acquire({1, 1, 1000, 0});
  ASSERT_TRUE(hb);
  std::string got(hb->length, '\0');
  ASSERT_TRUE(cache->ReadVerified(*hb, hb->offset, hb->length, got.data()).ok());
  EXPECT_EQ(got, big);
}

// A batch of 64 KiB or more of small objects is a direct run: it starts at a 4 KiB boundary, is
// written past the page cache (O_DIRECT) and keeps the room to the next boundary, so the short
// batches before and after it (through the page cache) share no page with it. Every object
// reads back whole, also after a restart.
TEST(SegmentTest, ALongBatchIsWrittenPastThePageCacheOnPagesOfItsOwn) {
  testing::TempDir dir;
  std::map<uint64_t, std::string> data;
  auto batch = [&](BlockCache& cache, uint64_t first, uint64_t n, size_t base) {
    std::vector<BlockCache::InsertItem> items;
    for (uint64_t f = first; f < first + n; f++) {
      data[f] = Bytes(base + f * 131 % 1500, f);
      const std::string& d = data[f];
      items.push_back({{1, 1, f, 0}, d.size(), 0, d, BlockChecksum(d.data(), d.size())});
    }
    for (auto r : cache.InsertMany(items)) EXPECT_EQ(r, BlockCache::InsertResult::kStored);
  };
  {
    auto cache = OpenCache(dir.path(), 1ull << 30, 64 << 10);
    batch(*cache, 1, 3, 700);     // ~3 KB: through the page cache
    batch(*cache, 10, 30, 3000);  // ~110 KB: a direct run
    batch(*cache, 100, 3, 700);
    auto before = cache->Acquire({1, 1, 3, 0});
    auto first = cache->Acquire({1, 1, 10, 0});
    auto last = cache->Acquire({1, 1, 39, 0});
    auto after = cache->Acquire({1, 1, 100, 0});
    ASSERT_TRUE(before && first && last && after);
    EXPECT_EQ(first->segment, after->segment);
    EXPECT_EQ(first->offset % 4096, 0u);
    EXPECT_GE(first->offset, before->offset + before->length);
    EXPECT_LT(first->offset - (before->offset + before->length), 4096u);
    const uint64_t run_end = last->offset + last->length;
    EXPECT_EQ(after->offset % 4096, 0u);
    EXPECT_GE(after->offset, run_end);
    EXPECT_LT(after->offset - run_end, 4096u);
    std::optional<bool> run = PagesCached(first->fd, first->offset, run_end - first->offset);
    std::optional<bool> short_run = PagesCached(before->fd, before->offset, before->length);
    if (!run.has_value()) GTEST_SKIP() << "no cachestat on this kernel";
    EXPECT_FALSE(*run);
    EXPECT_TRUE(*short_run);
  }
  auto cache = OpenCache(dir.path(), 1ull << 30, 64 << 10);
  EXPECT_EQ(cache->GetStats().resident_blocks, data.size());
  for (const auto& [f, want] : data) {
    auto h = cache->Acquire({1, 1, f, 0});
    ASSERT_TRUE(h) << f;
    std::string got(h->length, '\0');
    ASSERT_TRUE(cache->ReadVerified(*h, h->offset, h->length, got.data()).ok()) << f;
    EXPECT_EQ(got, want) << f;
  }
}

// A byte flipped in one packed object is caught when it is read (quarantined, gone from the
// index) and its neighbours in the segment still read good.
TEST(SegmentTest, ACorruptObjectIsQuarantinedAndItsNeighboursStayGood) {
  testing::TempDir dir;
  auto cache = OpenCache(dir.path(), 1ull << 30, 16 << 10);
  std::vector<std::string> data;
  for (uint64_t f = 1; f <= 3; f++) {
    data.push_back(Bytes(3000, f));
    ASSERT_EQ(
        cache->Insert({1, 1, f, 0}, 3000, 0, data.back(), BlockChecksum(data.back().data(), 3000)),
        BlockCache::InsertResult::kStored);
  }
  uint64_t offset;
  std::string path;
  {
    auto h = cache->Acquire({1, 1, 2, 0});
    ASSERT_TRUE(h);
    offset = h->offset;
    path = cache->PathOf({1, 1, 2, 0});
  }
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c;
  ASSERT_EQ(pread(fd, &c, 1, static_cast<off_t>(offset + 100)), 1);
  c = static_cast<char>(c ^ 1);
  ASSERT_EQ(pwrite(fd, &c, 1, static_cast<off_t>(offset + 100)), 1);
  close(fd);
  for (uint64_t f : {1, 2, 3}) {
    auto h = cache->Acquire({1, 1, f, 0});
    ASSERT_TRUE(h);
    std::string got(h->length, '\0');
    absl::Status st = cache->ReadVerified(*h, h->offset, h->length, got.data());
    if (f == 2) {
      EXPECT_TRUE(absl::IsDataLoss(st)) << st;
    } else {
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(got, data[f - 1]);
    }
  }
  EXPECT_FALSE(cache->Resident({1, 1, 2, 0}));
  EXPECT_EQ(cache->GetStats().checksum_failures, 1u);
  // The scrubber reads packed objects from the disk too (unaligned, past the page cache).
  EXPECT_EQ(cache->ScrubBlock({1, 1, 3, 0}), BlockCache::ScrubResult::kGood);
}

// Objects that leave free their space (punched), a segment nothing lives in is deleted once
// appends have moved past it, and one left behind by a crash is deleted at the next start.
TEST(SegmentTest, EmptySegmentsAreDeleted) {
  testing::TempDir dir;
  const size_t kObj = 256 << 10;
  const uint64_t per_segment = CacheFiles::kSegmentBytes / kObj;
  {
    auto cache = OpenCache(dir.path(), 1ull << 30, kObj);
    const std::string d = Bytes(kObj, 1);
    const uint64_t sum = BlockChecksum(d.data(), d.size());
    for (uint64_t f = 1; f <= per_segment + 2; f++) {
      ASSERT_EQ(cache->Insert({1, 1, f, 0}, kObj, 0, d, sum), BlockCache::InsertResult::kStored);
    }
    EXPECT_EQ(CountFiles(dir.Sub("segments")), 2u);
    const std::string first = cache->PathOf({1, 1, 1, 0});
    for (uint64_t f = 2; f <= per_segment; f++) ASSERT_TRUE(cache->Drop({1, 1, f, 0}));
    struct stat st;
    ASSERT_EQ(stat(first.c_str(), &st), 0);
    EXPECT_LT(st.st_blocks * 512, 2 * kObj);  // punched: only object 1's pages stay allocated
    ASSERT_TRUE(cache->Drop({1, 1, 1, 0}));
    EXPECT_NE(stat(first.c_str(), &st), 0);  // empty and not active: deleted
    EXPECT_EQ(CountFiles(dir.Sub("segments")), 1u);
    // The active segment emptied stays (appends go on into it) ...
    for (uint64_t f = per_segment + 1; f <= per_segment + 2; f++) {
      ASSERT_TRUE(cache->Drop({1, 1, f, 0}));
    }
    EXPECT_EQ(CountFiles(dir.Sub("segments")), 1u);
  }
  // ... and goes at the next start, nothing in the index referring to it.
  auto cache = OpenCache(dir.path(), 1ull << 30, kObj);
  EXPECT_EQ(CountFiles(dir.Sub("segments")), 0u);
}

// A block given twice in one PutMany batch keeps its last record, whatever order the batch's
// blocks came in (a batch sorted by key would have to keep it so).
TEST(BlockIndexTest, ABatchKeepsTheLastRecordOfABlockGivenTwice) {
  testing::TempDir dir;
  {
    auto index = BlockIndex::Open(dir.path());
    ASSERT_TRUE(index.ok()) << index.status();
    std::vector<IndexRecord> batch;
    for (int round = 0; round < 2; round++) {
      for (uint64_t i = 0; i < 300; i++) {
        const uint64_t file = 1 + (i * 7919) % 300;  // shuffled
        batch.push_back({{1, 1, file, 0}, round == 0 ? file + 1000 : file, 0, 100, 0, 0});
      }
    }
    ASSERT_TRUE((*index)->PutMany(batch).ok());
  }
  auto index = BlockIndex::Open(dir.path());
  ASSERT_TRUE(index.ok()) << index.status();
  size_t seen = 0;
  uint64_t last_file = 0;
  (*index)->Load([&](const IndexRecord& r) {
    seen++;
    EXPECT_GT(r.addr.file_id, last_file);  // in key order, each block once
    last_file = r.addr.file_id;
    EXPECT_EQ(r.checksum, r.addr.file_id) << "file " << r.addr.file_id;
    return true;
  });
  EXPECT_EQ(seen, 300u);
}

}  // namespace
}  // namespace ember::cachefs
