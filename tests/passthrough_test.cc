// The kernel-protocol FUSE binding's own features, through real `ember meta` / `ember node`
// processes and a real mount: passthrough of wholly resident files (never of partial ones, and
// never evicted while open) and takeover of a live mount by a successor process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
using testing::WriteRandomFile;

constexpr uint64_t kMiB = 1 << 20;

// Reads a whole open file with pread, from the start.
std::string PreadAll(int fd, size_t size) {
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    ssize_t n = pread(fd, out.data() + got, size - got, static_cast<off_t>(got));
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

class PassthroughTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* b = std::getenv("EMBER_TEST_FUSE_BINDING"); b && std::string(b) == "libfuse") {
      GTEST_SKIP() << "passthrough and takeover are features of the kernel binding";
    }
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), "900ms");
    origin_ = dir_.Sub("origin");
    fs::create_directories(origin_);
  }

  testing::RunResult Ember(std::vector<std::string> args) {
    args.push_back("--meta");
    args.push_back(meta_->address());
    auto r = RunEmber(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  }
  std::unique_ptr<NodeProcess> StartNode(NodeProcess::Options o = {}) {
    auto n = std::make_unique<NodeProcess>(dir_.Sub("node"), meta_->address(), o);
    EXPECT_TRUE(n->Start());
    return n;
  }
  rpc::NodeStats Settled(NodeProcess& n) {
    return n.SettledStats(meta_->client(), std::chrono::milliseconds(400));
  }

  TempDir dir_;
  std::unique_ptr<MetaProcess> meta_;
  std::string origin_;
};

TEST_F(PassthroughTest, ResidentFilesArePassedThroughPartialOnesAreNot) {
  WriteRandomFile(origin_ + "/full.bin", 20 * kMiB + 5, 1);
  WriteRandomFile(origin_ + "/partial.bin", 20 * kMiB, 2);
  Ember({"dataset", "add", "ds", origin_});
  NodeProcess::Options o;
  o.extra_args = {"--readahead", "0"};  // a 4 MiB read makes exactly one block resident
  auto node = StartNode(o);
  const std::string mnt = node->mount() + "/ds";

  // First read fills every block of full.bin (through the daemon: nothing is resident yet).
  ASSERT_EQ(ReadUncached(mnt + "/full.bin"), ReadFile(origin_ + "/full.bin"));
  // Only the first block of partial.bin.
  int err = 0;
  std::string head = testing::PreadUncached(mnt + "/partial.bin", 0, 4 * kMiB, &err);
  ASSERT_EQ(err, 0);
  ASSERT_EQ(head, ReadFile(origin_ + "/partial.bin").substr(0, 4 * kMiB));
  rpc::NodeStats before = Settled(*node);
  EXPECT_TRUE(before.passthrough()) << node->Log();
  EXPECT_EQ(before.fuse_binding(), "kernel");

  // Wholly resident: the kernel reads the cache file; the daemon sees the open, not the reads.
  ASSERT_EQ(ReadUncached(mnt + "/full.bin"), ReadFile(origin_ + "/full.bin"));
  rpc::NodeStats after_full = Settled(*node);
  EXPECT_EQ(after_full.passthrough_opens(), before.passthrough_opens() + 1);
  EXPECT_EQ(after_full.bytes_from_cache(), before.bytes_from_cache());
  EXPECT_EQ(after_full.bytes_from_origin(), before.bytes_from_origin());

  // Partially resident: through the daemon (cache + origin), never passthrough.
  ASSERT_EQ(ReadUncached(mnt + "/partial.bin"), ReadFile(origin_ + "/partial.bin"));
  rpc::NodeStats after_partial = Settled(*node);
  EXPECT_EQ(after_partial.passthrough_opens(), after_full.passthrough_opens());
  EXPECT_EQ(after_partial.daemon_opens(), after_full.daemon_opens() + 1);
  EXPECT_GE(after_partial.bytes_from_cache(), after_full.bytes_from_cache() + 4 * kMiB);
  // (The kernel's own readahead may have filled a second block before.)
  EXPECT_GE(after_partial.bytes_from_origin(), after_full.bytes_from_origin() + 8 * kMiB);

  // Now resident too: the next open is passed through. `ember status` shows the count.
  ASSERT_EQ(ReadUncached(mnt + "/partial.bin"), ReadFile(origin_ + "/partial.bin"));
  rpc::NodeStats last = Settled(*node);
  EXPECT_EQ(last.passthrough_opens(), after_partial.passthrough_opens() + 1);
  auto st = Ember({"status"});
  EXPECT_NE(st.out.find(absl::StrCat(last.passthrough_opens(), " of ",
                                     last.passthrough_opens() + last.daemon_opens(), " opens")),
            std::string::npos)
      << st.out;
  EXPECT_TRUE(node->Stop()) << node->Log();
}

TEST_F(PassthroughTest, NoPassthroughFlagServesEverythingThroughTheDaemon) {
  WriteRandomFile(origin_ + "/f.bin", 9 * kMiB, 3);
  Ember({"dataset", "add", "ds", origin_});
  NodeProcess::Options o;
  o.extra_args = {"--no-passthrough"};
  auto node = StartNode(o);
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ(ReadUncached(node->mount() + "/ds/f.bin"), ReadFile(origin_ + "/f.bin"));
  }
  rpc::NodeStats s = Settled(*node);
  EXPECT_FALSE(s.passthrough());
  EXPECT_EQ(s.passthrough_opens(), 0u);
  EXPECT_GE(s.bytes_from_cache(), 9 * kMiB);
}

TEST_F(PassthroughTest, ABackingFileLingersForTheNextOpen) {
  WriteRandomFile(origin_ + "/rec.bin", 9 * kMiB, 11);
  Ember({"dataset", "add", "ds", origin_});
  auto node = StartNode();
  const std::string path = node->mount() + "/ds/rec.bin";
  const std::string want = ReadFile(origin_ + "/rec.bin");
  ASSERT_EQ(ReadUncached(path), want);
  rpc::NodeStats before = Settled(*node);
  // A record reader: open, read a record, close; again and again (within the linger).
  for (int i = 0; i < 20; i++) {
    int fd = open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    std::string rec(4096, '\0');
    ASSERT_EQ(pread(fd, rec.data(), rec.size(), i * 100000), 4096);
    EXPECT_EQ(rec, want.substr(static_cast<size_t>(i) * 100000, 4096));
    close(fd);
  }
  rpc::NodeStats after = Settled(*node);
  EXPECT_EQ(after.passthrough_opens(), before.passthrough_opens() + 20);
  EXPECT_EQ(after.backing_registrations(), before.backing_registrations() + 1);
  EXPECT_EQ(after.passthrough_files_open(), 0u);  // none open now, though one lingers
  // Past the linger it is let go: the next open registers it again.
  std::this_thread::sleep_for(std::chrono::seconds(6));
  (void)Settled(*node);  // heartbeats sweep lingering backing files
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(PreadAll(fd, want.size()) == want);
  close(fd);
  EXPECT_EQ(Settled(*node).backing_registrations(), before.backing_registrations() + 2);
}

TEST_F(PassthroughTest, EvictionNeverPunchesAFileOpenInPassthrough) {
  // A 28 MiB cache: the open file holds 16 MiB of it, two 24 MiB files churn the rest (larger
  // than the blocks the agent keeps in memory, readahead + 2 = 3 here, so their blocks are
  // fetched again and again).
  WriteRandomFile(origin_ + "/held.bin", 16 * kMiB - 4096, 10);  // a size no other file has
  for (int i = 0; i < 2; i++)
    WriteRandomFile(absl::StrCat(origin_, "/churn-", i), 24 * kMiB, 20 + i);
  Ember({"dataset", "add", "ds", origin_});
  NodeProcess::Options o;
  o.cache_size = "28MiB";
  o.extra_args = {"--readahead", "1", "--recent-blocks", "2"};
  auto node = StartNode(o);
  const std::string mnt = node->mount() + "/ds";
  const std::string want = ReadFile(origin_ + "/held.bin");
  ASSERT_EQ(ReadUncached(mnt + "/held.bin"), want);
  rpc::NodeStats before = Settled(*node);

  int fd = open((mnt + "/held.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  rpc::NodeStats opened = Settled(*node);
  ASSERT_EQ(opened.passthrough_opens(), before.passthrough_opens() + 1);
  EXPECT_EQ(opened.passthrough_files_open(), 1u);
  // Pressure: the churn files never fit beside the held file, so they are read through the
  // daemon every time; churn-1 read more often than churn-0 is hot enough (cache_policy.h) to
  // evict: the least recently used and coldest blocks first, which the held file's would be
  // were they not pinned.
  for (int i = 0; i < 2; i++) {
    for (int round = 0; round < (i == 0 ? 3 : 8); round++) {
      std::string name = absl::StrCat("/churn-", i);
      ASSERT_EQ(ReadUncached(mnt + name), ReadFile(origin_ + name));
    }
  }
  rpc::NodeStats churned = Settled(*node);
  EXPECT_GT(churned.evictions(), before.evictions())
      << "no evictions: the test would prove nothing; not admitted " << churned.not_admitted()
      << ", used " << churned.used_bytes() << ", hits " << churned.hits() << ", misses "
      << churned.misses();
  EXPECT_LE(churned.used_bytes(), 28 * kMiB);
  // No range of the held file's cache file was punched (its blocks are all still allocated)...
  uint64_t held_allocated = 0;
  for (auto& e : fs::recursive_directory_iterator(node->cache_dir() + "/blocks")) {
    struct stat st;
    if (e.is_regular_file() && stat(e.path().c_str(), &st) == 0 &&
        static_cast<uint64_t>(st.st_size) == want.size()) {
      held_allocated = static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  EXPECT_GE(held_allocated, want.size()) << "the held file's cache file was punched";
  // ...and the open file still reads right through its backing file (a hole would read zeros).
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  EXPECT_TRUE(PreadAll(fd, want.size()) == want);
  close(fd);
  // Released: its blocks are ordinary cache blocks again (evictable); the mount still works.
  rpc::NodeStats closed = Settled(*node);
  EXPECT_EQ(closed.passthrough_files_open(), 0u);
  for (int i = 0; i < 2; i++) {
    std::string name = absl::StrCat("/churn-", i);
    ASSERT_EQ(ReadUncached(mnt + name), ReadFile(origin_ + name));
  }
  EXPECT_EQ(ReadUncached(mnt + "/held.bin"), want);
}

TEST_F(PassthroughTest, TakeoverUnderEightReadersLosesNoRead) {
  // Resident files (passthrough), a file larger than the cache share it gets (daemon reads that
  // fill from the origin), and a file kept open across every takeover.
  constexpr int kFiles = 6;
  for (int i = 0; i < kFiles; i++) {
    WriteRandomFile(absl::StrCat(origin_, "/f", i), (3 + i) * kMiB + i, 40 + i);
  }
  WriteRandomFile(origin_ + "/kept-open.bin", 10 * kMiB, 99);
  Ember({"dataset", "add", "ds", origin_});
  auto node = StartNode();
  const std::string mnt = node->mount() + "/ds";
  std::vector<std::string> want;
  for (int i = 0; i < kFiles; i++) want.push_back(ReadFile(absl::StrCat(origin_, "/f", i)));
  const std::string kept_want = ReadFile(origin_ + "/kept-open.bin");
  // Half the files resident before the readers start; the rest fill while takeovers happen.
  for (int i = 0; i < kFiles / 2; i++) ASSERT_EQ(ReadUncached(absl::StrCat(mnt, "/f", i)), want[i]);

  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, failed{0}, wrong{0};
  std::atomic<int64_t> max_stall_us{0};
  auto note_latency = [&](std::chrono::steady_clock::time_point t0) {
    int64_t us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    int64_t prev = max_stall_us.load();
    while (us > prev && !max_stall_us.compare_exchange_weak(prev, us)) {
    }
  };
  std::vector<std::thread> readers;
  for (int t = 0; t < 7; t++) {
    readers.emplace_back([&, t] {
      for (int k = 0; !stop; k++) {
        int i = (t + k) % kFiles;
        auto t0 = std::chrono::steady_clock::now();
        std::string path = absl::StrCat(mnt, "/f", i);
        int fd = open(path.c_str(), O_RDONLY);
        if (fd < 0) {
          failed++;
          continue;
        }
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        std::string got = PreadAll(fd, want[i].size() + 1);
        close(fd);
        note_latency(t0);
        reads++;
        if (got.size() != want[i].size()) {
          failed++;
        } else if (got != want[i]) {
          wrong++;
        }
      }
    });
  }
  // The eighth reader keeps one file open through every takeover, re-reading it.
  readers.emplace_back([&] {
    int fd = open((mnt + "/kept-open.bin").c_str(), O_RDONLY);
    if (fd < 0) {
      failed++;
      return;
    }
    while (!stop) {
      auto t0 = std::chrono::steady_clock::now();
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      std::string got = PreadAll(fd, kept_want.size());
      note_latency(t0);
      reads++;
      if (got.size() != kept_want.size()) {
        failed++;
      } else if (got != kept_want) {
        wrong++;
      }
    }
    close(fd);
  });

  for (int round = 0; round < 5; round++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    int before = reads;
    if (!node->Takeover()) {  // not ASSERT: the readers must be joined first
      ADD_FAILURE() << "takeover " << round;
      break;
    }
    std::printf("takeover %d: done, %d reads so far\n", round + 1, before);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  stop = true;
  for (auto& t : readers) t.join();
  std::printf("takeover x5 under 8 readers: %d reads, %d failed, %d wrong, longest read %.1f ms\n",
              reads.load(), failed.load(), wrong.load(), max_stall_us.load() / 1000.0);
  EXPECT_GT(reads, 5 * 8);
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(wrong, 0);
  // The last successor serves new opens, fills and stats as any agent.
  for (int i = 0; i < kFiles; i++) EXPECT_EQ(ReadUncached(absl::StrCat(mnt, "/f", i)), want[i]);
  rpc::NodeStats s = Settled(*node);
  EXPECT_TRUE(s.passthrough());
  EXPECT_TRUE(node->Stop()) << node->Log();
}

// Readers that verify every byte of `files` through the mount (page cache dropped before each
// read), and a watcher that counts the moments the mount is absent and, given the node's peer
// address, the connections to it that are refused, until Finish().
class VerifyingReaders {
 public:
  VerifyingReaders(const std::string& dir, const std::vector<std::string>& want, int threads,
                   const std::string& peer_address = "") {
    watcher_ = std::thread([this, peer_address, mount = fs::path(dir).parent_path().string()] {
      while (!stop_) {
        if (!testing::IsMounted(mount)) absent_++;
        if (!peer_address.empty() && !testing::PortOpen(peer_address)) refused_++;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    for (int t = 0; t < threads; t++) {
      readers_.emplace_back([this, dir, &want, t] {
        for (size_t k = 0; !stop_; k++) {
          size_t i = (t + k) % want.size();
          int fd = open(absl::StrCat(dir, "/f", i).c_str(), O_RDONLY);
          if (fd < 0) {
            if (failed_++ == 0) std::printf("first failed open: %s\n", strerror(errno));
            continue;
          }
          posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
          const auto start = std::chrono::steady_clock::now();
          std::string got = PreadAll(fd, want[i].size() + 1);
          const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::steady_clock::now() - start)
                                              .count());
          for (int m = longest_ms_; ms > m && !longest_ms_.compare_exchange_weak(m, ms);) {
          }
          close(fd);
          reads_++;
          if (got.size() != want[i].size()) {
            if (failed_++ == 0) std::printf("first short read: %zu bytes\n", got.size());
          } else if (got != want[i]) {
            wrong_++;
          }
        }
      });
    }
  }
  // Stops and joins them; prints and checks: reads happened, none failed or read wrong, the
  // mount was never absent.
  void Finish(const std::string& what) {
    // Enough reads to say something (a loaded machine may have made only a few in the window
    // the caller watched): up to 10 s more.
    for (int i = 0; i < 500 && reads_ <= 10 && failed_ == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop_ = true;
    for (auto& t : readers_) t.join();
    watcher_.join();
    std::printf(
        "%s: %d reads, %d failed, %d wrong, longest read %d ms, mount absent %d times, peer "
        "connections refused %d times\n",
        what.c_str(), reads_.load(), failed_.load(), wrong_.load(), longest_ms_.load(),
        absent_.load(), refused_.load());
    EXPECT_GT(reads_, 10);
    EXPECT_EQ(failed_, 0);
    EXPECT_EQ(wrong_, 0);
    EXPECT_EQ(absent_, 0);
    EXPECT_EQ(refused_, 0);
  }
  int reads() const { return reads_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> reads_{0}, failed_{0}, wrong_{0}, absent_{0}, refused_{0}, longest_ms_{0};
  std::vector<std::thread> readers_;
  std::thread watcher_;
};

// The newest "agent started (pid N)" of a supervisor's log.
pid_t LastAgentPid(const std::string& log) {
  const std::string key = "agent started (pid ";
  size_t at = log.rfind(key);
  if (at == std::string::npos) return -1;
  return static_cast<pid_t>(std::atoi(log.c_str() + at + key.size()));
}

std::string Output(testing::Process& p) { return p.Stdout() + p.Stderr(); }

bool Alive(pid_t pid) { return pid > 0 && kill(pid, 0) == 0; }

// `ember node --supervise`: agent crashes, and the node container's entrypoint started a second
// time on one host, as a DaemonSet's rolling update with maxSurge starts the new pod beside the
// old one.
class SupervisedTest : public PassthroughTest {
 protected:
  void SetUp() override {
    PassthroughTest::SetUp();
    if (IsSkipped()) return;
    for (int i = 0; i < kFiles; i++) {
      WriteRandomFile(absl::StrCat(origin_, "/f", i), (3 + 2 * i) * kMiB + 11, 90 + i);
      want_.push_back(ReadFile(absl::StrCat(origin_, "/f", i)));
    }
    Ember({"dataset", "add", "ds", origin_});
  }
  std::unique_ptr<NodeProcess> StartSupervised(std::vector<std::string> env = {}) {
    NodeProcess::Options o;
    o.extra_args = {"--supervise", "--ready-file", dir_.Sub("ready")};
    o.env = std::move(env);
    auto node = StartNode(o);
    EXPECT_TRUE(testing::WaitFor([&] { return ReadyPid() > 0; }, std::chrono::seconds(10)));
    return node;
  }
  // The pid in the ready file (-1: none).
  pid_t ReadyPid() {
    std::string text = ReadFile(dir_.Sub("ready"));
    return text.empty() ? -1 : static_cast<pid_t>(std::atoi(text.c_str()));
  }
  // Reads f0 once (resident: passthrough from here on) and opens it. Returns: the fd, or -1.
  int KeepResidentOpen(const std::string& mnt) {
    EXPECT_EQ(ReadUncached(mnt + "/f0"), want_[0]);
    return open((mnt + "/f0").c_str(), O_RDONLY);
  }
  // Waits for a successor's agent to serve the mount it took over.
  bool Served(testing::Process& next) {
    bool ok = testing::WaitFor(
        [&] {
          std::string log = Output(next);
          return (log.find("took over") != std::string::npos && ReadyPid() == LastAgentPid(log)) ||
                 !next.Running();
        },
        std::chrono::seconds(60));
    return ok && next.Running();
  }

  static constexpr int kFiles = 4;
  std::vector<std::string> want_;
};

TEST_F(SupervisedTest, CrashedAgentIsReattachedByItsSupervisor) {
  auto node = StartSupervised();
  const std::string mnt = node->mount() + "/ds";
  int kept = KeepResidentOpen(mnt);  // open across every crash
  ASSERT_GE(kept, 0);
  VerifyingReaders readers(mnt, want_, 4, node->listen_address());
  // (EXPECT and break, not ASSERT, inside: the readers must be joined before returning.)
  for (int crash = 0; crash < 3; crash++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    pid_t agent = LastAgentPid(node->Log());
    if (agent <= 0 || kill(agent, SIGKILL) != 0) {
      ADD_FAILURE() << "no agent to kill: " << node->Log();
      break;
    }
    if (!testing::WaitFor([&] { return LastAgentPid(node->Log()) != agent; },
                          std::chrono::seconds(10))) {
      ADD_FAILURE() << "no new agent: " << node->Log();
      break;
    }
    EXPECT_TRUE(testing::WaitFor(
        [&] {
          std::string log = node->Log();
          size_t n = 0;
          for (size_t at = 0; (at = log.find("took over", at)) != std::string::npos; at++) n++;
          return n >= static_cast<size_t>(crash + 1);
        },
        std::chrono::seconds(20)))
        << node->Log();
    std::string got = PreadAll(kept, want_[0].size());
    EXPECT_TRUE(got == want_[0]) << "the file kept open reads wrong after crash " << crash;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  readers.Finish("agent SIGKILLed 3 times under 4 readers");
  close(kept);
  EXPECT_TRUE(testing::IsMounted(node->mount()));
  EXPECT_TRUE(node->Stop()) << node->Log();  // SIGTERM: the supervisor stops the agent, unmounts
}

TEST_F(SupervisedTest, ASecondSupervisorTakesTheMountOverWithoutAGap) {
  auto node = StartSupervised();
  const std::string mnt = node->mount() + "/ds";
  int kept = KeepResidentOpen(mnt);  // open across every upgrade
  ASSERT_GE(kept, 0);
  VerifyingReaders readers(mnt, want_, 4, node->listen_address());
  for (int round = 0; round < 2; round++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const pid_t old_agent = LastAgentPid(node->Log());
    auto next = node->StartTwin();
    if (!Served(*next)) {
      ADD_FAILURE() << "round " << round << ": the successor did not serve: " << Output(*next)
                    << "\nold: " << node->Log();
      break;
    }
    // The old pod's agent is gone; its supervisor waits to be deleted, and then exits cleanly
    // without touching the mount.
    EXPECT_FALSE(Alive(old_agent));
    EXPECT_NE(node->Log().find("waiting to be stopped"), std::string::npos) << node->Log();
    EXPECT_TRUE(node->process().Running());
    node->process().Signal(SIGTERM);
    EXPECT_EQ(node->process().Wait(std::chrono::seconds(20)), 0) << node->Log();
    EXPECT_TRUE(testing::IsMounted(node->mount()));
    node->Replace(std::move(next));
    EXPECT_EQ(PreadAll(kept, want_[0].size()), want_[0]) << "the file kept open, round " << round;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  readers.Finish("2 rolling updates under 4 readers");
  close(kept);
  // The last successor serves new opens and fills as any agent, and stops (unmounts) on SIGTERM.
  for (int i = 0; i < kFiles; i++) EXPECT_EQ(ReadUncached(absl::StrCat(mnt, "/f", i)), want_[i]);
  EXPECT_TRUE(node->Stop()) << node->Log();
  EXPECT_LT(ReadyPid(), 0);
}

// `systemctl reload` after a package upgrade: SIGHUP, and the binary at the supervisor's path
// continues the mount in the same process (the pid a service manager watches stays).
TEST_F(SupervisedTest, AReloadUpgradesTheSupervisorInPlace) {
  auto node = StartSupervised();
  const std::string mnt = node->mount() + "/ds";
  int kept = KeepResidentOpen(mnt);
  ASSERT_GE(kept, 0);
  VerifyingReaders readers(mnt, want_, 4, node->listen_address());
  for (int round = 0; round < 2; round++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const pid_t old_agent = ReadyPid();
    node->process().Signal(SIGHUP);
    bool upgraded = testing::WaitFor(
        [&] {
          std::string log = node->Log();
          size_t n = 0;
          for (size_t at = 0; (at = log.find("upgraded in place", at)) != std::string::npos; at++) {
            n++;
          }
          return (n == static_cast<size_t>(round + 1) && ReadyPid() > 0 &&
                  ReadyPid() != old_agent && ReadyPid() == LastAgentPid(log)) ||
                 !node->process().Running();
        },
        std::chrono::seconds(60));
    if (!upgraded || !node->process().Running()) {
      ADD_FAILURE() << "round " << round << ": " << node->Log();
      break;
    }
    EXPECT_FALSE(Alive(old_agent));
    EXPECT_EQ(PreadAll(kept, want_[0].size()), want_[0]) << "the file kept open, round " << round;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  readers.Finish("2 in-place upgrades under 4 readers");
  close(kept);
  EXPECT_TRUE(node->Stop()) << node->Log();
}

// What systemd does for `systemctl restart` of a Type=notify unit with a file descriptor store
// (sd_notify(3), sd_listen_fds(3)): a datagram socket that takes READY=1 and FDSTORE=1 messages
// with their fds, and passes the stored fds to the next start at fd 3 on (LISTEN_FDS).
class FdStore {
 public:
  explicit FdStore(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
  }
  ~FdStore() {
    for (auto& [name, fd] : stored_) close(fd);
    close(fd_);
  }
  const std::string& path() const { return path_; }
  // Handles messages until `text` arrives or `timeout` passes. Returns: whether it arrived.
  bool WaitFor(const std::string& text, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      std::vector<int> fds;
      ssize_t n = Receive(buf, sizeof(buf), &fds);
      if (n <= 0) continue;
      std::string msg(buf, static_cast<size_t>(n));
      messages_.push_back(msg);
      const size_t at = msg.find("FDNAME=");
      const std::string name = at == std::string::npos ? "" : msg.substr(at + 7);
      if (msg.starts_with("FDSTORE=1") && fds.size() == 1) {
        if (stored_.contains(name)) close(stored_[name]);
        stored_[name] = fds[0];
      } else if (msg.starts_with("FDSTOREREMOVE=1") && stored_.contains(name)) {
        close(stored_[name]);
        stored_.erase(name);
      }
      if (msg.find(text) != std::string::npos) return true;
    }
    return false;
  }
  size_t stored() const { return stored_.size(); }
  // The next start's environment and wrapper: the stored fds at 3, 4, ... (bash's
  // redirections) with LISTEN_PID naming the process that runs the command line.
  std::vector<std::string> ListenEnv() const {
    std::string names;
    for (const auto& [name, fd] : stored_) names += (names.empty() ? "" : ":") + name;
    return {absl::StrCat("LISTEN_FDS=", stored_.size()), "LISTEN_FDNAMES=" + names,
            "NOTIFY_SOCKET=" + path_};
  }
  std::vector<std::string> ListenWrapper() const {
    std::string redirects;
    int at = 3;
    for (const auto& [name, fd] : stored_) {
      fcntl(fd, F_SETFD, 0);  // inherited by the shell, which moves it
      redirects += absl::StrCat(" ", at++, "<&", fd);
    }
    return {"/bin/bash", "-c", "export LISTEN_PID=$$; exec \"$@\"" + redirects, "bash"};
  }
  std::string Messages() const { return absl::StrJoin(messages_, " | "); }

 private:
  // One datagram and the fds that came with it (SCM_RIGHTS).
  ssize_t Receive(char* buf, size_t len, std::vector<int>* fds) {
    iovec iov{buf, len};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd_, &m, MSG_CMSG_CLOEXEC);
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); n > 0 && c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(fd);
      }
    }
    return n;
  }

  std::string path_;
  int fd_ = -1;
  std::map<std::string, int> stored_;  // by name, as LISTEN_FDNAMES lists them
  std::vector<std::string> messages_;
};

TEST_F(SupervisedTest, ARestartUnderSystemdKeepsTheMountInItsFdStore) {
  FdStore manager(dir_.Sub("notify.sock"));
  auto node = StartSupervised({"NOTIFY_SOCKET=" + manager.path(), "EMBER_TEST_RESTART_QUEUED=1"});
  ASSERT_TRUE(manager.WaitFor("READY=1", std::chrono::seconds(10))) << manager.Messages();
  const std::string mnt = node->mount() + "/ds";
  int kept = KeepResidentOpen(mnt);
  ASSERT_GE(kept, 0);
  VerifyingReaders readers(mnt, want_, 4, node->listen_address());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // `systemctl restart`: SIGTERM while a restart job is queued; the supervisor stores the mount
  // and exits; the next start gets it back.
  node->process().Signal(SIGTERM);
  EXPECT_TRUE(manager.WaitFor("FDNAME=ember-state", std::chrono::seconds(30)))
      << manager.Messages() << node->Log();
  EXPECT_EQ(node->process().Wait(std::chrono::seconds(20)), 0) << node->Log();
  EXPECT_EQ(manager.stored(), 3u) << manager.Messages();  // the fuse fd, peers, the state
  EXPECT_TRUE(testing::IsMounted(node->mount()));
  std::vector<std::string> env = manager.ListenEnv();
  env.push_back("EMBER_TEST_RESTART_QUEUED=0");  // its stop below is a plain one
  auto next = node->StartTwin(env, manager.ListenWrapper());
  EXPECT_TRUE(manager.WaitFor("READY=1", std::chrono::seconds(30))) << Output(*next);
  EXPECT_NE(Output(*next).find("the service manager kept across a restart"), std::string::npos)
      << Output(*next);
  // Taken back out of the store once its agent serves.
  EXPECT_TRUE(manager.WaitFor("FDNAME=ember-state", std::chrono::seconds(10)))
      << manager.Messages();
  EXPECT_EQ(manager.stored(), 0u) << manager.Messages();
  node->Replace(std::move(next));
  EXPECT_EQ(PreadAll(kept, want_[0].size()), want_[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  readers.Finish("a systemd restart under 4 readers");
  close(kept);
  // A plain stop (no restart queued) unmounts and stores nothing.
  EXPECT_TRUE(node->Stop()) << node->Log();
  manager.WaitFor("FDSTORE=1", std::chrono::milliseconds(300));
  EXPECT_EQ(manager.stored(), 0u) << manager.Messages();
}

TEST_F(SupervisedTest, TheOldAgentKilledInTheMiddleOfTheHandoverLosesNothing) {
  auto node = StartSupervised();
  const std::string mnt = node->mount() + "/ds";
  ASSERT_EQ(ReadUncached(mnt + "/f1"), want_[1]);
  VerifyingReaders readers(mnt, want_, 4, node->listen_address());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The old agent stops answering (its requests wait in the kernel), the successor asks, and
  // the agent is killed while its supervisor waits for it to hand over.
  const pid_t old_agent = LastAgentPid(node->Log());
  ASSERT_EQ(kill(old_agent, SIGSTOP), 0);
  auto next = node->StartTwin();
  bool asked = testing::WaitFor(
      [&] { return node->Log().find("taking it from the agent") != std::string::npos; },
      std::chrono::seconds(20));
  EXPECT_TRUE(asked) << node->Log();
  kill(old_agent, SIGKILL);
  EXPECT_TRUE(Served(*next)) << Output(*next) << "\nold: " << node->Log();
  EXPECT_NE(node->Log().find("did not hand over"), std::string::npos) << node->Log();
  node->process().Signal(SIGTERM);
  EXPECT_EQ(node->process().Wait(std::chrono::seconds(20)), 0) << node->Log();
  node->Replace(std::move(next));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  readers.Finish("old agent SIGKILLed mid-handover under 4 readers");
  EXPECT_TRUE(testing::IsMounted(node->mount()));
  EXPECT_TRUE(node->Stop()) << node->Log();
}

TEST_F(SupervisedTest, ARefusedUpgradeLeavesTheRunningSupervisorServing) {
  // The running one acts as a release two protocols ahead of this one (a rollback too far).
  auto node =
      StartSupervised({"EMBER_TEST_HANDOVER_PROTOCOL=3:3", "EMBER_TEST_RELOAD_PROTOCOL=1:2"});
  const std::string mnt = node->mount() + "/ds";
  VerifyingReaders readers(mnt, want_, 2);
  const pid_t agent = ReadyPid();
  auto next = node->StartTwin({"EMBER_TEST_HANDOVER_PROTOCOL=1:2"});
  EXPECT_NE(next->Wait(std::chrono::seconds(30)), 0);
  const std::string why = Output(*next);
  EXPECT_NE(why.find("refused to hand its mount over"), std::string::npos) << why;
  EXPECT_NE(why.find("handover protocol 3 and its successor 1-2"), std::string::npos) << why;
  EXPECT_NE(why.find("keeps serving"), std::string::npos) << why;
  // Nor in place: the binary at its path is (made to look) as far apart.
  node->process().Signal(SIGHUP);
  EXPECT_TRUE(testing::WaitFor(
      [&] { return node->Log().find("not upgrading in place") != std::string::npos; },
      std::chrono::seconds(20)))
      << node->Log();
  EXPECT_NE(node->Log().find("speaks handover protocol 1-2 and this one 3-3"), std::string::npos)
      << node->Log();
  // The old one never stopped: the same agent serves, and a later compatible upgrade works.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(ReadyPid(), agent);
  EXPECT_TRUE(Alive(agent));
  auto compatible = node->StartTwin({"EMBER_TEST_HANDOVER_PROTOCOL=2:3"});
  EXPECT_TRUE(Served(*compatible)) << Output(*compatible) << "\nold: " << node->Log();
  node->process().Signal(SIGTERM);
  EXPECT_EQ(node->process().Wait(std::chrono::seconds(20)), 0) << node->Log();
  node->Replace(std::move(compatible));
  readers.Finish("a refused and a compatible upgrade under 2 readers");
  EXPECT_TRUE(node->Stop()) << node->Log();
}

// The release before handover protocol 2 knew one request line and dropped others unanswered:
// a successor asks again its way, and the mount moves as it did then.
TEST_F(SupervisedTest, AnAgentOfTheReleaseBeforeIsTakenOverItsWay) {
  NodeProcess::Options o;
  o.extra_args = {"--takeover"};
  o.env = {"EMBER_TEST_HANDOVER_PROTOCOL=1:1"};
  auto node = StartNode(o);
  const std::string mnt = node->mount() + "/ds";
  VerifyingReaders readers(mnt, want_, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto next = node->StartTwin({"EMBER_TEST_HANDOVER_PROTOCOL=1:2"});
  EXPECT_EQ(node->process().Wait(std::chrono::seconds(30)), 0) << node->Log();
  EXPECT_NE(node->Log().find("ignored a malformed request"), std::string::npos) << node->Log();
  EXPECT_NE(node->Log().find("handed over"), std::string::npos) << node->Log();
  EXPECT_TRUE(testing::WaitFor([&] { return Output(*next).find("took over") != std::string::npos; },
                               std::chrono::seconds(10)))
      << Output(*next);
  node->Replace(std::move(next));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  readers.Finish("a takeover from protocol 1 under 2 readers");
  EXPECT_TRUE(node->Stop()) << node->Log();
}

TEST_F(PassthroughTest, TakeoverWithoutARunningAgentMountsAfresh) {
  WriteRandomFile(origin_ + "/f.bin", kMiB, 5);
  Ember({"dataset", "add", "ds", origin_});
  NodeProcess::Options o;
  o.extra_args = {"--takeover"};
  auto node = StartNode(o);
  EXPECT_NE(node->Log().find("mounting afresh"), std::string::npos) << node->Log();
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/f.bin"), ReadFile(origin_ + "/f.bin"));
  // A stray connection to the takeover socket that is not a successor changes nothing.
  {
    int c = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::string path = node->cache_dir() + "/agent.sock";
    std::memcpy(a.sun_path, path.data(), path.size());
    ASSERT_EQ(connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
    ASSERT_EQ(write(c, "hello there\n", 12), 12);
    close(c);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/f.bin"), ReadFile(origin_ + "/f.bin"));
  EXPECT_NE(node->Log().find("ignored a malformed request"), std::string::npos) << node->Log();
  EXPECT_TRUE(node->Stop()) << node->Log();
}

}  // namespace
}  // namespace ember
