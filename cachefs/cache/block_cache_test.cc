#include "cachefs/cache/block_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "cachefs/cache/block_buffer.h"
#include "tests/testing/testing.h"

namespace ember::cachefs {
namespace {

constexpr uint32_t kBlock = 64 << 10;

std::unique_ptr<BlockCache> OpenCache(const std::string& dir, uint64_t capacity) {
  BlockCache::Options o;
  o.dir = dir;
  o.capacity_bytes = capacity;
  o.expected_block_size = kBlock;
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

// Direct (O_DIRECT) and buffered writes store the same bytes: from an aligned BlockBuffer, from
// unaligned memory (written buffered), with an unaligned tail; the bytes read back right through
// the page cache afterwards, and a buffered read before the write does not leave stale zeros.
TEST(BlockCacheTest, DirectAndBufferedWritesStoreTheSameBytes) {
  for (bool direct : {true, false}) {
    testing::TempDir dir;
    BlockCache::Options o;
    o.dir = dir.path();
    o.capacity_bytes = 64ull * kBlock;
    o.expected_block_size = kBlock;
    o.direct_writes = direct;
    auto cache = std::move(*BlockCache::Open(o));
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
    EXPECT_TRUE(hold->verified);
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
  EXPECT_FALSE(hold->verified);  // verified once per load
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

// The cache owns whether its bytes are verified: blocks it stored are trusted, blocks loaded
// from the index are checked once, when first held, and a bad copy is dropped (and counted).
TEST(BlockCacheTest, LoadedBlocksAreVerifiedOnceAndBadOnesDropped) {
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
    auto hold = cache->Acquire({1, 1, 2, 0});
    EXPECT_TRUE(hold->verified);  // stored by this agent: its fill checked the bytes
  }
  {  // Damage block 1 on disk while no agent runs.
    int fd = open((dir.path() + "/blocks/1/1/2").c_str(), O_WRONLY);
    ASSERT_EQ(pwrite(fd, "x", 1, kBlock + 5), 1);
    close(fd);
  }
  auto cache = OpenCache(dir.path(), 10ull * kBlock);
  auto hold = cache->Acquire({1, 1, 2, 0});
  ASSERT_NE(hold, nullptr);
  EXPECT_FALSE(hold->verified);
  EXPECT_TRUE(cache->VerifyOnce(*hold));
  EXPECT_TRUE(cache->Acquire({1, 1, 2, 0})->verified);  // checked once, not again
  auto damaged = cache->Acquire({1, 1, 2, 1});
  ASSERT_NE(damaged, nullptr);
  EXPECT_FALSE(cache->VerifyOnce(*damaged));
  EXPECT_FALSE(cache->Resident({1, 1, 2, 1}));
  EXPECT_FALSE(cache->VerifyOnce(*damaged));  // a second reader of the same copy: counted once
  EXPECT_EQ(cache->GetStats().checksum_failures, 1u);
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
