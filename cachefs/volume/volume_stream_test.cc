#include "cachefs/volume/volume_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/ids.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {

constexpr uint64_t kBlock = 64 << 10;

std::string Bytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  for (char& c : s) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    c = static_cast<char>(seed);
  }
  return s;
}

// A holder in memory: serves `data`'s blocks, or garbage for the blocks in `bad`, or fails
// every batch while `down`; counts the blocks asked of it.
struct FakeHolder {
  std::string data;
  uint64_t block = kBlock;
  std::set<uint64_t> bad;
  std::atomic<bool> down{false};
  std::atomic<int> asked{0};
  VolumeStore::BatchReader Reader() {
    return [this](std::vector<VolumeStore::Piece>& pieces) -> absl::Status {
      if (down) return absl::UnavailableError("connection refused");
      for (auto& p : pieces) {
        asked++;
        std::memcpy(p.buf, data.data() + p.index * block, p.len);
        if (bad.count(p.index) > 0) p.buf[p.len / 2] ^= 1;
      }
      return absl::OkStatus();
    };
  }
};

std::vector<uint64_t> SumsOf(const std::string& data, uint64_t block = kBlock) {
  std::vector<uint64_t> sums;
  for (size_t at = 0; at < data.size(); at += block) {
    sums.push_back(BlockChecksum(data.data() + at, std::min<size_t>(block, data.size() - at)));
  }
  return sums;
}

std::string Gather(const ReadResult& r) {
  std::string out;
  for (const auto& s : r.segments) out.append(s.data, s.len);
  EXPECT_EQ(out.size(), r.total);
  return out;
}

absl::StatusOr<std::string> ReadAt(VolumeStream& s, uint64_t offset, size_t size) {
  ReadResult r;
  absl::Status st = s.Read(offset, size, &r);
  if (!st.ok()) return st;
  return Gather(r);
}

TEST(VolumeStreamTest, ReadsStraightOnAndByJumpsGiveTheHoldersBytesAndStopAtTheEnd) {
  FakeHolder h;
  h.data = Bytes(40 * kBlock + 123, 1);
  VolumeStream s("f", 9, h.data.size(), kBlock, SumsOf(h.data), {{"node a", h.Reader()}});
  std::string got;
  for (uint64_t at = 0; at < h.data.size() + 5000; at += 5000) {
    auto part = ReadAt(s, at, 5000);
    ASSERT_TRUE(part.ok()) << part.status();
    got += *part;
  }
  EXPECT_TRUE(got == h.data);
  for (uint64_t at : {uint64_t{17} * kBlock - 3, uint64_t{2}, uint64_t{39} * kBlock + 7}) {
    auto part = ReadAt(s, at, 3 * kBlock);
    ASSERT_TRUE(part.ok()) << part.status();
    EXPECT_TRUE(*part == h.data.substr(at, 3 * kBlock)) << at;
  }
}

// A closed stream's block buffers serve the next stream's blocks (with that stream's bytes),
// except one a reply still holds.
TEST(VolumeStreamTest, AClosedStreamsBuffersServeTheNextStreamButNotWhileAReplyHoldsOne) {
  const uint64_t block = kBlock + 4096;  // a size of this test's own in the pool
  auto bases = [block](const ReadResult& r, uint64_t offset) {
    std::set<const char*> out;
    for (const auto& seg : r.segments) {
      out.insert(seg.data - offset % block);
      offset += seg.len;
    }
    return out;
  };
  FakeHolder h1, h2;
  h1.data = Bytes(6 * block, 7);
  h2.data = Bytes(6 * block, 8);
  h1.block = h2.block = block;
  std::set<const char*> first;
  ReadResult held;  // block 0 of the first stream, as a reply in flight holds it
  {
    VolumeStream s1("f1", 1, h1.data.size(), block, SumsOf(h1.data, block),
                    {{"node a", h1.Reader()}});
    ASSERT_TRUE(s1.Read(0, block, &held).ok());
    for (uint64_t b = 1; b < 6; ++b) {
      ReadResult r;
      ASSERT_TRUE(s1.Read(b * block, block, &r).ok());
      EXPECT_TRUE(Gather(r) == h1.data.substr(b * block, block));
      first.merge(bases(r, b * block));
    }
  }
  const std::set<const char*> held_base = bases(held, 0);
  VolumeStream s2("f2", 2, h2.data.size(), block, SumsOf(h2.data, block),
                  {{"node a", h2.Reader()}});
  std::set<const char*> second;
  for (uint64_t b = 0; b < 6; ++b) {
    ReadResult r;
    ASSERT_TRUE(s2.Read(b * block, block, &r).ok());
    EXPECT_TRUE(Gather(r) == h2.data.substr(b * block, block)) << b;
    second.merge(bases(r, b * block));
  }
  std::vector<const char*> reused;
  std::set_intersection(first.begin(), first.end(), second.begin(), second.end(),
                        std::back_inserter(reused));
  EXPECT_FALSE(reused.empty()) << "no buffer of the closed stream was used again";
  for (const char* b : held_base) EXPECT_EQ(second.count(b), 0u) << "a held buffer was reused";
  EXPECT_TRUE(Gather(held) == h1.data.substr(0, block));
}

TEST(VolumeStreamTest, BlocksOfHugePagesServeTheirBytes) {
  const uint64_t block = 2u << 20;  // kept in huge pages
  const std::string data = Bytes(3 * block + 5, 7);
  VolumeStream s("f", 9, data.size(), block, SumsOf(data, block),
                 {{"node a", [&](std::vector<VolumeStore::Piece>& pieces) {
                     for (auto& p : pieces)
                       std::memcpy(p.buf, data.data() + p.index * block, p.len);
                     return absl::OkStatus();
                   }}});
  for (int pass = 0; pass < 2; ++pass) {  // the second from buffers of blocks dropped behind
    std::string got;
    for (uint64_t at = 0; at < data.size(); at += 1 << 20) {
      auto part = ReadAt(s, at, 1 << 20);
      ASSERT_TRUE(part.ok()) << part.status();
      got += *part;
    }
    EXPECT_TRUE(got == data) << pass;
  }
}

TEST(VolumeStreamTest, BadBytesFromOneHolderAreTakenFromTheNextAndNeverServed) {
  FakeHolder a, b;
  a.data = b.data = Bytes(6 * kBlock, 2);
  a.bad = {1, 4};
  VolumeStream s("f", 9, a.data.size(), kBlock, SumsOf(a.data),
                 {{"node a", a.Reader()}, {"node b", b.Reader()}});
  auto all = ReadAt(s, 0, a.data.size());
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(*all == a.data);
  EXPECT_EQ(b.asked.load(), 2);  // only the blocks a got wrong
}

TEST(VolumeStreamTest, WithNoGoodSourceTheReadFailsWithEioNamingEachAndTheNextReadAsksAgain) {
  FakeHolder a, b;
  a.data = b.data = Bytes(3 * kBlock, 3);
  a.bad = {1};
  b.down = true;
  VolumeStream s("ckpt.pt", 9, a.data.size(), kBlock, SumsOf(a.data),
                 {{"node a", a.Reader()}, {"the origin", b.Reader()}});
  auto first = ReadAt(s, kBlock + 10, 100);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(CarriedErrno(first.status()), EIO);
  const std::string msg(first.status().message());
  EXPECT_NE(msg.find("ckpt.pt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node a: bytes that do not match"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the origin: connection refused"), std::string::npos) << msg;
  b.down = false;  // back: the next READ of the block asks again
  auto again = ReadAt(s, kBlock + 10, 100);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again == a.data.substr(kBlock + 10, 100));
}

TEST(VolumeStreamTest, AReaderGoingStraightOnIsReadAheadOfButNotWithoutBound) {
  FakeHolder h;
  const uint64_t blocks = (VolumeStream::kAhead + VolumeStream::kBatch) / kBlock + 8;
  h.data = Bytes(blocks * kBlock, 4);
  VolumeStream s("f", 9, h.data.size(), kBlock, SumsOf(h.data), {{"node a", h.Reader()}});
  ASSERT_TRUE(ReadAt(s, 0, 4096).ok());
  // Read ahead: the blocks after the first come without further READs, up to kAhead past the
  // reader...
  const int ahead = 1 + static_cast<int>(VolumeStream::kAhead / kBlock);
  for (int i = 0; i < 5000 && h.asked < ahead; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(h.asked.load(), ahead);
  // ...and no further.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(h.asked.load(), ahead);
  // A jump is read without read ahead.
  const int before = h.asked;
  const uint64_t far = blocks - 3;
  auto part = ReadAt(s, far * kBlock, kBlock);
  ASSERT_TRUE(part.ok());
  EXPECT_TRUE(*part == h.data.substr(far * kBlock, kBlock));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(h.asked.load(), before + 1);
}

TEST(VolumeStreamTest, ReadersAtOnceEachGetTheirBytes) {
  FakeHolder h;
  h.data = Bytes(64 * kBlock + 9, 5);
  VolumeStream s("f", 9, h.data.size(), kBlock, SumsOf(h.data), {{"node a", h.Reader()}});
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      for (uint64_t at = t * 7 * kBlock; at < h.data.size(); at += 3 * kBlock + 11) {
        auto part = ReadAt(s, at, 2 * kBlock);
        if (!part.ok() || *part != h.data.substr(at, 2 * kBlock)) wrong++;
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace ember::cachefs
