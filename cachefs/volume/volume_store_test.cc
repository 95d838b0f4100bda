#include "cachefs/volume/volume_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

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

}  // namespace
}  // namespace ember::cachefs
