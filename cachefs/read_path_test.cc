#include "cachefs/read_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <thread>

#include "tests/testing/testing.h"

namespace ember::cachefs {
namespace {

constexpr uint64_t kBlock = 64 << 10;

// An origin in memory that counts reads and can be slowed down or broken.
class FakeOrigin : public origin::Origin {
 public:
  absl::StatusOr<origin::WalkStats> Walk(const std::string& root, const origin::EntryFn& fn,
                                         const origin::ListProgress& progress) override {
    return absl::UnimplementedError("the read path never walks");
  }
  absl::Status Read(const origin::OriginFile& f, uint64_t offset, size_t len, char* buf) override {
    reads++;
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    auto it = files.find(f.path);
    if (it == files.end()) return absl::NotFoundError("gone: " + f.path);
    if (it->second.size() != f.size) return absl::FailedPreconditionError("changed: " + f.path);
    std::memcpy(buf, it->second.data() + offset, len);
    return absl::OkStatus();
  }
  std::map<std::string, std::string> files;
  std::atomic<int> reads{0};
  int delay_ms = 0;
};

std::string Gather(const ReadResult& r) {
  std::string out;
  for (const auto& s : r.segments) {
    if (s.fd >= 0) {
      std::string part(s.len, '\0');
      EXPECT_EQ(pread(s.fd, part.data(), s.len, static_cast<off_t>(s.pos)),
                static_cast<ssize_t>(s.len));
      out += part;
    } else {
      out += s.mem->view().substr(s.mem_off, s.len);
    }
  }
  return out;
}

class ReadPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    content_.resize(5 * kBlock + 123);
    for (size_t i = 0; i < content_.size(); i++) content_[i] = static_cast<char>(i * 7 + i / 977);
    origin_.files["d/f.bin"] = content_;
    Open();
  }
  void Open() {
    read_path_.reset();
    cache_.reset();
    BlockCache::Options o;
    o.dir = dir_.path();
    o.capacity_bytes = 100 * kBlock;
    o.expected_block_size = kBlock;
    cache_ = std::move(*BlockCache::Open(o));
    read_path_ = std::make_unique<ReadPath>(cache_.get(), &origin_, nullptr, ReadPath::Options{});
  }
  FileRef Ref() {
    FileRef r;
    r.dataset_id = 1;
    r.version = 1;
    r.file_id = 4;
    r.block_size = kBlock;
    r.origin = {"/origin", "d/f.bin", content_.size(), 0};
    r.dataset_name = "ds";
    return r;
  }

  testing::TempDir dir_;
  std::string content_;
  FakeOrigin origin_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<ReadPath> read_path_;
};

TEST_F(ReadPathTest, RangesAcrossBlocksAreExact) {
  for (auto [off, len] : std::vector<std::pair<uint64_t, size_t>>{{0, 10},
                                                                  {kBlock - 1, 2},
                                                                  {kBlock, kBlock},
                                                                  {3 * kBlock - 5, 2 * kBlock + 10},
                                                                  {5 * kBlock, 1000},
                                                                  {5 * kBlock + 122, 10},
                                                                  {content_.size(), 10},
                                                                  {0, 1 << 30}}) {
    auto r = read_path_->Read(Ref(), off, len);
    ASSERT_TRUE(r.ok()) << r.status();
    std::string want = off >= content_.size() ? "" : content_.substr(off, len);
    EXPECT_EQ(Gather(*r), want) << off << "+" << len;
    EXPECT_EQ(r->total, want.size());
  }
  EXPECT_EQ(origin_.reads, 6);  // every block filled once
  auto s = read_path_->GetStats();
  EXPECT_EQ(s.misses, 6u);
  EXPECT_EQ(s.origin_block_reads, 6u);
}

TEST_F(ReadPathTest, ConcurrentReadersFillEachBlockOnce) {
  origin_.delay_ms = 20;
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 16; t++) {
    readers.emplace_back([&] {
      for (uint64_t off = 0; off < content_.size(); off += 8192) {
        auto r = read_path_->Read(Ref(), off, 8192);
        if (!r.ok() || Gather(*r) != content_.substr(off, 8192)) wrong++;
      }
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(origin_.reads, 6);
}

TEST_F(ReadPathTest, CorruptCacheBlockIsDetectedAndRefetched) {
  ASSERT_TRUE(read_path_->Read(Ref(), 0, content_.size()).ok());
  std::string path = cache_->FilePath({1, 1, 4, 2});
  Open();  // a restart: blocks are verified once on first use
  int fd = open(path.c_str(), O_WRONLY);
  char c = static_cast<char>(content_[2 * kBlock + 17] ^ 0x20);
  ASSERT_EQ(pwrite(fd, &c, 1, 2 * kBlock + 17), 1);
  close(fd);
  int before = origin_.reads;
  auto r = read_path_->Read(Ref(), 0, content_.size());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Gather(*r), content_);
  EXPECT_EQ(origin_.reads, before + 1);  // only the corrupt block came again
  EXPECT_EQ(read_path_->GetStats().checksum_failures, 1u);
  EXPECT_GE(read_path_->GetStats().hits, 5u);
}

TEST_F(ReadPathTest, OriginErrorsAreErrorsNotBytes) {
  origin_.files.erase("d/f.bin");
  auto r = read_path_->Read(Ref(), 0, 100);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  origin_.files["d/f.bin"] = content_ + "grown";
  r = read_path_->Read(Ref(), 0, 100);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ReadPathTest, ReadaheadFillsTheNextBlocks) {
  read_path_->Readahead(Ref(), 1, 3);
  EXPECT_TRUE(testing::WaitFor([&] { return cache_->Resident({1, 1, 4, 3}); }));
  EXPECT_TRUE(cache_->Resident({1, 1, 4, 1}));
  EXPECT_FALSE(cache_->Resident({1, 1, 4, 4}));
}

}  // namespace
}  // namespace ember::cachefs
