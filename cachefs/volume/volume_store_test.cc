#include "cachefs/volume/volume_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "common/ids.h"
#include "common/status.h"
#include "tests/testing/testing.h"

namespace ember::cachefs {
namespace {

constexpr uint64_t kBlock = 4096;

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

int Write(VolumeStore& store, uint64_t id, const std::string& data) {
  auto fd = store.CreateStaging(3, id);
  EXPECT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(pwrite(*fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  return *fd;
}

TEST(VolumeStoreTest, SealedContentsOpenWithTheirChecksumsAndADamagedBlockIsFound) {
  ember::testing::TempDir dir;
  VolumeStore store(dir.Sub("v"));
  const std::string data = Bytes(2 * kBlock + 100, 'a');
  int fd = Write(store, 7, data);
  EXPECT_FALSE(store.Open(3, 7).ok());  // staging: not whole yet
  auto sums = store.Seal(3, 7, fd, kBlock);
  close(fd);
  ASSERT_TRUE(sums.ok()) << sums.status();
  ASSERT_EQ(sums->size(), 3u);
  EXPECT_EQ((*sums)[2], BlockChecksum(data.data() + 2 * kBlock, 100));
  auto whole = store.Open(3, 7);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ((*whole)->size, data.size());
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(store.CheckBlock(**whole, 3, 7, i).ok());
  auto block = store.GetBlock(BlockAddr{3, 1, 7, 1});
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->offset, kBlock);
  EXPECT_EQ(block->checksum, (*sums)[1]);
  EXPECT_FALSE(store.GetBlock(BlockAddr{3, 1, 7, 3}).has_value());

  // A byte changed on disk: the block fails its check and the copy is no longer whole.
  int w = open(store.PathOf(3, 7).c_str(), O_WRONLY);
  ASSERT_EQ(pwrite(w, "!", 1, kBlock + 5), 1);
  close(w);
  EXPECT_EQ(store.CheckBlock(**whole, 3, 7, 1).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(store.Open(3, 7).ok());
}

TEST(VolumeStoreTest, ACopyTakesOnlyBytesThatMatchAndARestartClearsWhatWasLeftHalfway) {
  ember::testing::TempDir dir;
  const std::string data = Bytes(3 * kBlock, 'q');
  std::vector<uint64_t> sums;
  for (int i = 0; i < 3; ++i) sums.push_back(BlockChecksum(data.data() + i * kBlock, kBlock));
  {
    VolumeStore store(dir.Sub("v"));
    int calls = 0;
    auto good = [&](std::vector<VolumeStore::Piece>& pieces) {
      ++calls;
      for (auto& p : pieces) std::memcpy(p.buf, data.data() + p.index * kBlock, p.len);
      return absl::OkStatus();
    };
    auto bad = [&](std::vector<VolumeStore::Piece>& pieces) {
      for (auto& p : pieces) std::memset(p.buf, 'x', p.len);
      return absl::OkStatus();
    };
    EXPECT_EQ(store.Fetch(3, 9, data.size(), kBlock, sums, bad).status().code(),
              absl::StatusCode::kDataLoss);
    EXPECT_FALSE(std::filesystem::exists(store.PathOf(3, 9)));  // nothing half-made stays
    auto whole = store.Fetch(3, 9, data.size(), kBlock, sums, good);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_TRUE((*whole)->verified);
    EXPECT_EQ(ember::testing::ReadFile(store.PathOf(3, 9)), data);
    EXPECT_TRUE(store.Fetch(3, 9, data.size(), kBlock, sums, good).ok());
    EXPECT_EQ(calls, 1);  // the second found the first's copy
    close(Write(store, 10, "staged, never sealed"));
  }
  ember::testing::WriteFile(dir.Sub("v/3/11.sums.tmp"), "half");
  VolumeStore again(dir.Sub("v"));
  EXPECT_TRUE(again.Open(3, 9).ok());
  EXPECT_FALSE(std::filesystem::exists(again.PathOf(3, 10)));
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("v/3/11.sums.tmp")));
}

// Seals `data` as contents `id` of volume 3, its seal dated `age_s` seconds ago.
void Sealed(VolumeStore& store, uint64_t id, const std::string& data, int age_s = 0) {
  ASSERT_TRUE(store.Reserve(data.size()).ok());
  int fd = Write(store, id, data);
  ASSERT_TRUE(store.Seal(3, id, fd, kBlock).ok());
  close(fd);
  if (age_s > 0) {
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= age_s;
    t[1] = t[0];
    ASSERT_EQ(utimensat(AT_FDCWD, (store.PathOf(3, id) + ".sums").c_str(), t, 0), 0);
  }
}

TEST(VolumeStoreTest, BlocksOfACopyInProgressAreServedOnceInAndItsProgressIsKnown) {
  ember::testing::TempDir dir;
  VolumeStore store(dir.Sub("v"));
  constexpr uint64_t kBig = 1 << 20;  // 32 blocks a batch
  const std::string data = Bytes(40 * kBig - 5, 'c');
  std::vector<uint64_t> sums;
  for (uint64_t off = 0; off < data.size(); off += kBig) {
    sums.push_back(BlockChecksum(data.data() + off, std::min<uint64_t>(kBig, data.size() - off)));
  }
  std::promise<void> second_asked, go_on;
  std::shared_future<void> resume = go_on.get_future().share();
  auto reader = [&](std::vector<VolumeStore::Piece>& pieces) {
    if (pieces.front().index > 0) {  // the second batch waits until the test has looked
      second_asked.set_value();
      resume.wait();
    }
    for (auto& p : pieces) std::memcpy(p.buf, data.data() + p.index * kBig, p.len);
    return absl::OkStatus();
  };
  EXPECT_FALSE(store.CopyProgress(3, 9).has_value());
  absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> result;
  std::thread copy([&] { result = store.Fetch(3, 9, data.size(), kBig, sums, reader); });
  second_asked.get_future().wait();
  ASSERT_TRUE(ember::testing::WaitFor([&] { return store.CopyProgress(3, 9) == 32u; },
                                      std::chrono::seconds(10)));
  // A block in is served (with its checksum and bytes); one not in yet is not.
  auto first = store.GetBlock(BlockAddr{3, 1, 9, 31});
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->checksum, sums[31]);
  std::string got(kBig, '\0');
  ASSERT_EQ(pread(first->whole->fd, got.data(), kBig, static_cast<off_t>(first->offset)),
            static_cast<ssize_t>(kBig));
  EXPECT_TRUE(got == data.substr(31 * kBig, kBig));
  EXPECT_FALSE(store.GetBlock(BlockAddr{3, 1, 9, 32}).has_value());
  go_on.set_value();
  copy.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(store.CopyProgress(3, 9).has_value());
  EXPECT_TRUE(store.GetBlock(BlockAddr{3, 1, 9, 39}).has_value());

  // A copy waiting for room is listed as copying (nothing in), serves nothing, and is unlisted
  // when it fails.
  VolumeStore full(dir.Sub("w"));
  full.SetLimit(data.size(), absl::Seconds(3));
  ASSERT_TRUE(full.Reserve(kBig).ok());  // held by a writer: the copy must wait for room
  absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> failed;
  std::thread waiting([&] { failed = full.Fetch(3, 9, data.size(), kBig, sums, reader); });
  EXPECT_TRUE(ember::testing::WaitFor([&] { return full.CopyProgress(3, 9) == 0u; },
                                      std::chrono::seconds(3)));
  EXPECT_FALSE(full.GetBlock(BlockAddr{3, 1, 9, 0}).has_value());
  waiting.join();
  EXPECT_FALSE(failed.ok());
  EXPECT_FALSE(full.CopyProgress(3, 9).has_value());
}

TEST(VolumeStoreTest, RoomIsMadeOnlyFromContentsInTheOriginOldestFirst) {
  ember::testing::TempDir dir;
  VolumeStore store(dir.Sub("v"));
  store.SetLimit(4 * kBlock, absl::Milliseconds(300));
  Sealed(store, 1, Bytes(kBlock, 'a'), /*age_s=*/30);
  Sealed(store, 2, Bytes(kBlock, 'b'), /*age_s=*/20);
  Sealed(store, 3, Bytes(2 * kBlock, 'c'));
  EXPECT_EQ(store.Used(), 4 * kBlock);
  // Nothing is in the origin: no room, after the wait.
  absl::Status full = store.Reserve(kBlock);
  EXPECT_EQ(CarriedErrno(full), ENOSPC) << full;
  EXPECT_NE(full.message().find("not yet in the origin"), std::string::npos) << full;
  // 1 and 3 uploaded: 1, the older, goes first; 3 is kept while 1 makes the room.
  store.SetEvictable({{3, 1}, {3, 3}});
  EXPECT_TRUE(store.Reserve(kBlock).ok());
  EXPECT_FALSE(store.Open(3, 1).ok());
  EXPECT_TRUE(store.Open(3, 2).ok());
  EXPECT_TRUE(store.Open(3, 3).ok());
  // A writer waiting for room goes on when contents become droppable meanwhile.
  store.SetEvictable({});
  store.SetLimit(4 * kBlock, absl::Seconds(20));
  std::thread later([&] {
    usleep(200'000);
    store.SetEvictable({{3, 2}});
  });
  EXPECT_TRUE(store.Reserve(kBlock).ok());
  later.join();
  EXPECT_FALSE(store.Open(3, 2).ok());
  EXPECT_TRUE(store.Open(3, 3).ok());  // no longer in the set given: kept
  EXPECT_EQ(store.Used(), 4 * kBlock);
}

TEST(VolumeStoreTest, ContentsNoFileNamesAreDroppedOnceTheyAreOldNeverStagingOrLiveOnes) {
  ember::testing::TempDir dir;
  VolumeStore store(dir.Sub("v"));
  Sealed(store, 1, Bytes(kBlock, 'a'), /*age_s=*/600);  // replaced long ago
  Sealed(store, 2, Bytes(kBlock, 'b'), /*age_s=*/600);  // a file's contents
  Sealed(store, 3, Bytes(kBlock, 'c'));                 // a replica whose commit is coming
  close(Write(store, 4, "a writer's staging"));
  EXPECT_EQ(store.DropUnreferenced({{3, 2}}, absl::Now() - absl::Minutes(2)), 1);
  EXPECT_FALSE(store.Open(3, 1).ok());
  EXPECT_FALSE(std::filesystem::exists(store.PathOf(3, 1)));
  EXPECT_TRUE(store.Open(3, 2).ok());
  EXPECT_TRUE(store.Open(3, 3).ok());
  EXPECT_TRUE(std::filesystem::exists(store.PathOf(3, 4)));
}

TEST(VolumeStoreTest, BlocksCopiedAheadAreNotAskedForAgainUnlessTheCommitNamesOtherBytes) {
  ember::testing::TempDir dir;
  VolumeStore store(dir.Sub("v"));
  std::string data = Bytes(4 * kBlock + 10, 'p');
  std::vector<uint64_t> asked;
  auto reader = [&](const std::string& from) {
    return [&asked, from](std::vector<VolumeStore::Piece>& pieces) {
      for (auto& p : pieces) {
        asked.push_back(p.index);
        std::memcpy(p.buf, from.data() + p.index * kBlock, p.len);
      }
      return absl::OkStatus();
    };
  };
  auto sums_of = [](const std::string& d, uint64_t first, uint64_t n) {
    std::vector<uint64_t> out;
    for (uint64_t i = first; i < first + n; ++i) {
      out.push_back(
          BlockChecksum(d.data() + i * kBlock, std::min<size_t>(kBlock, d.size() - i * kBlock)));
    }
    return out;
  };
  // Blocks 0-1, then 2-3, copied while the writer writes; a batch whose bytes do not match what
  // was offered is refused and leaves nothing behind.
  ASSERT_TRUE(store.Precopy(3, 9, kBlock, 0, sums_of(data, 0, 2), reader(data)).ok());
  std::string garbage = data;
  garbage[2 * kBlock + 1] ^= 1;
  EXPECT_EQ(store.Precopy(3, 9, kBlock, 2, sums_of(data, 2, 2), reader(garbage)).code(),
            absl::StatusCode::kDataLoss);
  ASSERT_TRUE(store.Precopy(3, 9, kBlock, 2, sums_of(data, 2, 2), reader(data)).ok());
  EXPECT_EQ(asked, (std::vector<uint64_t>{0, 1, 2, 3, 2, 3}));
  EXPECT_FALSE(store.Open(3, 9).ok());  // not whole before its commit
  // The writer then rewrote block 1: the commit's copy asks for it and the tail only.
  data[kBlock + 3] ^= 0x55;
  asked.clear();
  auto whole = store.Fetch(3, 9, data.size(), kBlock, sums_of(data, 0, 5), reader(data));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(asked, (std::vector<uint64_t>{1, 4}));
  for (uint64_t i = 0; i < 5; ++i) EXPECT_TRUE(store.CheckBlock(**whole, 3, 9, i).ok()) << i;
  EXPECT_EQ(store.Used(), data.size());

  // A copy ahead no commit came for is dropped once stale and no file names it.
  ASSERT_TRUE(store.Precopy(3, 11, kBlock, 0, sums_of(data, 0, 2), reader(data)).ok());
  EXPECT_EQ(store.DropUnreferenced({{3, 9}, {3, 11}}, absl::Now() + absl::Minutes(1), {{3, 11}}),
            0);  // still being written
  EXPECT_EQ(store.DropUnreferenced({{3, 9}}, absl::Now() - absl::Minutes(1)), 0);  // fresh
  // Named by a committed file but not taken by its commit (another node was): of no use.
  EXPECT_EQ(store.DropUnreferenced({{3, 9}, {3, 11}}, absl::Now() + absl::Minutes(1)), 1);
  EXPECT_FALSE(std::filesystem::exists(store.PathOf(3, 11)));
  EXPECT_EQ(store.Used(), data.size());
  // A copy ahead whose reader failed holds room for blocks it never wrote: dropping it gives
  // all of it back.
  auto failing = [](std::vector<VolumeStore::Piece>&) { return absl::UnavailableError("gone"); };
  EXPECT_FALSE(store.Precopy(3, 13, kBlock, 0, sums_of(data, 0, 4), failing).ok());
  EXPECT_EQ(store.Used(), data.size() + 4 * kBlock);
  EXPECT_EQ(store.DropUnreferenced({{3, 9}}, absl::Now() + absl::Minutes(1)), 1);
  EXPECT_EQ(store.Used(), data.size());
}

}  // namespace
}  // namespace ember::cachefs
