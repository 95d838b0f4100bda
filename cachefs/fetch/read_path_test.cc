#include "cachefs/fetch/read_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <map>
#include <random>
#include <set>
#include <span>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/fetch/recent_blocks.h"
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
    if (fail_once.erase(f.path) > 0) return absl::UnavailableError("busy: " + f.path);
    auto it = files.find(f.path);
    if (it == files.end()) return absl::NotFoundError("gone: " + f.path);
    if (it->second.size() != f.size) return absl::FailedPreconditionError("changed: " + f.path);
    std::memcpy(buf, it->second.data() + offset, len);
    return absl::OkStatus();
  }
  std::vector<absl::Status> ReadMany(std::span<const ReadRequest> reqs) override {
    batches.push_back(reqs.size());
    in_read_many++;
    if (many_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(many_delay_ms));
    return Origin::ReadMany(reqs);
  }
  bool ReadsManyAtOnce(const std::string&) override { return many_at_once; }
  bool many_at_once = true;
  std::map<std::string, std::string> files;
  std::atomic<int> reads{0};
  int delay_ms = 0;
  std::vector<size_t> batches;  // requests per ReadMany
  std::atomic<int> in_read_many{0};
  int many_delay_ms = 0;
  std::set<std::string> fail_once;  // paths whose next read fails (Unavailable)
};

// Meta's block directory in memory: checksums (first writer wins), one peer that may hold every
// block, and switches to make it unreachable or to hold claims until released.
class FakeDirectory : public BlockDirectory {
 public:
  absl::StatusOr<std::vector<Location>> Locate(const std::vector<BlockAddr>& addrs) override {
    absl::MutexLock lock(&mu_);
    if (!reachable_) return absl::UnavailableError("meta is down");
    std::vector<Location> out;
    for (const auto& a : addrs) {
      Location l;
      if (auto it = checksums_.find(a); it != checksums_.end()) l.checksum = it->second;
      if (auto it = holders_of_.find(a.index); it != holders_of_.end()) {
        l.holders = it->second;
      } else if (peer_holds_) {
        l.holders.push_back({"peer", "peer:1", "", ""});
      }
      l.dataset_unheld = !peer_holds_ && dataset_unheld_;
      out.push_back(l);
    }
    return out;
  }
  absl::StatusOr<std::vector<bool>> RecordChecksums(const std::vector<Claim>& claims) override {
    absl::MutexLock lock(&mu_);
    claims_in_progress_++;
    entered_.emplace_back(std::this_thread::get_id(), claims.size());
    mu_.Await(absl::Condition(this, &FakeDirectory::ClaimsReleased));
    claims_in_progress_--;
    if (!reachable_) return absl::UnavailableError("meta is down");
    batches_.push_back(claims.size());
    std::vector<bool> conflict;
    for (const auto& c : claims) {
      auto [it, fresh] = checksums_.emplace(c.addr, c.checksum);
      conflict.push_back(!fresh && it->second != c.checksum);
    }
    return conflict;
  }
  absl::Status ReportResident(const std::vector<ResidentFile>&) override {
    return absl::OkStatus();
  }
  absl::Status ReportChanges(const std::vector<BlockAddr>&,
                             const std::vector<BlockAddr>&) override {
    return absl::OkStatus();
  }

  void SetChecksum(const BlockAddr& a, uint64_t sum) {
    absl::MutexLock lock(&mu_);
    checksums_[a] = sum;
  }
  std::optional<uint64_t> Checksum(const BlockAddr& a) {
    absl::MutexLock lock(&mu_);
    auto it = checksums_.find(a);
    return it == checksums_.end() ? std::nullopt : std::optional<uint64_t>(it->second);
  }
  void SetReachable(bool r) {
    absl::MutexLock lock(&mu_);
    reachable_ = r;
  }
  void SetPeerHolds(bool h) {
    absl::MutexLock lock(&mu_);
    peer_holds_ = h;
  }
  // Block `index` (of any file) held by these nodes instead.
  void SetHolders(uint64_t index, std::vector<Holder> holders) {
    absl::MutexLock lock(&mu_);
    holders_of_[index] = std::move(holders);
  }
  // Whether blocks nobody holds come back as "nobody holds any block of the version".
  void SetDatasetUnheld(bool u) {
    absl::MutexLock lock(&mu_);
    dataset_unheld_ = u;
  }
  void HoldClaims(bool h) {
    absl::MutexLock lock(&mu_);
    hold_claims_ = h;
  }
  int ClaimsInProgress() {
    absl::MutexLock lock(&mu_);
    return claims_in_progress_;
  }
  std::vector<size_t> Batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  // The size of the first claim call made on thread `t` (as it began), if any.
  std::optional<size_t> FirstBatchOf(std::thread::id t) {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, n] : entered_) {
      if (id == t) return n;
    }
    return std::nullopt;
  }

 private:
  bool ClaimsReleased() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_claims_; }

  absl::Mutex mu_;
  std::map<BlockAddr, uint64_t> checksums_ ABSL_GUARDED_BY(mu_);
  bool reachable_ ABSL_GUARDED_BY(mu_) = true;
  std::map<uint64_t, std::vector<Holder>> holders_of_ ABSL_GUARDED_BY(mu_);
  bool peer_holds_ ABSL_GUARDED_BY(mu_) = false;
  bool dataset_unheld_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_claims_ ABSL_GUARDED_BY(mu_) = false;
  int claims_in_progress_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> batches_ ABSL_GUARDED_BY(mu_);  // claims per RecordChecksums call
  // (thread, claims) of each call as it began
  std::vector<std::pair<std::thread::id, size_t>> entered_ ABSL_GUARDED_BY(mu_);
};

// A peer transport that serves the test's file, or wrong bytes.
class FakeTransport : public transport::BlockTransport {
 public:
  explicit FakeTransport(const std::string* content) : content_(content) {}
  const char* name() const override { return "fake"; }
  absl::Status Fetch(const std::string& peer, const BlockAddr& addr, uint64_t offset,
                     uint32_t length, char* buf, transport::FetchInfo*) override {
    fetches++;
    {
      absl::MutexLock lock(&mu_);
      asked_[addr.index].push_back(peer);
    }
    std::memcpy(buf, content_->data() + addr.index * kBlock + offset, length);
    if (corrupt || static_cast<int64_t>(addr.index) == corrupt_index || peer == bad_peer) {
      buf[0] ^= 1;
    }
    return absl::OkStatus();
  }
  // The peers block `index` was asked of, in turn.
  std::vector<std::string> Asked(uint64_t index) {
    absl::MutexLock lock(&mu_);
    return asked_[index];
  }
  absl::StatusOr<std::string> Call(const std::string&, std::string_view,
                                   std::chrono::milliseconds) override {
    return absl::UnavailableError("no calls in this test");
  }
  std::atomic<int> fetches{0};
  std::atomic<bool> corrupt{false};
  std::atomic<int64_t> corrupt_index{-1};  // only this block's bytes are wrong
  std::string bad_peer;                    // every block from this peer is wrong

 private:
  const std::string* content_;
  absl::Mutex mu_;
  std::map<uint64_t, std::vector<std::string>> asked_ ABSL_GUARDED_BY(mu_);
};

std::string Gather(const ReadResult& r) {
  std::string out;
  for (const auto& s : r.segments) out.append(s.data, s.len);
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
  // (Re)starts the read path over the cache dir; with_peers: misses ask the fake peer first.
  void Open(bool with_peers = false) {
    read_path_.reset();
    peers_.reset();
    cache_.reset();
    BlockCache::Options o;
    o.dir = dir_.path();
    o.capacity_bytes = 100 * kBlock;
    o.expected_block_size = kBlock;
    cache_ = std::move(*BlockCache::Open(o));
    if (with_peers) {
      PeerFetcher::Options po;
      po.self_id = "me";
      peers_ = std::make_unique<PeerFetcher>(&directory_, &transport_, &checksums_, po);
    }
    read_path_ = std::make_unique<ReadPath>(cache_.get(), &origin_, &checksums_,
                                            ReadPath::Options{}, peers_.get());
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
  uint64_t SumOf(uint64_t index) {
    std::string b = content_.substr(index * kBlock, kBlock);
    return BlockChecksum(b.data(), b.size());
  }

  testing::TempDir dir_;
  std::string content_;
  FakeOrigin origin_;
  FakeDirectory directory_;
  FakeTransport transport_{&content_};
  ChecksumBook checksums_{&directory_};
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<PeerFetcher> peers_;
  std::unique_ptr<ReadPath> read_path_;
};

// "Nobody else holds any block of this version" holds only until meta says otherwise, even in an
// answer about blocks nobody holds yet (another block of the version is held elsewhere): a node
// that kept believing it read from the origin what a peer had, and a prefetch's first pass
// skipped asking meta about the rest of its blocks.
TEST_F(ReadPathTest, ADatasetIsUnheldOnlyUntilMetaSaysOtherwise) {
  Open(/*with_peers=*/true);
  const FileRef ref = Ref();
  directory_.SetDatasetUnheld(true);
  ASSERT_TRUE(read_path_->HeldByPeers({ref.Block(0)}).ok());
  EXPECT_TRUE(read_path_->LikelyUnheldByPeers(ref.Block(0)));
  EXPECT_TRUE(read_path_->LikelyUnheldByPeers(ref.Block(3)));  // the whole version
  directory_.SetDatasetUnheld(false);
  auto held = read_path_->HeldByPeers({ref.Block(1)});
  ASSERT_TRUE(held.ok());
  EXPECT_FALSE(held->front());  // block 1 itself is held by nobody
  EXPECT_FALSE(read_path_->LikelyUnheldByPeers(ref.Block(0)));
}

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
  EXPECT_EQ(cache_->GetStats().checksum_failures, 1u);
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

// A folder of 40 small files (one block each) for the batch tests: file i is s/fNN.
class SmallFilesTest : public ReadPathTest {
 protected:
  void SetUp() override {
    ReadPathTest::SetUp();
    for (uint64_t i = 0; i < 40; i++) {
      FileRef r = Ref();
      r.file_id = 100 + i;
      r.origin.path = absl::StrCat("s/f", i);
      std::string body(1000 + i * 37, 'a' + static_cast<char>(i % 26));
      body[0] = static_cast<char>(i);
      r.origin.size = body.size();
      origin_.files[r.origin.path] = body;
      small_.push_back(r);
    }
  }
  // The files after file i, as DatasetFs names them.
  ReadPath::NextSmallFiles Next(uint64_t i) {
    return [this, i](size_t max) {
      std::vector<FileRef> out;
      for (uint64_t k = i + 1; k < small_.size() && out.size() < max; k++) out.push_back(small_[k]);
      return out;
    };
  }
  absl::StatusOr<std::string> ReadSmall(uint64_t i) {
    auto stream = read_path_->OpenStream(small_[i]);
    const ReadPath::NextSmallFiles next = Next(i);
    auto r = read_path_->Read(*stream, 0, 1 << 20, nullptr, &next);
    if (!r.ok()) return r.status();
    return Gather(*r);
  }
  std::vector<FileRef> small_;
};

// A miss on a small file reads the next small files of its folder from the origin in the same
// batch; reading them then reads nothing more, and the batch after the first one starts where
// the reader leaves what was read together.
TEST_F(SmallFilesTest, AMissReadsTheNextSmallFilesInOneOriginBatch) {
  for (uint64_t i = 0; i < small_.size(); i++) {
    auto got = ReadSmall(i);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_EQ(*got, origin_.files[small_[i].origin.path]) << i;
  }
  EXPECT_EQ(origin_.reads, 40);  // each file once
  EXPECT_EQ(origin_.batches,
            (std::vector<size_t>{ReadPath::kSmallBatch, 40 - ReadPath::kSmallBatch}));
  EXPECT_EQ(read_path_->GetStats().misses, 40u);
  // Stored: read again after a restart of the read path, from the cache alone.
  Open();
  const int reads = origin_.reads;
  for (uint64_t i = 0; i < small_.size(); i++) {
    auto got = ReadSmall(i);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_EQ(*got, origin_.files[small_[i].origin.path]) << i;
  }
  EXPECT_EQ(origin_.reads, reads);
}

// A prefetch's own small blocks that no peer holds: read from the origin in one batch, each
// stored after Settled and counted from the origin; a resident one is said to be, without a read;
// a file that cannot be read fails alone; the rate limit hears the batch's bytes once; an origin
// that reads one file after another is read one by one.
TEST_F(SmallFilesTest, OwnBlocksNoPeerHoldsAreReadFromTheOriginInOneBatch) {
  ASSERT_TRUE(ReadSmall(39).ok());  // its batch is itself alone
  ASSERT_TRUE(testing::WaitFor([&] { return cache_->Resident(small_[39].Block(0)); }));
  origin_.batches.clear();
  origin_.files.erase(small_[4].origin.path);
  std::vector<std::pair<const FileRef*, uint64_t>> blocks;
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < 8; i++) {
    blocks.push_back({&small_[i], 0});
    if (i != 4) bytes += small_[i].origin.size;
  }
  blocks.push_back({&small_[39], 0});
  std::vector<uint64_t> limited;
  const auto before_origin = [&](uint64_t n) { limited.push_back(n); };
  auto started = read_path_->StartFromOrigin(blocks, before_origin);
  ASSERT_EQ(started.size(), 9u);
  EXPECT_EQ(origin_.batches, std::vector<size_t>{8});
  EXPECT_EQ(limited, std::vector<uint64_t>{bytes + small_[4].origin.size});
  for (uint64_t i = 0; i < 8; i++) {
    if (i == 4) {
      EXPECT_EQ(started[i].src.status().code(), absl::StatusCode::kNotFound);
      EXPECT_EQ(started[i].fill, nullptr);
      continue;
    }
    ASSERT_TRUE(started[i].src.ok()) << i << ": " << started[i].src.status();
    EXPECT_EQ(*started[i].src, ReadPath::Source::kOrigin) << i;
    ASSERT_NE(started[i].fill, nullptr);
    EXPECT_TRUE(read_path_->Settled(started[i].fill).ok());
    EXPECT_TRUE(cache_->Resident(small_[i].Block(0))) << i;
  }
  ASSERT_TRUE(started[8].src.ok());
  EXPECT_EQ(*started[8].src, ReadPath::Source::kResident);
  EXPECT_FALSE(cache_->Resident(small_[4].Block(0)));
  // Stored as read: after a restart of the read path, read from the cache alone.
  Open();
  const int reads = origin_.reads;
  for (uint64_t i : {0, 3, 7}) {
    auto got = ReadSmall(i);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_EQ(*got, origin_.files[small_[i].origin.path]) << i;
  }
  EXPECT_EQ(origin_.reads, reads);
  // One after another for an origin that reads so.
  origin_.many_at_once = false;
  origin_.batches.clear();
  started = read_path_->StartFromOrigin({{&small_[10], 0}, {&small_[11], 0}}, before_origin);
  EXPECT_TRUE(origin_.batches.empty());
  EXPECT_EQ(origin_.reads, reads + 2);
  for (const auto& s : started) EXPECT_TRUE(s.src.ok()) << s.src.status();
}

// A file of the batch that cannot be read fails alone: the file asked for is served, the others
// too, and the broken one's own read gets its error.
TEST_F(SmallFilesTest, AFileOfTheBatchThatFailsFailsAlone) {
  origin_.files.erase(small_[3].origin.path);
  origin_.files[small_[5].origin.path] += "grown";  // changed since the version was taken
  auto got = ReadSmall(0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(origin_.batches.size(), 1u);
  EXPECT_EQ(ReadSmall(3).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadSmall(5).status().code(), absl::StatusCode::kFailedPrecondition);
  const int reads = origin_.reads;
  for (uint64_t i : {1, 2, 4, 6, 31}) {
    got = ReadSmall(i);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_EQ(*got, origin_.files[small_[i].origin.path]) << i;
  }
  EXPECT_EQ(origin_.reads, reads);
}

// A neighbour that fails in a batch read on another reader's behalf was only a try: a reader of
// it that joined the batch reads it itself, and gets its bytes when the failure was of the
// moment.
TEST_F(SmallFilesTest, AReaderWhoseFileFailedInAnothersBatchReadsItItself) {
  origin_.fail_once.insert(small_[3].origin.path);
  origin_.many_delay_ms = 300;
  std::thread a([&] { EXPECT_TRUE(ReadSmall(0).ok()); });
  ASSERT_TRUE(testing::WaitFor([&] { return origin_.in_read_many > 0; }));
  auto got = ReadSmall(3);  // joins the batch's fill of file 3, which fails
  a.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, origin_.files[small_[3].origin.path]);
  EXPECT_EQ(origin_.batches.size(), 2u);  // file 3 again, with the files after it
}

// The same for a prefetch (MakeResident) that joins such a neighbour's fill: it fills the block
// itself instead of reporting the neighbour's failure as the file's.
TEST_F(SmallFilesTest, APrefetchThatJoinedAFailedNeighbourFillsItItself) {
  origin_.fail_once.insert(small_[3].origin.path);
  origin_.many_delay_ms = 300;
  std::thread a([&] { EXPECT_TRUE(ReadSmall(0).ok()); });
  ASSERT_TRUE(testing::WaitFor([&] { return origin_.in_read_many > 0; }));
  auto src = read_path_->MakeResident(small_[3], 0, FillRoute::kPeersThenOrigin, {});
  a.join();
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(*src, ReadPath::Source::kOrigin);
  EXPECT_TRUE(cache_->Resident(small_[3].Block(0)));
}

// An origin that reads one file after another (S3, HTTP) is not asked for a batch: the file
// asked for would wait for all of them.
TEST_F(SmallFilesTest, AnOriginThatReadsOneAfterAnotherGetsNoBatch) {
  origin_.many_at_once = false;
  for (uint64_t i = 0; i < 3; i++) {
    auto got = ReadSmall(i);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, origin_.files[small_[i].origin.path]);
  }
  EXPECT_EQ(origin_.reads, 3);
  EXPECT_TRUE(origin_.batches.empty());
}

// Where a peer may hold the blocks, a miss takes its own block from the peer, one at a time: the
// origin is read once per cluster, not once per batch of a node.
TEST_F(SmallFilesTest, APeerThatMayHoldTheFilesIsAskedFirstWithoutABatch) {
  Open(/*with_peers=*/true);
  directory_.SetPeerHolds(true);
  content_ = origin_.files[small_[0].origin.path];  // what the fake peer serves for block 0
  directory_.SetChecksum(small_[0].Block(0), BlockChecksum(content_.data(), content_.size()));
  auto got = ReadSmall(0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, content_);
  EXPECT_EQ(transport_.fetches, 1);
  EXPECT_EQ(origin_.reads, 0);
  EXPECT_TRUE(origin_.batches.empty());
}

TEST_F(ReadPathTest, ASequentialReaderGetsTheNextBlocksFilledAhead) {
  auto stream = read_path_->OpenStream(Ref());
  ASSERT_TRUE(read_path_->Read(*stream, 0, 10).ok());
  // The first window (2 blocks) after the block being read.
  EXPECT_TRUE(testing::WaitFor([&] { return cache_->Resident({1, 1, 4, 2}); }));
  for (uint64_t i = 1; i <= 2; i++) EXPECT_TRUE(cache_->Resident({1, 1, 4, i})) << i;
  EXPECT_FALSE(cache_->Resident({1, 1, 4, 3}));
  // Entering a block read ahead doubles the window: the rest of the file follows.
  ASSERT_TRUE(read_path_->Read(*stream, 10, kBlock).ok());
  EXPECT_TRUE(testing::WaitFor([&] { return cache_->Resident({1, 1, 4, 5}); }));
  EXPECT_EQ(stream->window(), 4);
}

// The window of a sequential reader: starts small, doubles at each block read ahead that the
// reader enters, stops at the bound, and starts again after a jump.
TEST(ReadStreamTest, TheWindowGrowsWithASequentialReaderAndStartsAgainAfterAJump) {
  FileRef f;
  f.block_size = kBlock;
  f.origin.size = 1000 * kBlock;
  ReadStream s(f);
  using P = std::pair<uint64_t, int>;
  EXPECT_EQ(s.Advance(0, 10, 2, 16), P(1, 2));
  EXPECT_EQ(s.Advance(10, kBlock - 10, 2, 16), P(0, 0));  // the rest of block 0
  EXPECT_EQ(s.Advance(kBlock, 10, 2, 16), P(3, 3));       // block 1: window 4, to block 6
  EXPECT_EQ(s.Advance(2 * kBlock, 10, 2, 16), P(6, 5));   // window 8
  EXPECT_EQ(s.Advance(3 * kBlock, 10, 2, 16), P(11, 9));  // window 16
  EXPECT_EQ(s.Advance(4 * kBlock, 10, 2, 16), P(20, 1));  // still 16: the bound
  EXPECT_EQ(s.window(), 16);
  // Requests a little out of order are still the same sequential reader.
  EXPECT_EQ(s.Advance(4 * kBlock + 5000, 10, 2, 16), P(0, 0));
  EXPECT_EQ(s.window(), 16);
  // A jump: nothing now, then a small window from there.
  EXPECT_EQ(s.Advance(100 * kBlock, 10, 2, 16), P(0, 0));
  EXPECT_EQ(s.window(), 0);
  EXPECT_EQ(s.Advance(100 * kBlock + 10, 10, 2, 16), P(101, 2));
  EXPECT_EQ(s.window(), 2);
}

// A prefetch's blocks from the origin are what the other nodes want next: those outlive the
// blocks that came from peers (which have another holder); with only origin blocks, the oldest
// leaves.
TEST(RecentBlocksTest, BlocksFromTheOriginOutliveBlocksFromPeers) {
  RecentBlocks recent(3);
  auto block = [](uint64_t i) { return BlockAddr{1, 1, 7, i}; };
  auto buf = std::make_shared<const BlockBuffer>(RecentBlocks::kUnitBytes);
  uint64_t sum = 0;
  recent.Put(block(0), buf, 10, /*from_origin=*/true);
  recent.Put(block(1), buf, 11, /*from_origin=*/false);
  recent.Put(block(2), buf, 12, /*from_origin=*/true);
  recent.Put(block(3), buf, 13, /*from_origin=*/true);  // one must leave: the peer's block 1
  EXPECT_EQ(recent.Peek(block(1), &sum), nullptr);
  ASSERT_NE(recent.Peek(block(0), &sum), nullptr);
  EXPECT_EQ(sum, 10u);
  // The newest block stays (readers are reading it) though it is from a peer: the oldest, 0,
  // leaves.
  recent.Put(block(4), buf, 14, /*from_origin=*/false);
  EXPECT_EQ(recent.Peek(block(0), &sum), nullptr);
  EXPECT_NE(recent.Peek(block(2), &sum), nullptr);
  EXPECT_NE(recent.Peek(block(4), &sum), nullptr);
  recent.Put(block(5), buf, 15, /*from_origin=*/false);  // the peer's 4 leaves before 2 and 3
  EXPECT_EQ(recent.Peek(block(4), &sum), nullptr);
  EXPECT_NE(recent.Peek(block(2), &sum), nullptr);
  EXPECT_NE(recent.Peek(block(3), &sum), nullptr);
  EXPECT_NE(recent.Peek(block(5), &sum), nullptr);
}

// The bound is memory: room for 2 blocks of 4 MiB holds 2 x 4 MiB / kMinCost small blocks (a
// small-file dataset's blocks stay for the peers that want them next), and one big block makes
// room by dropping the oldest small ones.
TEST(RecentBlocksTest, SmallBlocksAreKeptByMemoryNotByCount) {
  constexpr uint64_t kPerUnit = RecentBlocks::kUnitBytes / RecentBlocks::kMinCost;
  constexpr uint64_t kFit = 2 * kPerUnit;
  RecentBlocks recent(2);
  auto block = [](uint64_t i) { return BlockAddr{1, 1, 7, i}; };
  auto small = std::make_shared<const BlockBuffer>(RecentBlocks::kMinCost);
  uint64_t sum = 0;
  for (uint64_t i = 0; i < kFit; i++) recent.Put(block(i), small, i, /*from_origin=*/true);
  EXPECT_NE(recent.Peek(block(0), &sum), nullptr);
  EXPECT_NE(recent.Peek(block(kFit - 1), &sum), nullptr);
  EXPECT_EQ(sum, kFit - 1);
  recent.Put(block(kFit), small, kFit, true);  // over: the oldest goes
  EXPECT_EQ(recent.Peek(block(0), &sum), nullptr);
  EXPECT_NE(recent.Get(block(1)), nullptr);  // now the newest
  auto big = std::make_shared<const BlockBuffer>(RecentBlocks::kUnitBytes);
  recent.Put(block(1 << 20), big, 1000, true);  // 4 MiB: kPerUnit small ones leave, oldest first
  EXPECT_EQ(recent.Peek(block(2), &sum), nullptr);
  EXPECT_EQ(recent.Peek(block(kPerUnit + 1), &sum), nullptr);
  EXPECT_NE(recent.Peek(block(kPerUnit + 2), &sum), nullptr);
  EXPECT_NE(recent.Peek(block(1), &sum), nullptr);  // read last, kept
  EXPECT_NE(recent.Peek(block(1 << 20), &sum), nullptr);
  recent.Erase(block(1 << 20));
  EXPECT_EQ(recent.Peek(block(1 << 20), &sum), nullptr);
  // A tiny file's block counts near its real cost (a 4 KiB-aligned buffer), not as 64 KiB as
  // before: 4 MiB holds 400 blocks of 2.5 KB (before: 64), what peers of a prefetch ask for.
  RecentBlocks one(1);
  auto tiny = std::make_shared<const BlockBuffer>(2500);
  for (uint64_t i = 0; i < 400; i++) one.Put(block(i), tiny, i, /*from_origin=*/true);
  EXPECT_NE(one.Peek(block(0), &sum), nullptr);
}

// Blocks nobody put or read since a moment are dropped on request (the agent asks with each
// heartbeat, for 30 s): a finished prefetch's blocks do not hold memory until other fills push
// them out. A block read since stays, and the bookkeeping stays whole for what follows.
TEST(RecentBlocksTest, BlocksUnusedSinceAMomentCanBeDropped) {
  RecentBlocks recent(2);
  auto block = [](uint64_t i) { return BlockAddr{1, 1, 8, i}; };
  auto small = std::make_shared<const BlockBuffer>(5000);
  for (uint64_t i = 0; i < 3; i++) recent.Put(block(i), small, i, /*from_origin=*/i != 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const auto moment = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_NE(recent.Get(block(1)), nullptr);
  EXPECT_EQ(recent.DropUnusedSince(moment), 2 * 5000u);
  uint64_t sum = 0;
  EXPECT_EQ(recent.Peek(block(0), &sum), nullptr);
  EXPECT_EQ(recent.Peek(block(2), &sum), nullptr);
  EXPECT_NE(recent.Peek(block(1), &sum), nullptr);
  EXPECT_EQ(recent.DropUnusedSince(moment), 0u);
  recent.Put(block(3), small, 3, /*from_origin=*/false);
  EXPECT_EQ(recent.DropUnusedSince(std::chrono::steady_clock::now() + std::chrono::seconds(1)),
            2 * 5000u);
  EXPECT_EQ(recent.Peek(block(1), &sum), nullptr);
  EXPECT_EQ(recent.Peek(block(3), &sum), nullptr);
}

// The constant-time bookkeeping keeps exactly what the rule says, against a plain model of it
// (a list walked on every eviction) over random puts, gets and erases of mixed sizes.
TEST(RecentBlocksTest, KeepsWhatThePlainRuleKeeps) {
  struct Model {
    BlockAddr addr;
    size_t cost;
    bool from_origin;
  };
  const size_t budget = 3 * RecentBlocks::kUnitBytes;
  std::list<Model> model;  // newest first
  auto model_find = [&](const BlockAddr& a) {
    return std::find_if(model.begin(), model.end(), [&](const Model& m) { return m.addr == a; });
  };
  auto model_victim = [&] {
    size_t newest = 0;
    auto boundary = model.begin();
    while (boundary != model.end() && (boundary == model.begin() || newest < budget / 4)) {
      newest += boundary->cost;
      ++boundary;
    }
    for (auto it = model.end(); it != boundary;) {
      --it;
      if (!it->from_origin) return it;
    }
    return std::prev(model.end());
  };
  RecentBlocks recent(3);
  std::mt19937_64 rng(7);
  const size_t sizes[] = {RecentBlocks::kMinCost / 2, 100 << 10, 1 << 20, RecentBlocks::kUnitBytes};
  for (int step = 0; step < 20000; step++) {
    const BlockAddr a{1, 1, 7, rng() % 64};
    const int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      const size_t size = sizes[rng() % 4];
      const bool origin = rng() % 2 == 0;
      recent.Put(a, std::make_shared<const BlockBuffer>(size), 0, origin);
      if (auto it = model_find(a); it != model.end()) model.erase(it);
      model.push_front({a, std::max(size, RecentBlocks::kMinCost), origin});
      size_t cost = 0;
      for (const auto& m : model) cost += m.cost;
      while (cost > budget && model.size() > 1) {
        auto v = model_victim();
        cost -= v->cost;
        model.erase(v);
      }
    } else if (op < 9) {
      const bool got = recent.Get(a) != nullptr;
      auto it = model_find(a);
      ASSERT_EQ(got, it != model.end()) << "step " << step;
      if (it != model.end()) model.splice(model.begin(), model, it);
    } else {
      recent.Erase(a);
      if (auto it = model_find(a); it != model.end()) model.erase(it);
    }
    uint64_t sum;
    for (uint64_t i = 0; i < 64; i++) {
      const BlockAddr b{1, 1, 7, i};
      ASSERT_EQ(recent.Peek(b, &sum) != nullptr, model_find(b) != model.end())
          << "step " << step << " block " << i;
    }
  }
}

TEST_F(ReadPathTest, HoldFileNeedsEveryBlockResident) {
  EXPECT_TRUE(absl::IsNotFound(read_path_->HoldFile(Ref()).status()));
  ASSERT_TRUE(read_path_->Read(Ref(), 0, content_.size()).ok());
  ASSERT_TRUE(testing::WaitFor([&] { return cache_->GetStats().resident_blocks == 6; }));
  auto backing = read_path_->HoldFile(Ref());
  ASSERT_TRUE(backing.ok()) << backing.status();
  std::string got(content_.size(), '\0');
  ASSERT_EQ(pread(backing->fd, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got, content_);  // the cache file is a plain copy of the file
}

// Origin bytes that differ from meta's checksum (learned by a Locate) are refused before anyone
// gets them: the origin changed in place. Nothing is cached or claimed.
TEST_F(ReadPathTest, OriginBytesThatDifferFromMetasChecksumAreRefused) {
  Open(/*with_peers=*/true);
  directory_.SetChecksum({1, 1, 4, 0}, SumOf(0) ^ 1);
  auto r = read_path_->Read(Ref(), 0, 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_EQ(origin_.reads, 1);
  EXPECT_FALSE(cache_->Resident({1, 1, 4, 0}));
  EXPECT_TRUE(directory_.Batches().empty());
  // A block whose checksum matches is served and not claimed again.
  directory_.SetChecksum({1, 1, 4, 1}, SumOf(1));
  ASSERT_TRUE(read_path_->Read(Ref(), kBlock, 10).ok());
  EXPECT_TRUE(testing::WaitFor([&] { return cache_->Resident({1, 1, 4, 1}); }));
  EXPECT_TRUE(directory_.Batches().empty());
}

// Write-behind claims the checksums of all fills queued while a claim is in flight in one call.
TEST_F(ReadPathTest, ClaimsOfQueuedFillsGoInOneBatch) {
  directory_.HoldClaims(true);
  // Each of the two writer threads takes one fill and waits in its claim.
  ASSERT_TRUE(read_path_->Read(Ref(), 0, 10).ok());
  ASSERT_TRUE(testing::WaitFor([&] { return directory_.ClaimsInProgress() == 1; }));
  ASSERT_TRUE(read_path_->Read(Ref(), kBlock, 10).ok());
  ASSERT_TRUE(testing::WaitFor([&] { return directory_.ClaimsInProgress() == 2; }));
  // The readers of the next four blocks are answered meanwhile; their writes queue up.
  for (uint64_t i = 2; i < 6; i++) ASSERT_TRUE(read_path_->Read(Ref(), i * kBlock, 10).ok());
  EXPECT_EQ(cache_->GetStats().resident_blocks, 0u);
  directory_.HoldClaims(false);
  ASSERT_TRUE(testing::WaitFor([&] { return cache_->GetStats().resident_blocks == 6; }));
  // The two held claims, then the four queued fills in one batch (or two, when both writer
  // threads wake at once and share them): never one call per fill.
  // (Batches are recorded as their calls end, in any order.)
  std::vector<size_t> batches = directory_.Batches();
  std::sort(batches.begin(), batches.end());
  ASSERT_GE(batches.size(), 3u);
  EXPECT_LE(batches.size(), 4u);
  EXPECT_EQ(batches[0], 1u);
  EXPECT_EQ(batches[1], 1u);
  EXPECT_GE(batches.back(), 2u);
  size_t total = 0;
  for (size_t b : batches) total += b;
  EXPECT_EQ(total, 6u);
  for (uint64_t i = 0; i < 6; i++) {
    EXPECT_EQ(directory_.Checksum({1, 1, 4, i}),
              BlockChecksum(content_.data() + i * kBlock,
                            std::min(kBlock, content_.size() - i * kBlock)));
  }
}

// When the write-behind queue is full (its writers wait on meta), the fill that finds it full
// stores the oldest queued writes with its own, one claim call for many blocks: before, it stored
// its block alone, and every fill after it made a claim call (and an index and segment write)
// for one block.
TEST_F(ReadPathTest, AFullWriteQueueIsStoredInBatchesNotBlockByBlock) {
  // Small blocks of one file, as many as it takes: both writers wait in their first claims, then
  // the queue (1,024 writes) fills up, then the next fill finds it full.
  constexpr uint64_t kSmall = 4096, kMax = 8192;
  content_.assign(kMax * kSmall, '\0');
  for (uint64_t i = 0; i < kMax; i++) std::memcpy(&content_[i * kSmall], &i, sizeof(i));
  origin_.files["d/f.bin"] = content_;
  FileRef ref = Ref();
  ref.block_size = kSmall;
  ref.origin.size = content_.size();
  directory_.HoldClaims(true);
  std::vector<std::shared_ptr<Fill>> fills;  // the filler's until it is joined
  std::thread filler([&] {
    // Until this thread's own fill has made a claim call (held: it returns once released).
    while (fills.size() < kMax && !directory_.FirstBatchOf(std::this_thread::get_id())) {
      std::shared_ptr<Fill> fill;
      auto src =
          read_path_->StartResident(ref, fills.size(), FillRoute::kPeersThenOrigin, {}, &fill);
      if (!src.ok()) {
        ADD_FAILURE() << src.status();
        return;
      }
      fills.push_back(std::move(fill));
    }
  });
  const std::thread::id filler_id = filler.get_id();
  EXPECT_TRUE(testing::WaitFor([&] { return directory_.FirstBatchOf(filler_id).has_value(); }))
      << directory_.ClaimsInProgress() << " claims waiting";
  directory_.HoldClaims(false);
  filler.join();
  // The fill that found the queue full claimed many blocks at once (the oldest queued and its
  // own), not its own alone.
  EXPECT_GT(directory_.FirstBatchOf(filler_id).value_or(0), 1u);
  for (const auto& f : fills) {
    if (f != nullptr) EXPECT_TRUE(read_path_->Settled(f).ok());
  }
  std::vector<size_t> batches = directory_.Batches();
  size_t total = 0;
  for (size_t b : batches) total += b;
  EXPECT_EQ(total, fills.size());
  ASSERT_FALSE(fills.empty());
  const uint64_t last = fills.size() - 1;
  EXPECT_EQ(directory_.Checksum({1, 1, 4, last}),
            BlockChecksum(content_.data() + last * kSmall, kSmall));
}

// A claim that conflicts with meta's checksum keeps the block out of the cache, and later reads
// (and prefetches) of it fail. The first reader got the origin's bytes: they went out before
// the claim, as an uncached read would have.
TEST_F(ReadPathTest, ConflictingClaimKeepsTheBlockOutAndLaterReadsFail) {
  const BlockAddr a{1, 1, 4, 3};
  directory_.SetChecksum(a, SumOf(3) ^ 1);
  ASSERT_TRUE(read_path_->Read(Ref(), 3 * kBlock, 10).ok());
  // Until the claim is answered, readers get the filled bytes from memory; then none.
  ASSERT_TRUE(testing::WaitFor([&] { return !read_path_->Read(Ref(), 3 * kBlock, 10).ok(); }));
  EXPECT_TRUE(checksums_.Conflicting(a));
  EXPECT_FALSE(cache_->Resident(a));
  auto r = read_path_->Read(Ref(), 3 * kBlock, 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  // A prefetch waits for the cache write, so it sees the conflict of its own fill too.
  directory_.SetChecksum({1, 1, 4, 4}, SumOf(4) ^ 1);
  auto src = read_path_->MakeResident(Ref(), 4, FillRoute::kPeersThenOrigin, {});
  EXPECT_EQ(src.status().code(), absl::StatusCode::kFailedPrecondition) << src.status();
  EXPECT_FALSE(cache_->Resident({1, 1, 4, 4}));
  // Other blocks are unaffected.
  EXPECT_EQ(read_path_->MakeResident(Ref(), 0, FillRoute::kPeersThenOrigin, {}).value(),
            ReadPath::Source::kOrigin);
  EXPECT_EQ(read_path_->MakeResident(Ref(), 0, FillRoute::kPeersThenOrigin, {}).value(),
            ReadPath::Source::kResident);
}

// With meta unreachable the reads go on and the blocks are cached; the claims wait in the book
// and are recorded when it returns. One that conflicts then is dropped from the cache.
TEST_F(ReadPathTest, ClaimsWaitWhileMetaIsAwayAndAreRetried) {
  directory_.SetReachable(false);
  auto r = read_path_->Read(Ref(), 0, content_.size());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Gather(*r), content_);
  ASSERT_TRUE(testing::WaitFor([&] { return cache_->GetStats().resident_blocks == 6; }));
  read_path_->FlushPendingChecksums();  // still away: they wait on
  EXPECT_FALSE(directory_.Checksum({1, 1, 4, 0}));
  directory_.SetReachable(true);
  directory_.SetChecksum({1, 1, 4, 1}, SumOf(1) ^ 1);  // another node claimed first, differently
  read_path_->FlushPendingChecksums();
  EXPECT_EQ(directory_.Checksum({1, 1, 4, 0}), SumOf(0));
  EXPECT_EQ(directory_.Checksum({1, 1, 4, 2}), SumOf(2));
  EXPECT_FALSE(cache_->Resident({1, 1, 4, 1}));
  EXPECT_TRUE(cache_->Resident({1, 1, 4, 2}));
  EXPECT_TRUE(checksums_.Conflicting({1, 1, 4, 1}));
  read_path_->FlushPendingChecksums();  // nothing left
  EXPECT_EQ(directory_.Batches().size(), 1u);
}

// A peer's bytes are used only when they match meta's checksum; else the origin is read.
TEST_F(ReadPathTest, PeerBytesMustMatchMetasChecksum) {
  Open(/*with_peers=*/true);
  directory_.SetPeerHolds(true);
  directory_.SetChecksum({1, 1, 4, 0}, SumOf(0));
  directory_.SetChecksum({1, 1, 4, 1}, SumOf(1));
  auto r = read_path_->Read(Ref(), 0, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Gather(*r), content_.substr(0, 10));
  EXPECT_EQ(origin_.reads, 0);
  EXPECT_EQ(read_path_->GetStats().peer_fetches, 1u);
  transport_.corrupt = true;
  r = read_path_->Read(Ref(), kBlock, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Gather(*r), content_.substr(kBlock, 10));
  EXPECT_EQ(origin_.reads, 1);  // the peer's bytes were refused
  EXPECT_EQ(read_path_->GetStats().peer_errors, 1u);
  // Without meta's checksum a peer cannot be checked: the origin is read and the checksum
  // claimed.
  transport_.corrupt = false;
  ASSERT_TRUE(read_path_->Read(Ref(), 2 * kBlock, 10).ok());
  EXPECT_EQ(origin_.reads, 2);
  EXPECT_TRUE(testing::WaitFor([&] { return directory_.Checksum({1, 1, 4, 2}).has_value(); }));
}

// A prefetch's blocks fetched from peers many at once: those not located lately are located
// first (one call), each block is checked against meta's checksum on its own (a wrong one, or
// one without a checksum known, is refused and reported NotFound, the others are stored), and
// nothing is read from the origin.
TEST_F(ReadPathTest, BlocksFromPeersManyAtOnceAreEachChecked) {
  Open(/*with_peers=*/true);
  directory_.SetPeerHolds(true);
  for (uint64_t i = 0; i < 5; i++) directory_.SetChecksum({1, 1, 4, i}, SumOf(i));  // not 5
  const FileRef ref = Ref();
  std::vector<std::pair<const FileRef*, uint64_t>> blocks;
  for (uint64_t i = 0; i < 6; i++) blocks.push_back({&ref, i});
  transport_.corrupt_index = 2;
  auto started = read_path_->StartFromPeers(blocks);
  ASSERT_EQ(started.size(), 6u);
  for (uint64_t i = 0; i < 6; i++) {
    if (i == 2 || i == 5) {
      EXPECT_EQ(started[i].src.status().code(), absl::StatusCode::kNotFound) << i;
      EXPECT_EQ(started[i].fill, nullptr);
      continue;
    }
    ASSERT_TRUE(started[i].src.ok()) << i << ": " << started[i].src.status();
    EXPECT_EQ(*started[i].src, ReadPath::Source::kPeer);
    ASSERT_NE(started[i].fill, nullptr);
    EXPECT_TRUE(read_path_->Settled(started[i].fill).ok());
    EXPECT_TRUE(cache_->Resident(ref.Block(i))) << i;
  }
  EXPECT_FALSE(cache_->Resident(ref.Block(2)));
  EXPECT_FALSE(cache_->Resident(ref.Block(5)));
  EXPECT_EQ(origin_.reads, 0);
  EXPECT_EQ(read_path_->GetStats().peer_errors, 1u);
  // Resident blocks are said to be, without a fetch.
  const int fetches = transport_.fetches;
  started = read_path_->StartFromPeers({{&ref, 0}});
  ASSERT_TRUE(started[0].src.ok());
  EXPECT_EQ(*started[0].src, ReadPath::Source::kResident);
  EXPECT_EQ(transport_.fetches, fetches);
  // What was stored reads back exactly; the refused blocks come from the origin.
  transport_.corrupt_index = -1;
  auto r = read_path_->Read(ref, 0, content_.size());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Gather(*r), content_);
}

// Blocks of one batch located at different sets of holders (one answer for all) are each asked
// of their own first holder, never of this node, and a block whose first holder sends wrong
// bytes is taken from the next one of its own set.
TEST_F(ReadPathTest, BlocksOfOneBatchGoToTheirOwnHolders) {
  Open(/*with_peers=*/true);
  const BlockDirectory::Holder a{"a", "a:1", "", ""}, b{"b", "b:1", "", ""}, c{"c", "c:1", "", ""},
      me{"me", "me:1", "", ""};
  directory_.SetHolders(0, {a});
  directory_.SetHolders(1, {a});
  directory_.SetHolders(2, {me, b});  // this node is named too (a stale answer): skipped
  directory_.SetHolders(3, {b});
  directory_.SetHolders(4, {c, a});  // c sends wrong bytes: a gives them
  directory_.SetHolders(5, {a});
  transport_.bad_peer = "c:1";
  for (uint64_t i = 0; i < 6; i++) directory_.SetChecksum({1, 1, 4, i}, SumOf(i));
  const FileRef ref = Ref();
  std::vector<std::pair<const FileRef*, uint64_t>> blocks;
  for (uint64_t i = 0; i < 6; i++) blocks.push_back({&ref, i});
  auto started = read_path_->StartFromPeers(blocks);
  ASSERT_EQ(started.size(), 6u);
  for (uint64_t i = 0; i < 6; i++) {
    ASSERT_TRUE(started[i].src.ok()) << i << ": " << started[i].src.status();
    ASSERT_NE(started[i].fill, nullptr) << i;
    EXPECT_TRUE(read_path_->Settled(started[i].fill).ok());
  }
  using V = std::vector<std::string>;
  EXPECT_EQ(transport_.Asked(0), V{"a:1"});
  EXPECT_EQ(transport_.Asked(1), V{"a:1"});
  EXPECT_EQ(transport_.Asked(2), V{"b:1"});
  EXPECT_EQ(transport_.Asked(3), V{"b:1"});
  EXPECT_EQ((V{"c:1", "a:1"}), transport_.Asked(4));
  EXPECT_EQ(transport_.Asked(5), V{"a:1"});
  EXPECT_EQ(origin_.reads, 0);
  auto r = read_path_->Read(ref, 0, content_.size());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Gather(*r), content_);
}

}  // namespace
}  // namespace ember::cachefs
