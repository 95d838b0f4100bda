// Peer sharing on a real cluster: one `ember meta` and several `ember node` processes on this
// machine, each on its own 127.0.0.x address with its own cache and mount.
#include "tests/testing/cluster.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
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
using testing::WriteFile;
using testing::WriteRandomFile;

constexpr uint64_t kMiB = 1 << 20;

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), "2s");
    origin_ = dir_.Sub("origin");
    fs::create_directories(origin_ + "/shards");
    for (int i = 0; i < 5; i++) {
      WriteRandomFile(absl::StrCat(origin_, "/shards/shard-", i, ".tar"), 9 * kMiB + i * 1000,
                      300 + i);
    }
    for (int i = 0; i < 20; i++) {
      WriteRandomFile(absl::StrCat(origin_, "/img-", i, ".jpg"), 112 << 10, 900 + i);
    }
    for (auto& e : fs::recursive_directory_iterator(origin_)) {
      if (!e.is_regular_file()) continue;
      files_.push_back(e.path().lexically_relative(origin_).string());
      blocks_ += (fs::file_size(e) + 4 * kMiB - 1) / (4 * kMiB);
      bytes_ += fs::file_size(e);
    }
    auto r = RunEmber({"dataset", "add", "ds", origin_, "--meta", meta_->address()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    WriteFile(dir_.Sub("token"), "s3cret-cluster-token\n");
  }

  std::unique_ptr<NodeProcess> Node(const std::string& id, int host,
                                    const std::string& token_file = "",
                                    std::vector<std::string> more_args = {}) {
    NodeProcess::Options o;
    o.id = id;
    o.listen_host = absl::StrCat("127.0.0.", host);
    o.extra_args = {"--token-file", token_file.empty() ? dir_.Sub("token") : token_file,
                    "--transport", "auto"};
    o.extra_args.insert(o.extra_args.end(), more_args.begin(), more_args.end());
    auto n = std::make_unique<NodeProcess>(dir_.Sub(id), meta_->address(), o);
    EXPECT_TRUE(n->Start());
    return n;
  }

  // Reads every file through a node's mount; returns how many differed or failed.
  int ReadAll(NodeProcess& n) {
    int bad = 0;
    for (const auto& f : files_) {
      if (ReadUncached(n.mount() + "/ds/" + f) != ReadFile(origin_ + "/" + f)) bad++;
    }
    return bad;
  }

  rpc::NodeStats Settled(NodeProcess& n) {
    return n.SettledStats(meta_->client(), std::chrono::milliseconds(800));
  }

  TempDir dir_;
  std::string origin_;
  std::vector<std::string> files_;
  uint64_t blocks_ = 0, bytes_ = 0;
  std::unique_ptr<MetaProcess> meta_;
};

TEST_F(ClusterTest, OriginReadOnceThenPeersServe) {
  auto a = Node("a", 2);
  auto b = Node("b", 3);
  auto c = Node("c", 4);
  ASSERT_EQ(ReadAll(*a), 0);
  rpc::NodeStats sa = Settled(*a);
  EXPECT_EQ(sa.origin_block_reads(), blocks_);

  // B reads everything: from A, never from the origin, bytes identical.
  ASSERT_EQ(ReadAll(*b), 0);
  rpc::NodeStats sb = Settled(*b);
  EXPECT_EQ(sb.origin_block_reads(), 0u);
  EXPECT_EQ(sb.bytes_from_origin(), 0u);
  EXPECT_EQ(sb.bytes_from_peers(), bytes_);
  EXPECT_EQ(sb.peer_fetches(), blocks_);
  EXPECT_EQ(Settled(*a).origin_block_reads(), blocks_);  // A did not read again either

  // A dies without a goodbye; C reads while meta still thinks A is alive: every read succeeds,
  // from B (or the origin), without waiting for A's lease to run out.
  a->Kill(SIGKILL);
  auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(ReadAll(*c), 0);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::seconds(20));
  rpc::NodeStats sc = Settled(*c);
  EXPECT_EQ(sc.bytes_from_peers() + sc.bytes_from_origin(), bytes_);
  EXPECT_GT(sc.bytes_from_peers(), 0u);
  auto status = RunEmber({"status", "--meta", meta_->address()});
  EXPECT_NE(status.out.find("FROM-PEERS"), std::string::npos);
}

// A node checks what it sends: its damaged copies are found when a peer asks, quarantined (the
// peer reads elsewhere) and refilled; no bad byte ever reaches the peer.
TEST_F(ClusterTest, CorruptPeerIsDetectedAndNeverServed) {
  // A keeps no blocks in memory: every send is from its (damaged) cache files.
  auto a = Node("a", 2, "", {"--recent-blocks", "0", "--readahead", "0"});
  ASSERT_EQ(ReadAll(*a), 0);
  Settled(*a);
  // Corrupt every cached file on A (its own cache file, or its place in a segment: the images
  // are small files), in place, while A keeps serving.
  int corrupted = 0;
  for (const auto& f : files_) {
    for (const auto& copy : testing::CachedCopiesOf(a->cache_dir(), ReadFile(origin_ + "/" + f))) {
      int fd = open(copy.path.c_str(), O_RDWR);
      char c = 0;
      ASSERT_EQ(pread(fd, &c, 1, static_cast<off_t>(copy.offset + 100)), 1);
      c ^= 0x77;
      ASSERT_EQ(pwrite(fd, &c, 1, static_cast<off_t>(copy.offset + 100)), 1);
      close(fd);
      corrupted++;
    }
  }
  ASSERT_EQ(corrupted, static_cast<int>(files_.size()));
  auto b = Node("b", 3);
  ASSERT_EQ(ReadAll(*b), 0);  // correct bytes
  rpc::NodeStats sa = Settled(*a), sb = Settled(*b);
  EXPECT_GE(sa.checksum_failures(), 1u) << a->Log();  // A found its own bad blocks
  EXPECT_EQ(sb.checksum_failures(), 0u);
  EXPECT_EQ(b->Log().find("failed its checksum"), std::string::npos) << b->Log();
  EXPECT_EQ(sb.bytes_from_origin() + sb.bytes_from_peers(), bytes_);
  EXPECT_GE(sb.bytes_from_origin(), 1u);  // the first blocks asked for came from the origin
}

TEST_F(ClusterTest, WrongTokenIsRefused) {
  auto a = Node("a", 2);
  ASSERT_EQ(ReadAll(*a), 0);
  Settled(*a);
  WriteFile(dir_.Sub("other-token"), "not-the-cluster-token");
  auto intruder = Node("x", 5, dir_.Sub("other-token"));
  ASSERT_EQ(ReadAll(*intruder), 0);  // still reads, from the origin
  rpc::NodeStats sx = Settled(*intruder);
  EXPECT_EQ(sx.peer_fetches(), 0u);
  EXPECT_GE(sx.peer_errors(), 1u);
  EXPECT_NE(a->Log().find("wrong cluster token"), std::string::npos) << a->Log();
}

}  // namespace
}  // namespace ember
