// Chaos: meta and 3 node processes on 127.0.0.x under continuous verified reads, while peers
// and meta are killed (SIGKILL) and restarted and peers are frozen (SIGSTOP) at random.
// Every read is checked against the origin. Reads on a node are paused while that node itself
// is down (its own training job would be down with it); every other read must succeed.
//
// Bounded: EMBER_CHAOS_SECONDS (default 60). The report line gives faults injected, reads,
// wrong bytes, failed reads and the longest stall.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
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
using testing::RunEmber;
using testing::TempDir;
using testing::WriteRandomFile;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;

// One node and the readers on its mount. A fault on the node first closes the gate (new reads
// wait) and waits for reads in flight to finish, so only reads on other nodes see the fault.
struct Slot {
  std::unique_ptr<NodeProcess> node;
  std::mutex mu;
  std::condition_variable cv;
  bool up = true;    // guarded by mu
  int inflight = 0;  // guarded by mu

  bool Enter() {
    std::lock_guard lock(mu);
    if (!up) return false;
    inflight++;
    return true;
  }
  void Leave() {
    std::lock_guard lock(mu);
    inflight--;
    cv.notify_all();
  }
  void Close() {
    std::unique_lock lock(mu);
    up = false;
    cv.wait(lock, [&] { return inflight == 0; });
  }
  void Open() {
    std::lock_guard lock(mu);
    up = true;
  }
};

TEST(ChaosTest, RandomKillsAndFreezesUnderVerifiedReads) {
  int seconds = 60;
  if (const char* s = std::getenv("EMBER_CHAOS_SECONDS")) seconds = std::max(5, std::atoi(s));
  uint64_t seed = Clock::now().time_since_epoch().count();
  std::printf("chaos: %d s, seed %lu\n", seconds, seed);
  std::fflush(stdout);

  TempDir dir;
  MetaProcess meta(dir.Sub("meta"), "3s");
  std::string origin = dir.Sub("origin");
  fs::create_directories(origin + "/shards");
  std::vector<std::string> names;
  std::map<std::string, std::string> content;
  for (int i = 0; i < 24; i++) {
    std::string name = absl::StrCat("shards/s", i, ".bin");
    WriteRandomFile(origin + "/" + name, 3 * kMiB + i * 1000, 500 + i);
    names.push_back(name);
    content[name] = ReadFile(origin + "/" + name);
  }
  ASSERT_EQ(
      RunEmber({"dataset", "add", "ds", origin, "--meta", meta.address(), "--block-size", "1MiB"})
          .exit_code,
      0);
  // Caches smaller than the dataset: blocks are evicted and refilled, from peers or the origin.
  Slot slots[3];
  for (int i = 0; i < 3; i++) {
    NodeProcess::Options o;
    o.id = absl::StrCat("n", i);
    o.listen_host = absl::StrCat("127.0.0.", i + 2);
    o.cache_size = "48MiB";
    o.extra_args = {"--peer-timeout", "1s"};
    slots[i].node = std::make_unique<NodeProcess>(dir.Sub(o.id), meta.address(), o);
    ASSERT_TRUE(slots[i].node->Start());
  }

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, wrong{0}, failed{0}, bytes{0}, stall_us{0};
  std::mutex err_mu;
  std::vector<std::string> errors;
  const auto t_start = Clock::now();
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t_start).count(); };
  std::vector<std::thread> readers;
  for (int r = 0; r < 9; r++) {
    readers.emplace_back([&, r] {
      std::mt19937_64 rng(seed + r);
      Slot& slot = slots[r % 3];
      while (!stop) {
        const std::string& name = names[rng() % names.size()];
        const std::string& want = content[name];
        uint64_t off = rng() % want.size();
        size_t len = std::min<uint64_t>(1 + rng() % (2 * kMiB), want.size() - off);
        if (!slot.Enter()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          continue;
        }
        auto start = Clock::now();
        int err;
        std::string got =
            testing::PreadUncached(slot.node->mount() + "/ds/" + name, off, len, &err);
        uint64_t us =
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
        uint64_t prev = stall_us;
        while (us > prev && !stall_us.compare_exchange_weak(prev, us)) {
        }
        reads++;
        bytes += len;
        if (err != 0) {
          failed++;
          std::lock_guard l(err_mu);
          if (errors.size() < 5) {
            errors.push_back(absl::StrCat("t=", since(), " ", slot.node->id(), " ", name, "@", off,
                                          ": ", strerror(err)));
          }
        } else if (got.compare(0, len, want, off, len) != 0) {
          wrong++;
        }
        slot.Leave();
      }
    });
  }

  std::mt19937_64 rng(seed);
  int node_kills = 0, meta_kills = 0, freezes = 0;
  auto deadline = Clock::now() + std::chrono::seconds(seconds);
  auto pause = [&](int lo_ms, int hi_ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(lo_ms + rng() % (hi_ms - lo_ms)));
  };
  while (Clock::now() < deadline) {
    pause(1000, 3000);
    int action = rng() % 3;
    Slot& victim = slots[rng() % 3];
    if (action == 0) {
      auto t0 = Clock::now();
      victim.Close();
      auto t1 = Clock::now();
      victim.node->Kill(SIGKILL);
      auto t2 = Clock::now();
      pause(300, 1500);
      auto t3 = Clock::now();
      ASSERT_TRUE(victim.node->Start()) << "node did not come back";
      auto ms = [](auto d) {
        return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
      };
      std::printf("t=%.2f kill %s: drain %ld ms, kill %ld ms, restart %ld ms\n", since(),
                  victim.node->id().c_str(), ms(t1 - t0), ms(t2 - t1), ms(Clock::now() - t3));
      std::fflush(stdout);
      victim.Open();
      node_kills++;
    } else if (action == 1) {
      std::printf("t=%.2f kill meta\n", since());
      meta.Kill(SIGKILL);
      pause(300, 2000);
      meta.Restart();
      meta_kills++;
    } else {
      victim.Close();
      std::printf("t=%.2f freeze %s\n", since(), victim.node->id().c_str());
      victim.node->Kill(SIGSTOP);
      pause(1000, 3000);
      victim.node->Kill(SIGCONT);
      std::printf("t=%.2f thaw %s\n", since(), victim.node->id().c_str());
      victim.Open();
      freezes++;
    }
  }
  stop = true;
  for (auto& t : readers) t.join();

  int faults = node_kills + meta_kills + freezes;
  std::printf(
      "chaos report: %d faults (%d node kills, %d meta kills, %d freezes), %lu reads "
      "(%.0f MiB), %lu wrong, %lu failed, longest stall %.2f s\n",
      faults, node_kills, meta_kills, freezes, reads.load(), bytes.load() / double(kMiB),
      wrong.load(), failed.load(), stall_us.load() / 1e6);
  for (const auto& e : errors) std::printf("  failed: %s\n", e.c_str());
  if (failed > 0 && std::getenv("EMBER_CHAOS_KEEP")) {
    std::system(
        absl::StrCat("rm -rf /tmp/chaos-keep; cp -r ", dir.path(), " /tmp/chaos-keep").c_str());
  }
  for (auto& s : slots) {
    if (failed > 0 || !s.node->process().Running()) {
      std::string log = s.node->Log();
      bool running = s.node->process().Running();
      std::printf("--- %s (%s), log tail:\n%s\n", s.node->id().c_str(),
                  running ? "running"
                          : absl::StrCat("EXITED with ",
                                         s.node->process().Wait(std::chrono::milliseconds(10)))
                                .c_str(),
                  log.substr(log.size() > 3000 ? log.size() - 3000 : 0).c_str());
    }
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(failed, 0u);
  EXPECT_GE(faults, seconds / 6);
  EXPECT_GT(reads, 100u);
  EXPECT_LT(stall_us, 20'000'000u) << "a read hung";
  // After the storm every node still serves every file correctly.
  for (auto& s : slots) {
    for (const auto& name : names) {
      bool same = testing::ReadUncached(s.node->mount() + "/ds/" + name) == content[name];
      ASSERT_TRUE(same) << s.node->id() << " " << name;
    }
  }
}

}  // namespace
}  // namespace ember
