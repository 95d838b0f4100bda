// Faults on a real cluster (meta + node processes on 127.0.0.x, real FUSE mounts): peers killed
// or frozen under concurrent readers, meta killed, the agent killed mid-fill, a full cache disk.
// Every read is checked byte for byte against the origin.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/cluster.h"
#include "tests/testing/testing.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using testing::MetaProcess;
using testing::NodeProcess;
using testing::PreadUncached;
using testing::ReadFile;
using testing::ReadUncached;
using testing::RunEmber;
using testing::TempDir;
using testing::WaitFor;
using testing::WriteFile;
using testing::WriteRandomFile;

constexpr uint64_t kMiB = 1 << 20;
using Clock = std::chrono::steady_clock;

class FaultTest : public ::testing::Test {
 protected:
  // files x size MiB of random data under origin/, added as dataset "ds".
  void MakeDataset(int files, uint64_t size, const std::string& lease = "60s",
                   const std::string& block = "1MiB") {
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), lease);
    origin_ = dir_.Sub("origin");
    fs::create_directories(origin_);
    for (int i = 0; i < files; i++) {
      std::string name = absl::StrCat("f", i, ".bin");
      WriteRandomFile(origin_ + "/" + name, size + i * 777, 100 + i);
      names_.push_back(name);
      content_[name] = ReadFile(origin_ + "/" + name);
    }
    auto r = RunEmber(
        {"dataset", "add", "ds", origin_, "--meta", meta_->address(), "--block-size", block});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  std::unique_ptr<NodeProcess> Node(const std::string& id, int host,
                                    std::vector<std::string> extra = {},
                                    const std::string& cache = "1GiB") {
    NodeProcess::Options o;
    o.id = id;
    o.listen_host = absl::StrCat("127.0.0.", host);
    o.cache_size = cache;
    o.extra_args = std::move(extra);
    auto n = std::make_unique<NodeProcess>(dir_.Sub(id), meta_->address(), o);
    EXPECT_TRUE(n->Start());
    return n;
  }

  int ReadAllWrong(NodeProcess& n) {
    int bad = 0;
    for (const auto& name : names_) {
      if (ReadUncached(n.mount() + "/ds/" + name) != content_[name]) bad++;
    }
    return bad;
  }

  // `readers` threads read every file of `n` in 1 MiB pieces, each from its own starting
  // file, verifying bytes. Calls `during` once `trigger_fraction` of the bytes were read.
  struct ReadReport {
    uint64_t reads = 0, wrong = 0, failed = 0, bytes = 0;
    double seconds_after_trigger = 0;
    std::string first_error;
  };
  ReadReport ConcurrentReads(NodeProcess& n, int readers, double trigger_fraction,
                             const std::function<void()>& during) {
    uint64_t total = 0;
    for (const auto& [name, data] : content_) total += data.size();
    total *= readers;
    std::atomic<uint64_t> bytes{0}, reads{0}, wrong{0}, failed{0};
    std::mutex err_mu;
    std::string first_error;
    std::vector<std::thread> threads;
    for (int t = 0; t < readers; t++) {
      threads.emplace_back([&, t] {
        for (size_t k = 0; k < names_.size(); k++) {
          const std::string& name = names_[(t + k) % names_.size()];
          const std::string& want = content_[name];
          for (uint64_t off = 0; off < want.size(); off += kMiB) {
            size_t len = std::min<uint64_t>(kMiB, want.size() - off);
            int err;
            std::string got = PreadUncached(n.mount() + "/ds/" + name, off, len, &err);
            reads++;
            bytes += len;
            if (err != 0) {
              failed++;
              std::lock_guard lock(err_mu);
              if (first_error.empty()) {
                first_error = absl::StrCat(name, "@", off, ": ", strerror(err));
              }
            } else if (got != want.substr(off, len)) {
              wrong++;
            }
          }
        }
      });
    }
    WaitFor([&] { return bytes >= total * trigger_fraction; }, std::chrono::seconds(120));
    auto trigger = Clock::now();
    if (during) during();
    for (auto& t : threads) t.join();
    ReadReport r;
    r.reads = reads;
    r.wrong = wrong;
    r.failed = failed;
    r.bytes = bytes;
    r.first_error = first_error;
    r.seconds_after_trigger = std::chrono::duration<double>(Clock::now() - trigger).count();
    return r;
  }

  TempDir dir_;
  std::string origin_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> content_;
  std::unique_ptr<MetaProcess> meta_;
};

TEST_F(FaultTest, PeerKilledDuring32ReadersNoWrongOrFailedReads) {
  MakeDataset(16, 6 * kMiB);  // ~96 MiB in 1 MiB blocks
  auto a = Node("a", 2);
  auto c = Node("c", 4);
  ASSERT_EQ(ReadAllWrong(*a), 0);  // a holds everything; c holds half, b nothing
  for (size_t i = 0; i < names_.size(); i += 2) {
    ASSERT_EQ(ReadUncached(c->mount() + "/ds/" + names_[i]), content_[names_[i]]);
  }
  auto b = Node("b", 3);
  // Wait until meta knows a's and c's blocks (the lease is 60 s: meta never declares a dead
  // during this test, so readers must move on by themselves).
  ASSERT_TRUE(WaitFor([&] { return a->Stats(meta_->client()).resident_blocks() >= 96; },
                      std::chrono::seconds(20)));
  auto r = ConcurrentReads(*b, 32, 0.2, [&] { a->Kill(SIGKILL); });
  std::printf(
      "32 readers, peer SIGKILLed at 20%%: %lu reads, %lu wrong, %lu failed, %.1f s after the "
      "kill\n",
      r.reads, r.wrong, r.failed, r.seconds_after_trigger);
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.failed, 0u) << r.first_error;
  EXPECT_LT(r.seconds_after_trigger, 45.0);  // far below the 60 s lease
  // Stats reach meta with heartbeats (a third of the 60 s lease): wait for one after the reads.
  rpc::NodeStats sb;
  EXPECT_TRUE(WaitFor(
      [&] {
        sb = b->Stats(meta_->client());
        return sb.peer_fetches() > 0;
      },
      std::chrono::seconds(45)))
      << "node b never reported a peer fetch";
}

TEST_F(FaultTest, FrozenPeerTimesOutAndReadsCompleteElsewhere) {
  MakeDataset(8, 4 * kMiB);
  auto a = Node("a", 2, {"--peer-timeout", "1s"});
  ASSERT_EQ(ReadAllWrong(*a), 0);
  auto b = Node("b", 3, {"--peer-timeout", "1s"});
  ASSERT_TRUE(WaitFor([&] { return a->Stats(meta_->client()).resident_blocks() >= 32; },
                      std::chrono::seconds(20)));
  a->Kill(SIGSTOP);
  auto r = ConcurrentReads(*b, 8, 0, {});
  a->Kill(SIGCONT);
  std::printf("8 readers, peer SIGSTOPped: %lu reads, %lu wrong, %lu failed, %.1f s\n", r.reads,
              r.wrong, r.failed, r.seconds_after_trigger);
  EXPECT_EQ(r.wrong, 0u);
  EXPECT_EQ(r.failed, 0u) << r.first_error;
  EXPECT_LT(r.seconds_after_trigger, 60.0);
  EXPECT_NE(b->Log().find("trying the next source"), std::string::npos) << b->Log();
}

TEST_F(FaultTest, MetaKilledNodesKeepServingThenRejoin) {
  MakeDataset(6, 2 * kMiB, "3s");
  auto a = Node("a", 2);
  // Half the files resident; the dataset's manifest loaded (and kept on disk).
  for (size_t i = 0; i < names_.size(); i += 2) {
    ASSERT_EQ(ReadUncached(a->mount() + "/ds/" + names_[i]), content_[names_[i]]);
  }
  ASSERT_TRUE(WaitFor([&] { return a->Stats(meta_->client()).resident_blocks() >= 6; }));
  meta_->Kill(SIGKILL);
  // Resident and origin reads go on.
  EXPECT_EQ(ReadAllWrong(*a), 0);
  // The agent restarts while meta is still down: it serves from its copies on disk.
  ASSERT_TRUE(a->Stop());
  ASSERT_TRUE(a->Start());
  std::set<std::string> listed;
  for (auto& e : fs::directory_iterator(a->mount() + "/ds")) listed.insert(e.path().filename());
  EXPECT_EQ(listed.size(), names_.size());
  EXPECT_EQ(ReadAllWrong(*a), 0);
  // Meta returns (from RocksDB): the node re-registers and re-reports its blocks.
  meta_->Restart();
  EXPECT_TRUE(WaitFor(
      [&] {
        auto nodes = meta_->client().ListNodes();
        return nodes.ok() && nodes->size() == 1 && nodes->at(0).state() == rpc::Node::ALIVE &&
               nodes->at(0).stats().resident_blocks() >= 12;
      },
      std::chrono::seconds(20)));
  auto loc = RunEmber({"locality", "ds", "--meta", meta_->address(), "--json"});
  ASSERT_EQ(loc.exit_code, 0) << loc.err;
  EXPECT_NE(loc.out.find("\"a\""), std::string::npos) << loc.out;
}

// A node that registered but never opened the dataset sees it and reads it while meta is down,
// also after its own restart: it kept the list and the manifest on disk ahead of use.
TEST_F(FaultTest, MetaKilledANodeThatNeverOpenedTheDatasetStillServesIt) {
  MakeDataset(4, 2 * kMiB);
  auto a = Node("a", 2);
  ASSERT_EQ(ReadAllWrong(*a), 0);
  auto b = Node("b", 3);
  auto copies = [&] {
    int n = 0;
    std::error_code ec;
    for (auto& e : fs::directory_iterator(b->cache_dir() + "/manifests", ec)) {
      n += e.path().extension() == ".manifest";
    }
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return copies() == 1; }, std::chrono::seconds(20)));
  meta_->Kill(SIGKILL);
  std::set<std::string> roots;
  for (auto& e : fs::directory_iterator(b->mount())) roots.insert(e.path().filename());
  EXPECT_EQ(roots, std::set<std::string>{"ds"});
  std::set<std::string> listed;
  for (auto& e : fs::directory_iterator(b->mount() + "/ds")) listed.insert(e.path().filename());
  EXPECT_EQ(listed, std::set<std::string>(names_.begin(), names_.end()));
  EXPECT_EQ(ReadAllWrong(*b), 0);
  ASSERT_TRUE(b->Stop());
  ASSERT_TRUE(b->Start());
  EXPECT_EQ(ReadAllWrong(*b), 0);
}

TEST_F(FaultTest, AgentKilledDuringFillsLeavesAConsistentCache) {
  MakeDataset(12, 8 * kMiB, "60s", "4MiB");
  auto a = Node("a", 2);
  // 8 cold readers; the agent is killed with SIGKILL in the middle of their fills.
  auto r = ConcurrentReads(*a, 8, 0.3, [&] { a->Kill(SIGKILL); });
  EXPECT_EQ(r.wrong, 0u);  // reads cut off by the kill fail; none returns wrong bytes
  EXPECT_GT(r.failed, 0u);
  ASSERT_TRUE(a->Start());  // cleans up the dead mount
  EXPECT_EQ(ReadAllWrong(*a), 0);
  ASSERT_TRUE(a->Stop());
  // Offline: every index record matches the bytes in its cache file.
  auto v = RunEmber({"cache", "verify", "--cache-dir", a->cache_dir(), "--json"});
  ASSERT_EQ(v.exit_code, 0) << v.out << v.err;
  uint64_t blocks = 0;
  for (const auto& [name, data] : content_) blocks += (data.size() + 4 * kMiB - 1) / (4 * kMiB);
  auto verified = nlohmann::json::parse(v.out);
  EXPECT_EQ(verified["damaged"], 0) << v.out;
  EXPECT_EQ(verified["blocks"], blocks) << v.out;  // every block, read back after the restart
  // Damage one block: verify finds it, --repair drops it, and the next read refetches it.
  std::string file;
  for (auto& e : fs::recursive_directory_iterator(a->cache_dir() + "/blocks")) {
    if (e.is_regular_file()) file = e.path();
  }
  ASSERT_FALSE(file.empty());
  {
    int fd = open(file.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "XXXX", 4, 100), 4);
    close(fd);
  }
  v = RunEmber({"cache", "verify", "--cache-dir", a->cache_dir()});
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_NE(v.err.find("1 damaged block"), std::string::npos) << v.out << v.err;
  v = RunEmber({"cache", "verify", "--cache-dir", a->cache_dir(), "--repair"});
  EXPECT_EQ(v.exit_code, 0) << v.err;
  v = RunEmber({"cache", "verify", "--cache-dir", a->cache_dir(), "--json"});
  EXPECT_EQ(nlohmann::json::parse(v.out)["blocks"], blocks - 1) << v.out;
  ASSERT_TRUE(a->Start());
  EXPECT_EQ(ReadAllWrong(*a), 0);
  // A running agent's cache cannot be verified underneath it.
  v = RunEmber({"cache", "verify", "--cache-dir", a->cache_dir()});
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_NE(v.err.find("agent still running"), std::string::npos) << v.err;
}

TEST_F(FaultTest, FullCacheDiskServesWithoutCachingThenRecovers) {
  MakeDataset(10, 4 * kMiB);  // ~40 MiB
  std::string disk = dir_.Sub("small-disk");
  fs::create_directories(disk);
  ASSERT_EQ(mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=48m"), 0) << strerror(errno);
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{disk};
  // Another tenant fills the disk to ~8 MiB free.
  WriteRandomFile(disk + "/filler", 40 * kMiB, 1);
  NodeProcess::Options o;
  o.id = "a";
  o.cache_size = "1GiB";  // the configured capacity is not what stops it: the disk is
  auto a = std::make_unique<NodeProcess>(disk + "/node", meta_->address(), o);
  ASSERT_TRUE(a->Start());
  EXPECT_EQ(ReadAllWrong(*a), 0);
  EXPECT_EQ(ReadAllWrong(*a), 0);
  std::string log = a->Log();
  size_t first = log.find("disk full");
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("disk full", first + 1), std::string::npos) << "logged more than once";
  uint64_t before = a->SettledStats(meta_->client(), std::chrono::milliseconds(600)).used_bytes();
  EXPECT_LT(before, 10 * kMiB);
  // Space returns: new fills are cached again.
  fs::remove(disk + "/filler");
  EXPECT_EQ(ReadAllWrong(*a), 0);
  EXPECT_TRUE(WaitFor([&] { return a->Stats(meta_->client()).used_bytes() >= 30 * kMiB; },
                      std::chrono::seconds(20)));
  EXPECT_NE(a->Log().find("writing blocks again"), std::string::npos);
}

}  // namespace
}  // namespace ember
