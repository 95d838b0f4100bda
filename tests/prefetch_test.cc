// Prefetch and locality on a real cluster: `ember meta` plus three `ember node` processes, driven
// through the `ember prefetch` / `ember locality` commands.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/cluster.h"
#include "tests/testing/testing.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::MetaProcess;
using testing::NodeProcess;
using testing::RunEmber;
using testing::TempDir;
using testing::WriteRandomFile;

constexpr uint64_t kMiB = 1 << 20;

class PrefetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), "2s");
    origin_ = dir_.Sub("origin");
    fs::create_directories(origin_ + "/big");
    fs::create_directories(origin_ + "/imgs");
    for (int i = 0; i < 3; i++) {
      WriteRandomFile(absl::StrCat(origin_, "/big/shard-", i), 8 * kMiB + 7 * i, 40 + i);
    }
    for (int i = 0; i < 30; i++) {
      WriteRandomFile(absl::StrCat(origin_, "/imgs/", i, ".jpg"), 112 << 10, 70 + i);
    }
    for (auto& e : fs::recursive_directory_iterator(origin_)) {
      if (!e.is_regular_file()) continue;
      bytes_ += fs::file_size(e);
      blocks_ += (fs::file_size(e) + 4 * kMiB - 1) / (4 * kMiB);
    }
    ASSERT_EQ(Ember({"dataset", "add", "ds", origin_}).exit_code, 0);
  }

  testing::RunResult Ember(std::vector<std::string> args) {
    args.push_back("--meta");
    args.push_back(meta_->address());
    return RunEmber(args, {}, std::chrono::seconds(120));
  }

  // With `metrics`, each node exports /metrics at metrics_[i].
  void StartNodes(int count, const std::string& cache_size = "1GiB",
                  std::vector<std::string> extra_args = {}, bool metrics = false) {
    for (int i = 0; i < count; i++) {
      NodeProcess::Options o;
      o.id = absl::StrCat("n", i + 1);
      o.listen_host = absl::StrCat("127.0.0.", i + 2);
      o.cache_size = cache_size;
      o.extra_args = extra_args;
      if (metrics) {
        metrics_.push_back(absl::StrCat("127.0.0.1:", testing::FreePort()));
        o.extra_args.insert(o.extra_args.end(), {"--metrics-listen", metrics_.back()});
      }
      nodes_.push_back(std::make_unique<NodeProcess>(dir_.Sub(o.id), meta_->address(), o));
      ASSERT_TRUE(nodes_.back()->Start());
    }
    // Registered and alive.
    ASSERT_TRUE(testing::WaitFor([&] {
      auto n = meta_->client().ListNodes();
      return n.ok() && static_cast<int>(n->size()) == count;
    }));
  }

  // Dataset "tiny": `files` files of min_size + (i * 37) % spread bytes in 10 folders.
  void AddTinyDataset(int files, int min_size, int spread) {
    const std::string tiny = dir_.Sub("tiny");
    for (int i = 0; i < files; i++) {
      fs::create_directories(absl::StrCat(tiny, "/", i % 10));
      WriteRandomFile(absl::StrCat(tiny, "/", i % 10, "/", i), min_size + (i * 37) % spread,
                      900 + i);
    }
    ASSERT_EQ(Ember({"dataset", "add", "tiny", tiny}).exit_code, 0);
  }

  json Locality(const std::string& dataset = "ds") {
    auto r = Ember({"locality", dataset, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out);
  }

  // Locations reach meta with the next report: wait until locality stops changing.
  json SettledLocality(const std::string& dataset = "ds") {
    json prev;
    for (int i = 0; i < 20; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      json l = Locality(dataset);
      if (i > 0 && l == prev) return l;
      prev = l;
    }
    return prev;
  }

  // Bytes actually on a node's disk in its cache files (holes not counted).
  static uint64_t OnDisk(NodeProcess& n) {
    uint64_t total = 0;
    for (const char* sub : {"/blocks", "/segments"}) {  // files' own and small files' segments
      if (!fs::exists(n.cache_dir() + sub)) continue;
      for (auto& e : fs::recursive_directory_iterator(n.cache_dir() + sub)) {
        struct stat st;
        if (e.is_regular_file() && stat(e.path().c_str(), &st) == 0) total += st.st_blocks * 512;
      }
    }
    return total;
  }

  json Job(const std::string& id) {
    auto r = Ember({"prefetch", "ls", "--json"});
    for (auto& j : json::parse(r.out)) {
      if (j["id"] == id) return j;
    }
    return nullptr;
  }

  TempDir dir_;
  std::string origin_;
  uint64_t bytes_ = 0, blocks_ = 0;
  std::unique_ptr<MetaProcess> meta_;
  std::vector<std::unique_ptr<NodeProcess>> nodes_;
  std::vector<std::string> metrics_;
};

TEST_F(PrefetchTest, FullModeWarmsEveryNodeReadingTheOriginOnce) {
  StartNodes(3);
  auto r = Ember({"prefetch", "ds", "--mode", "full", "--all"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("done"), std::string::npos) << r.out;
  // Origin read once per block for the whole cluster.
  uint64_t origin_reads = 0, origin_bytes = 0;
  for (auto& n : nodes_) {
    auto s = n->SettledStats(meta_->client(), std::chrono::milliseconds(800));  // heartbeated
    origin_reads += s.origin_block_reads();
    origin_bytes += s.bytes_from_origin();
  }
  EXPECT_EQ(origin_reads, blocks_);
  EXPECT_EQ(origin_bytes, bytes_);
  json l = SettledLocality();
  EXPECT_EQ(l["dataset_bytes"], bytes_);
  ASSERT_EQ(l["nodes"].size(), 3u);
  for (auto& n : l["nodes"]) {
    EXPECT_EQ(n["resident_bytes"], bytes_) << n;
    EXPECT_DOUBLE_EQ(n["fraction"].get<double>(), 1.0);
  }
  EXPECT_EQ(l["replicas_histogram"][3], blocks_);
  // Locality matches what the nodes hold on disk (within filesystem block rounding).
  for (auto& n : nodes_) {
    uint64_t disk = OnDisk(*n);
    EXPECT_GE(disk, bytes_);
    EXPECT_LE(disk, bytes_ + blocks_ * 4096);
  }
  // Running it again skips what is resident: no origin or peer traffic.
  r = Ember({"prefetch", "ds", "--mode", "full"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(origin 0 B, peers 0 B)"), std::string::npos) << r.out;
}

// `--warm-memory`: the agent faults its memory for blocks in flight in at start and still holds
// it after a prefetch, whose end hands the rest of its free memory back (an agent without it
// returns to ~50 MiB here).
TEST_F(PrefetchTest, TheAgentKeepsItsWarmMemoryAcrossAPrefetch) {
  NodeProcess::Options o;
  o.listen_host = "127.0.0.2";
  o.warm_memory = "192MiB";
  nodes_.push_back(std::make_unique<NodeProcess>(dir_.Sub("n1"), meta_->address(), o));
  ASSERT_TRUE(nodes_.back()->Start());
  NodeProcess& n = *nodes_.back();
  auto rss_mib = [&] {
    std::ifstream f(absl::StrCat("/proc/", n.process().pid(), "/status"));
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6)) / 1024;
    }
    return 0L;
  };
  ASSERT_TRUE(testing::WaitFor([&] {
    return n.Log().find("memory for blocks in flight: 192 MiB faulted in") != std::string::npos;
  })) << n.Log();
  EXPECT_GE(rss_mib(), 192);
  auto r = Ember({"prefetch", "ds", "--mode", "full", "--all"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("done"), std::string::npos) << r.out;
  // The run logs its end, then releases the free memory (cachefs/prefetch.cc).
  ASSERT_TRUE(testing::WaitFor([&] { return n.Log().find("finished here") != std::string::npos; }))
      << n.Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_GE(rss_mib(), 192);
}

// Tiny files go many at a time: a node's peer fetches, checksum claims and locations are
// batched by the blocks' bytes, not by the block size (4 MiB) they are far below. Before, a batch
// was "full" at four blocks (16 MiB of block size), so a tiny-file prefetch cost a Locate and a
// checksum claim per four blocks (200,000 files to 3 nodes: 36 s, now 16 s).
TEST_F(PrefetchTest, TinyFilesMoveManyBlocksPerCallToMeta) {
  constexpr int kFiles = 1500;
  AddTinyDataset(kFiles, 1000, 3000);
  StartNodes(3, "1GiB", {}, /*metrics=*/true);
  auto calls = [&](size_t i, const char* request) {
    return std::max(
        0.0, testing::MetricSample(
                 testing::HttpGet(metrics_[i], "/metrics"),
                 absl::StrCat("ember_meta_client_seconds_count{request=\"", request, "\"}")));
  };
  std::vector<double> locates, claims;
  for (size_t i = 0; i < nodes_.size(); i++) {
    locates.push_back(calls(i, "LocateRequest"));
    claims.push_back(calls(i, "RecordChecksumsRequest"));
  }
  auto r = Ember({"prefetch", "tiny", "--mode", "full", "--all"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_NE(r.out.find("done"), std::string::npos) << r.out;
  for (size_t i = 0; i < nodes_.size(); i++) {
    // Each node reads a third of the blocks from the origin and claims their checksums (before:
    // 27-31 calls for 500 blocks; now 3-6), and locates the rest before fetching them from peers.
    const double claimed = calls(i, "RecordChecksumsRequest") - claims[i];
    EXPECT_GT(claimed, 0) << nodes_[i]->id();
    EXPECT_LE(claimed, kFiles / 3 / 32) << nodes_[i]->id();
    EXPECT_LE(calls(i, "LocateRequest") - locates[i], kFiles / 16) << nodes_[i]->id();
  }
  // And every node holds every file.
  json l = SettledLocality("tiny");
  ASSERT_EQ(l["nodes"].size(), 3u) << l;
  for (auto& n : l["nodes"]) {
    EXPECT_DOUBLE_EQ(n["fraction"].get<double>(), 1.0) << n;
  }
}

// Origin once, however long the prefetch: a node waits for a block's owner as long as the owner
// keeps delivering, and reads the origin itself only when the owner stops (dies). The origin is
// slowed so the owners take several times the grace to deliver their shares (the small files:
// many blocks, each quickly); before, every block still waiting when the grace had passed since
// the job's start was read from the origin again (1.63x the dataset for 200,000 tiny files).
TEST_F(PrefetchTest, ASlowButLiveOwnerIsWaitedForAndTheOriginReadOnce) {
  StartNodes(3, "1GiB", {"--prefetch-owner-grace", "1s"});
  uint64_t img_bytes = 0;
  for (auto& e : fs::directory_iterator(origin_ + "/imgs")) img_bytes += fs::file_size(e);
  auto t0 = std::chrono::steady_clock::now();
  // 3.3 MiB at 900 KiB/s for the cluster (300 KiB/s per node): ~4 s, 4x the grace.
  auto r = Ember({"prefetch", "ds", "imgs", "--mode", "full", "--origin-rate", "900KiB"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_GT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));  // it was slow
  // The nodes' own accounts of the job: what each read from the origin (final reports).
  auto jobs = meta_->client().ListPrefetches();
  ASSERT_TRUE(jobs.ok() && jobs->size() == 1u);
  uint64_t job_origin = 0;
  for (const auto& n : jobs->front().nodes()) job_origin += n.bytes_from_origin();
  EXPECT_EQ(job_origin, img_bytes);
}

// Nodes hear of a job from meta at once (WatchPrefetches), not at their next heartbeat: with
// heartbeats 20 s apart, a prefetch of this small dataset is done long before one.
TEST_F(PrefetchTest, ANodeStartsAJobAtOnceNotAtItsNextHeartbeat) {
  meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta-long-lease"), "60s");
  ASSERT_EQ(Ember({"dataset", "add", "ds", origin_}).exit_code, 0);
  StartNodes(3);
  const auto start = std::chrono::steady_clock::now();
  auto r = Ember({"prefetch", "ds", "--mode", "full", "--all"});
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("done"), std::string::npos) << r.out;
  EXPECT_LT(took, std::chrono::seconds(10)) << "the nodes waited for a heartbeat";
  // Each block read from the origin once, by its owner: the nodes' final reports of the job (their
  // stats reach meta only with a heartbeat, 20 s apart here).
  auto jobs = meta_->client().ListPrefetches();
  ASSERT_TRUE(jobs.ok() && jobs->size() == 1u);
  uint64_t job_origin = 0, job_blocks = 0;
  for (const auto& n : jobs->front().nodes()) {
    job_origin += n.bytes_from_origin();
    job_blocks += n.blocks_done();
  }
  EXPECT_EQ(job_origin, bytes_);
  EXPECT_EQ(job_blocks, blocks_ * 3);
}

// The watch itself: answers at once for an unknown epoch, waits for a change (a job started
// meanwhile), and ends at once when cancelled.
TEST_F(PrefetchTest, WatchPrefetchesWaitsForAChangeAndCanBeCancelled) {
  StartNodes(1);
  meta::MetaClient& c = meta_->client();
  auto now = c.WatchPrefetches("n1", 0, std::chrono::seconds(5));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->prefetches_size(), 0);
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(Ember({"prefetch", "ds", "--detach"}).exit_code, 0);
  });
  auto changed = c.WatchPrefetches("n1", now->epoch(), std::chrono::seconds(5));
  starter.join();
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_NE(changed->epoch(), now->epoch());
  ASSERT_EQ(changed->prefetches_size(), 1);
  EXPECT_EQ(changed->prefetches(0).spec().dataset(), "ds");
  // Cancelled: the watch in flight ends with Cancelled, and so do later ones.
  meta::MetaClient other(meta_->address());
  absl::StatusOr<rpc::WatchPrefetchesResponse> cancelled;
  std::thread watcher(
      [&] { cancelled = other.WatchPrefetches("n1", changed->epoch(), std::chrono::seconds(5)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  other.CancelWatches();
  watcher.join();
  EXPECT_TRUE(absl::IsCancelled(cancelled.status())) << cancelled.status();
  EXPECT_TRUE(absl::IsCancelled(other.WatchPrefetches("n1", 0, std::chrono::seconds(1)).status()));
}

TEST_F(PrefetchTest, StripeModeSpreadsReplicas) {
  StartNodes(3);
  auto r = Ember({"prefetch", "ds", "--mode", "stripe", "--replicas", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  json l = SettledLocality();
  EXPECT_EQ(l["resident_anywhere_bytes"], bytes_);  // the union is complete
  EXPECT_EQ(l["replicas_histogram"][0], 0);
  EXPECT_EQ(l["replicas_histogram"][1], blocks_);  // each block on exactly one node
  uint64_t sum = 0, most = 0, least = ~0ull;
  for (auto& n : l["nodes"]) {
    uint64_t b = n["resident_blocks"];
    sum += n["resident_bytes"].get<uint64_t>();
    most = std::max(most, b);
    least = std::min(least, b);
  }
  EXPECT_EQ(sum, bytes_);
  EXPECT_LE(most - least, 1u);  // spread evenly
  // Two replicas: every block on two distinct nodes.
  r = Ember({"prefetch", "ds", "--mode", "stripe", "--replicas", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  l = SettledLocality();
  EXPECT_EQ(l["replicas_histogram"][2], blocks_);
  // The second replica of every block came from a peer: the origin was read once per block.
  uint64_t origin_reads = 0;
  for (auto& n : nodes_) {
    origin_reads +=
        n->SettledStats(meta_->client(), std::chrono::milliseconds(800)).origin_block_reads();
  }
  EXPECT_EQ(origin_reads, blocks_);
}

TEST_F(PrefetchTest, PinsAreReportedAndReleased) {
  StartNodes(2, "64MiB");
  // A pin that cannot fit fails before any work starts.
  fs::create_directories(origin_ + "/huge");
  WriteRandomFile(origin_ + "/huge/blob", 70 * kMiB, 5);
  ASSERT_EQ(Ember({"dataset", "add", "huge", origin_ + "/huge"}).exit_code, 0);
  auto r = Ember({"prefetch", "huge", "--pin", "1h"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cannot pin"), std::string::npos) << r.err;
  json ls = json::parse(Ember({"prefetch", "ls", "--json"}).out);
  EXPECT_TRUE(ls.empty());
  // A pin that fits: reported per node, then released.
  r = Ember({"prefetch", "ds", "big", "--pin", "1h"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("pinned until"), std::string::npos);
  uint64_t big = 3 * 8 * kMiB + 21;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        json l = Locality();
        for (auto& n : l["nodes"]) {
          if (n["pinned_bytes"] != big) return false;
        }
        return true;
      },
      std::chrono::seconds(15)));
  r = Ember({"unpin", "ds"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("released 1 pin"), std::string::npos);
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        json l = Locality();
        for (auto& n : l["nodes"]) {
          if (n["pinned_bytes"] != 0) return false;
        }
        return true;
      },
      std::chrono::seconds(15)));
}

TEST_F(PrefetchTest, NodeDyingMidPrefetchIsReportedAndOthersFinish) {
  StartNodes(3);
  // Slow the origin down so the prefetch is still running when a node dies.
  auto r = Ember({"prefetch", "ds", "--origin-rate", "6MiB", "--detach"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string id = r.out.substr(9, r.out.find(':') - 9);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  nodes_[2]->Kill(SIGKILL);
  json job;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        job = Job(id);
        return !job.is_null() && job["state"] != "running";
      },
      std::chrono::seconds(90)));
  auto status = Ember({"prefetch", "status", id});
  EXPECT_NE(status.exit_code, 0);  // something failed, and it says exactly what
  EXPECT_NE(status.out.find("node n3: node died before finishing"), std::string::npos)
      << status.out;
  EXPECT_EQ(status.out.find("node n1:"), std::string::npos) << status.out;
  EXPECT_EQ(status.out.find("node n2:"), std::string::npos) << status.out;
  // The survivors hold everything.
  json l = SettledLocality();
  for (auto& n : l["nodes"]) {
    if (n["id"] != "n3") {
      EXPECT_EQ(n["resident_bytes"], bytes_) << n;
    }
  }
}

// An owner that delivers nothing (dead from the start of the job) has its whole share read from
// the origin by the others once the grace is over, not a locate window at a time: each survivor
// located the dead owner's first few waiting blocks per poll (16 every 20 ms) and moved only
// those on, so its share of a tiny-file dataset took minutes (65-76 polls here where it now
// takes 14-20). The survivors' own accounts say they gave up on the silent owner in one go.
TEST_F(PrefetchTest, ADeadOwnersWholeShareGoesToTheOriginOnceItsGraceIsOver) {
  AddTinyDataset(3000, 500, 1500);
  StartNodes(3, "1GiB", {"--prefetch-owner-grace", "1s"});
  // Stopped, not killed: meta keeps it in the job (alive until its lease ends), and it never
  // delivers a block.
  nodes_[2]->Kill(SIGSTOP);
  auto r = Ember({"prefetch", "tiny", "--mode", "full", "--all", "--detach"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int gave_up = 0;  // survivors that gave up on the silent owner
  for (int i = 0; i < 2; i++) {
    std::string line;
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          const std::string log = nodes_[i]->Log();
          const size_t at = log.find(" polls\n");
          if (at == std::string::npos) return false;
          line = log.substr(log.rfind('\n', at) + 1, at - log.rfind('\n', at) - 1);
          return true;
        },
        std::chrono::seconds(90)))
        << nodes_[i]->Log();
    // "...; gave up on K silent owners in P polls": the dead owner's share moved on in one go
    // or two, not 16 blocks a poll (62 polls for its ~1,000 blocks). A survivor may not need
    // to: when the other read the share from the origin first, it took the blocks from it.
    const size_t on = line.find("gave up on ");
    ASSERT_NE(on, std::string::npos) << line;
    const int gave = std::stoi(line.substr(on + 11));
    gave_up += gave > 0;
    const size_t in = line.find(" silent owners in ");
    ASSERT_NE(in, std::string::npos) << line;
    if (gave > 0) EXPECT_LE(std::stoi(line.substr(in + 18)), 3) << line;
  }
  EXPECT_GE(gave_up, 1);
  nodes_[2]->Kill(SIGCONT);
  // The survivors hold every file.
  json l = SettledLocality("tiny");
  for (auto& n : l["nodes"]) {
    if (n["id"] != "n3") EXPECT_DOUBLE_EQ(n["fraction"].get<double>(), 1.0) << n;
  }
}

TEST_F(PrefetchTest, BadInputGetsClearErrors) {
  StartNodes(2);
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  std::vector<Case> cases = {
      {{"prefetch", "nope"}, "unknown dataset 'nope'"},
      {{"prefetch", "ds", "imgs/missing.jpg"}, "no path 'imgs/missing.jpg'"},
      {{"prefetch", "ds", "--mode", "stripe", "--replicas", "3"}, "--replicas 3"},
      {{"prefetch", "ds", "--mode", "mirror"}, "--mode 'mirror'"},
      {{"prefetch", "ds", "--pin", "10 parsecs"}, "invalid duration"},
      {{"prefetch", "ds", "--origin-rate", "fast"}, "invalid size 'fast'"},
      {{"prefetch", "ds", "--nodes", "n1,ghost"}, "unknown node 'ghost'"},
      {{"prefetch", "status", "pf-99"}, "unknown prefetch 'pf-99'"},
      {{"locality", "nope"}, "unknown dataset 'nope'"},
  };
  for (const auto& c : cases) {
    auto r = Ember(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.says;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << "want '" << c.says << "' in: " << r.err;
  }
  json ls = json::parse(Ember({"prefetch", "ls", "--json"}).out);
  EXPECT_TRUE(ls.empty());
}

}  // namespace
}  // namespace ember
