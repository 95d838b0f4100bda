// Never a wrong byte from the local cache: real `ember meta` / `ember node` processes and real
// mounts, with bytes flipped in the cache files on disk (as a failing disk or a stray process
// would) and the page cache dropped. Reads get the right bytes (quarantine and refill) or, with
// no source left, EIO; never the flipped bytes. Run for both FUSE bindings, with and without
// passthrough, after restarts and takeovers, with the scrubber, and under concurrent readers.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/cluster.h"
#include "tests/testing/testing.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using testing::MetaProcess;
using testing::NodeProcess;
using testing::ReadFile;
using testing::ReadUncached;
using testing::RunEmber;
using testing::TempDir;
using testing::WaitFor;
using testing::WriteRandomFile;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kLarge = 64 * kMiB;
constexpr uint64_t kSmall = 100'000;

// Drops the page cache of the whole machine (clean pages), so reads of cache files go to the disk.
void DropCaches() {
  sync();
  testing::RunShell("echo 3 > /proc/sys/vm/drop_caches");
}

// Overwrites 4 bytes at `offset` of `path` with their complement, as a stray writer would.
void Flip(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  char b[4];
  ASSERT_EQ(pread(fd, b, 4, static_cast<off_t>(offset)), 4);
  for (char& c : b) c = static_cast<char>(~c);
  ASSERT_EQ(pwrite(fd, b, 4, static_cast<off_t>(offset)), 4);
  fsync(fd);
  close(fd);
}

// The cache file of the dataset file with `size` bytes (the only one that size).
std::string CacheFileOfSize(const std::string& cache_dir, uint64_t size) {
  for (const auto& e : fs::recursive_directory_iterator(cache_dir + "/blocks")) {
    if (e.is_regular_file() && e.file_size() == size) return e.path().string();
  }
  return "";
}

struct Config {
  std::string binding;  // "kernel" or "libfuse"
  bool passthrough;
};

std::string Name(const ::testing::TestParamInfo<Config>& i) {
  return absl::StrCat(i.param.binding, i.param.passthrough ? "Passthrough" : "Daemon");
}

class IntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (drop_caches)";
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), "2s");
    origin_ = dir_.Sub("origin");
    fs::create_directories(origin_);
    WriteRandomFile(origin_ + "/large.bin", kLarge, 11);
    WriteRandomFile(origin_ + "/small.bin", kSmall, 12);
    auto r = RunEmber({"dataset", "add", "ds", origin_, "--meta", meta_->address()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    large_ = ReadFile(origin_ + "/large.bin");
    small_ = ReadFile(origin_ + "/small.bin");
  }
  std::unique_ptr<NodeProcess> StartNode(std::vector<std::string> extra,
                                         const std::string& id = "n1",
                                         const std::string& host = "127.0.0.1") {
    NodeProcess::Options o;
    o.id = id;
    o.listen_host = host;
    // These tests damage cache files: reads and sends must come from them, not from the blocks
    // just filled that the agent keeps in memory, which are kept to a few here (readahead
    // window 4 + 2).
    o.extra_args = {"--recent-blocks", "2", "--readahead", "4"};
    o.extra_args.insert(o.extra_args.end(), extra.begin(), extra.end());
    auto n = std::make_unique<NodeProcess>(dir_.Sub(id), meta_->address(), o);
    EXPECT_TRUE(n->Start());
    return n;
  }
  rpc::NodeStats Settled(NodeProcess& n) {
    return n.SettledStats(meta_->client(), std::chrono::milliseconds(700));
  }
  // Reads both files through the mount and waits until every block is resident. The large file
  // last: the blocks the agent keeps in memory after their fill (a few) are then its last ones,
  // and reads of the small file and the large file's first blocks come from the cache files.
  void Fill(NodeProcess& n) {
    ASSERT_EQ(ReadUncached(n.mount() + "/ds/small.bin"), small_);
    ASSERT_EQ(ReadUncached(n.mount() + "/ds/large.bin"), large_);
    ASSERT_TRUE(WaitFor([&] { return n.Stats(meta_->client()).resident_blocks() == 17; }))
        << n.Stats(meta_->client()).DebugString();
  }

  TempDir dir_;
  std::unique_ptr<MetaProcess> meta_;
  std::string origin_, large_, small_;
};

class FlipTest : public IntegrityTest, public ::testing::WithParamInterface<Config> {};

TEST_P(FlipTest, FlippedBytesAreNeverServed) {
  std::vector<std::string> args = {"--fuse-binding", GetParam().binding, "--scrub-rate", "0"};
  if (!GetParam().passthrough) args.push_back("--no-passthrough");
  auto node = StartNode(args);
  Fill(*node);
  if (GetParam().passthrough && GetParam().binding == "kernel") {
    // Resident and checked by its fill: the next open is passed through (the kernel reads it).
    // Its backing file then lingers after the close (open_files.h): the flip below happens
    // within the linger, and the next open must not reuse it.
    ASSERT_EQ(ReadUncached(node->mount() + "/ds/large.bin"), large_);
    ASSERT_GE(Settled(*node).passthrough_opens(), 1u);
  }
  const std::string large = CacheFileOfSize(node->cache_dir(), kLarge);
  // The small file is packed into a segment with others (no cache file of its own).
  const auto small = testing::CachedCopiesOf(node->cache_dir(), small_);
  ASSERT_FALSE(large.empty());
  ASSERT_EQ(small.size(), 1u);
  ASSERT_NE(small[0].path.find("/segments/"), std::string::npos);
  Flip(large, 5 * kMiB + 123);  // block 1
  Flip(small[0].path, small[0].offset + 1000);
  DropCaches();
  const uint64_t passthrough_before = Settled(*node).passthrough_opens();
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/large.bin"), large_);
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/small.bin"), small_);
  rpc::NodeStats st = Settled(*node);
  EXPECT_EQ(st.checksum_failures(), 2u) << node->Log();
  EXPECT_EQ(st.passthrough_opens(), passthrough_before);  // changed files are not handed over
  EXPECT_EQ(st.corruptions_size(), 2);
  auto status = RunEmber({"status", "--meta", meta_->address()});
  EXPECT_NE(status.out.find("corrupt block on n1"), std::string::npos) << status.out;

  // No source left (the origin moved away): EIO, never the flipped bytes (block 3 of the large
  // file: not among the few blocks kept in memory after a fill).
  fs::rename(origin_, origin_ + ".gone");
  ASSERT_TRUE(WaitFor([&] { return Settled(*node).repairs() >= 2; })) << node->Log();
  Flip(large, 3 * 4 * kMiB + 4321);
  DropCaches();
  int err = 0;
  std::string got =
      testing::PreadUncached(node->mount() + "/ds/large.bin", 3 * 4 * kMiB, 4 * kMiB, &err);
  EXPECT_EQ(err, EIO) << "read " << got.size() << " bytes";
  EXPECT_NE(got, large_.substr(3 * 4 * kMiB, 4 * kMiB));
  fs::rename(origin_ + ".gone", origin_);
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/large.bin"), large_);
}

INSTANTIATE_TEST_SUITE_P(Bindings, FlipTest,
                         ::testing::Values(Config{"kernel", true}, Config{"kernel", false},
                                           Config{"libfuse", false}),
                         Name);

// After a restart or a takeover nothing on disk is trusted: a file changed while no agent (or
// another agent) served it is not handed to passthrough, and its reads get the right bytes.
TEST_F(IntegrityTest, RestartsAndTakeoversCheckBeforePassthrough) {
  auto node = StartNode({"--scrub-rate", "0"});
  Fill(*node);
  const std::string large = CacheFileOfSize(node->cache_dir(), kLarge);
  ASSERT_TRUE(node->Stop());
  Flip(large, 9 * kMiB + 7);  // block 2, while no agent runs
  DropCaches();
  ASSERT_TRUE(node->Start());
  const uint64_t pt = Settled(*node).passthrough_opens();
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/large.bin"), large_);
  rpc::NodeStats st = Settled(*node);
  EXPECT_EQ(st.passthrough_opens(), pt);
  EXPECT_EQ(st.checksum_failures(), 1u) << node->Log();
  // Once every block was checked (and the bad one refilled), passthrough again. A daemon check
  // that raced the refill's own write to the file is not counted; the open that finds such a
  // block unchecked asks the scrubber for it, so a later open passes through.
  ASSERT_TRUE(WaitFor([&] { return Settled(*node).resident_blocks() == 17; }));
  ASSERT_TRUE(WaitFor([&] {
    EXPECT_EQ(ReadUncached(node->mount() + "/ds/large.bin"), large_);
    return Settled(*node).passthrough_opens() > pt;
  })) << node->Log();

  // The same across a takeover: flipped under the running agent, read by its successor.
  Flip(large, 13 * kMiB + 1);  // block 3
  DropCaches();
  ASSERT_TRUE(node->Takeover());
  const uint64_t pt2 = Settled(*node).passthrough_opens();
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/large.bin"), large_);
  st = Settled(*node);
  EXPECT_EQ(st.passthrough_opens(), pt2);
  EXPECT_EQ(st.checksum_failures(), 1u) << node->Log();  // the successor's own count
}

// The scrubber finds a bad block in a file nobody reads, within what its pace implies (68 MB at
// 64 MiB/s: about a second a pass), and the block is refilled.
TEST_F(IntegrityTest, TheScrubberFindsCorruptionNobodyReads) {
  auto node = StartNode({"--scrub-rate", "64MiB"});
  Fill(*node);
  const std::string large = CacheFileOfSize(node->cache_dir(), kLarge);
  Flip(large, 14 * kMiB + 999);
  DropCaches();
  ASSERT_TRUE(
      WaitFor([&] { return Settled(*node).checksum_failures() == 1; }, std::chrono::seconds(20)))
      << node->Log();
  ASSERT_TRUE(WaitFor([&] { return Settled(*node).repairs() == 1; }, std::chrono::seconds(10)));
  rpc::NodeStats st = Settled(*node);
  EXPECT_GE(st.scrub_passes(), 1u);
  EXPECT_EQ(st.scrub_rate(), 64 * kMiB);
  // Repaired on disk: the next read needs no fill.
  DropCaches();
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/large.bin"), large_);
  EXPECT_EQ(Settled(*node).checksum_failures(), 1u);
}

// Readers going on while blocks are damaged, quarantined and refilled under them: not one wrong
// byte.
TEST_F(IntegrityTest, ReadersDuringQuarantineGetNoWrongBytes) {
  auto node = StartNode({"--scrub-rate", "0", "--no-passthrough"});
  Fill(*node);
  const std::string large = CacheFileOfSize(node->cache_dir(), kLarge);
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, errors{0}, reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; t++) {
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      while (!stop) {
        const uint64_t off = rng() % (kLarge - kMiB);
        int err = 0;
        std::string got = testing::PreadUncached(node->mount() + "/ds/large.bin", off, kMiB, &err);
        if (err != 0) {
          errors++;
        } else if (got != large_.substr(off, kMiB)) {
          wrong++;
        }
        reads++;
      }
    });
  }
  std::mt19937_64 rng(99);
  for (int i = 0; i < 10; i++) {
    Flip(large, rng() % (kLarge - 4));
    DropCaches();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(errors.load(), 0);  // the origin is there: every bad block is refilled
  EXPECT_GT(reads.load(), 20);
  EXPECT_GE(Settled(*node).checksum_failures(), 1u);
}

// A node whose cache is corrupt does not hand the bad block to a peer: it finds it bad when asked,
// answers NotFound (the peer reads elsewhere), stops advertising it and refills it.
TEST_F(IntegrityTest, ACorruptBlockIsNotServedToPeers) {
  auto a = StartNode({"--scrub-rate", "0"}, "a", "127.0.0.2");
  Fill(*a);
  const std::string large = CacheFileOfSize(a->cache_dir(), kLarge);
  Flip(large, 21 * kMiB);  // block 5
  DropCaches();
  auto b = StartNode({"--scrub-rate", "0"}, "b", "127.0.0.3");
  EXPECT_EQ(ReadUncached(b->mount() + "/ds/large.bin"), large_);
  rpc::NodeStats sa = Settled(*a), sb = Settled(*b);
  EXPECT_EQ(sa.checksum_failures(), 1u) << a->Log();
  EXPECT_EQ(sb.checksum_failures(), 0u);  // b never received the bad bytes
  EXPECT_GE(sb.peer_fetches(), 10u);      // the rest came from a
  ASSERT_TRUE(WaitFor([&] { return Settled(*a).repairs() == 1; }));
}

}  // namespace
}  // namespace ember
