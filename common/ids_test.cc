#include "common/ids.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <set>
#include <string>

namespace ember {
namespace {

TEST(BlockIdTest, DeterministicAndDistinct) {
  BlockAddr a{1, 1, 7, 0};
  EXPECT_EQ(MakeBlockId(a), MakeBlockId(a));
  std::set<std::string> seen;
  for (uint32_t ds = 1; ds <= 3; ds++)
    for (uint32_t v = 1; v <= 3; v++)
      for (uint64_t f = 1; f <= 3; f++)
        for (uint64_t i = 0; i < 3; i++) seen.insert(MakeBlockId({ds, v, f, i}).ToHex());
  EXPECT_EQ(seen.size(), 81u);
  EXPECT_EQ(MakeBlockId(a).ToHex().size(), 32u);
  // Swapping fields must not collide (the packing keeps them apart).
  EXPECT_NE(MakeBlockId({1, 2, 3, 4}), MakeBlockId({2, 1, 3, 4}));
  EXPECT_NE(MakeBlockId({1, 2, 3, 4}), MakeBlockId({1, 2, 4, 3}));
}

TEST(BlockIdTest, ChecksumDetectsFlip) {
  std::string data(4096, 'x');
  uint64_t c = BlockChecksum(data.data(), data.size());
  data[100] ^= 1;
  EXPECT_NE(c, BlockChecksum(data.data(), data.size()));
}

// Checksums recorded by one build (the library's XXH3) are checked by another (the AVX2 one when
// the CPU has it), and a block arrives whole or in pieces: every way gives the same value.
TEST(BlockIdTest, ChecksumIsTheLibrarysXxh3WholeOrInPieces) {
  std::string data((4u << 20) + 333, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  for (size_t len : {size_t{0}, size_t{1}, size_t{16}, size_t{240}, size_t{241}, size_t{4096},
                     size_t{1} << 20, data.size()}) {
    const uint64_t want = XXH3_64bits(data.data(), len);
    EXPECT_EQ(BlockChecksum(data.data(), len), want) << len;
    BlockChecksummer pieces;
    for (size_t at = 0; at < len; at += 70'001) {
      pieces.Update(data.data() + at, std::min<size_t>(70'001, len - at));
    }
    EXPECT_EQ(pieces.Digest(), want) << len;
  }
}

TEST(DatasetNameTest, Validation) {
  EXPECT_TRUE(ValidateDatasetName("imagenet-1k_v2.0").ok());
  EXPECT_FALSE(ValidateDatasetName("").ok());
  EXPECT_FALSE(ValidateDatasetName(".hidden").ok());
  EXPECT_FALSE(ValidateDatasetName("-x").ok());
  EXPECT_FALSE(ValidateDatasetName("a/b").ok());
  EXPECT_FALSE(ValidateDatasetName("a@1").ok());
  EXPECT_FALSE(ValidateDatasetName("with space").ok());
  EXPECT_FALSE(ValidateDatasetName(std::string(65, 'a')).ok());
  EXPECT_TRUE(ValidateDatasetName(std::string(64, 'a')).ok());
}

TEST(BlockSizeTest, Validation) {
  EXPECT_TRUE(ValidateBlockSize(kDefaultBlockSize).ok());
  EXPECT_TRUE(ValidateBlockSize(64 << 10).ok());
  EXPECT_TRUE(ValidateBlockSize(64 << 20).ok());
  EXPECT_FALSE(ValidateBlockSize(32 << 10).ok());
  EXPECT_FALSE(ValidateBlockSize(128 << 20).ok());
  EXPECT_FALSE(ValidateBlockSize(3 << 20).ok());
  EXPECT_FALSE(ValidateBlockSize(0).ok());
}

TEST(ComparePathsTest, PreorderOrder) {
  // Pre-order walk with sorted children visits "a", "a/b", "a-c": '/' sorts before '-'.
  EXPECT_LT(ComparePaths("a", "a/b"), 0);
  EXPECT_LT(ComparePaths("a/b", "a-c"), 0);
  EXPECT_GT(ComparePaths("a-c", "a/zzz"), 0);
  EXPECT_EQ(ComparePaths("x/y", "x/y"), 0);
  EXPECT_LT(ComparePaths("", "a"), 0);
}

}  // namespace
}  // namespace ember
