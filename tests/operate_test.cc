// Operating Ember: /metrics checked by promtool and scraped by a real Prometheus, the Grafana
// dashboard against the metrics really exported, the status page in headless Chromium against
// `ember status --json`, systemd units through `systemd-analyze verify`, and the Kubernetes
// manifests against the API schemas (npm kubernetes-models). Each tool is installed by
// tools/install-deps.sh (npm packages by this test into the build dir); a test whose tool is
// missing is skipped with a message saying which.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/cluster.h"
#include "tests/testing/testing.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using testing::HttpGet;
using testing::MetaProcess;
using testing::MetricSample;
using testing::NodeProcess;
using testing::ReadFile;
using testing::ReadUncached;
using testing::RunEmber;
using testing::TempDir;
using testing::WaitFor;
using testing::WriteFile;
using testing::WriteRandomFile;

class OperateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    origin_ = dir_.Sub("origin");
    fs::create_directories(origin_ + "/a");
    for (int i = 0; i < 6; i++) {
      WriteRandomFile(absl::StrCat(origin_, "/a/f", i, ".bin"), (3 << 20) + i * 100, 40 + i);
    }
    http_ = absl::StrCat("127.0.0.1:", testing::FreePort());
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), "3s",
                                          std::vector<std::string>{"--http", http_});
    auto r = RunEmber({"dataset", "add", "ds", origin_, "--meta", meta_->address()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  std::unique_ptr<NodeProcess> Node(const std::string& id, int host, std::string* metrics) {
    NodeProcess::Options o;
    o.id = id;
    o.listen_host = absl::StrCat("127.0.0.", host);
    o.cache_size = "256MiB";
    *metrics = absl::StrCat("127.0.0.1:", testing::FreePort());
    o.extra_args = {"--metrics-listen", *metrics, "--labels", "rack=r" + std::to_string(host)};
    auto n = std::make_unique<NodeProcess>(dir_.Sub(id), meta_->address(), o);
    EXPECT_TRUE(n->Start());
    return n;
  }

  TempDir dir_;
  std::string origin_, http_;
  std::unique_ptr<MetaProcess> meta_;
};

TEST_F(OperateTest, MetricsAreRightAndPassPromtool) {
  std::string maddr;
  auto n = Node("n1", 2, &maddr);
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ(ReadUncached(absl::StrCat(n->mount(), "/ds/a/f", i, ".bin")),
              ReadFile(absl::StrCat(origin_, "/a/f", i, ".bin")));
  }
  n->SettledStats(meta_->client(), std::chrono::milliseconds(700));
  std::string node = HttpGet(maddr, "/metrics"), meta = HttpGet(http_, "/metrics");
  ASSERT_FALSE(node.empty());
  ASSERT_FALSE(meta.empty());
  uint64_t origin_bytes = 0;
  for (int i = 0; i < 3; i++) origin_bytes += (3 << 20) + i * 100;
  EXPECT_EQ(MetricSample(node, "ember_cache_capacity_bytes"), 256.0 * (1 << 20));
  EXPECT_EQ(MetricSample(node, "ember_cache_used_bytes"), static_cast<double>(origin_bytes));
  EXPECT_EQ(MetricSample(node, "ember_read_bytes_total{source=\"origin\"}"),
            static_cast<double>(origin_bytes));
  EXPECT_EQ(MetricSample(node, "ember_cache_resident_blocks"), 3);
  EXPECT_EQ(MetricSample(node, "ember_fill_seconds_count{source=\"origin\"}"), 3);
  EXPECT_GE(MetricSample(node, "ember_fuse_request_seconds_count{op=\"read\"}"), 3);
  EXPECT_EQ(MetricSample(node, "ember_peer_errors_total{kind=\"timeout\"}"), 0);
  EXPECT_GE(MetricSample(node, "ember_meta_client_seconds_count{request=\"HeartbeatRequest\"}"), 1);
  EXPECT_EQ(MetricSample(meta, "ember_meta_nodes{state=\"alive\"}"), 1);
  EXPECT_EQ(MetricSample(meta, "ember_meta_datasets"), 1);
  EXPECT_EQ(MetricSample(meta, "ember_scheduler_queue_length"), 0);
  EXPECT_GE(MetricSample(meta, "ember_meta_rpc_seconds_count{method=\"Heartbeat\"}"), 1);
  // A lease expiry is counted: stop the node and wait past the 3 s lease.
  ASSERT_TRUE(n->Stop());
  EXPECT_TRUE(WaitFor(
      [&] {
        return MetricSample(HttpGet(http_, "/metrics"), "ember_meta_lease_expiries_total") == 1;
      },
      std::chrono::seconds(10)));

  if (!testing::HaveCommand("promtool"))
    GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  for (const auto& [name, text] : {std::pair{"node", node}, std::pair{"meta", meta}}) {
    WriteFile(dir_.Sub(std::string(name) + ".prom"), text);
    std::string out;
    int rc = testing::RunShell("promtool check metrics < " + dir_.Sub(std::string(name) + ".prom"),
                               &out);
    EXPECT_EQ(rc, 0) << name << ": " << out;
    EXPECT_EQ(out, "") << name << " lint findings: " << out;
  }
}

// Listings are plain READDIR by default (find/scandir need only names and types); with
// --readdirplus they carry attributes, and a stat of every listed entry needs no LOOKUP.
TEST_F(OperateTest, ReaddirplusOnlyWhenAskedFor) {
  for (bool plus : {false, true}) {
    std::string maddr;
    NodeProcess::Options o;
    o.id = plus ? "plus" : "plain";
    o.cache_size = "64MiB";
    maddr = absl::StrCat("127.0.0.1:", testing::FreePort());
    o.extra_args = {"--metrics-listen", maddr, "--fuse-no-open"};
    if (plus) o.extra_args.push_back("--readdirplus");
    NodeProcess n(dir_.Sub(o.id), meta_->address(), o);
    ASSERT_TRUE(n.Start());
    auto ops = [&](const std::string& op) {
      return MetricSample(HttpGet(maddr, "/metrics"),
                          absl::StrCat("ember_fuse_request_seconds_count{op=\"", op, "\"}"));
    };
    const double lookups_before = std::max(0.0, ops("lookup"));
    int listed = 0;
    for (auto& e : fs::directory_iterator(n.mount() + "/ds/a")) {
      struct stat st;
      ASSERT_EQ(stat(e.path().c_str(), &st), 0);
      EXPECT_GE(st.st_size, 3 << 20);
      listed++;
    }
    EXPECT_EQ(listed, 6);
    const double lookups = std::max(0.0, ops("lookup")) - lookups_before;
    if (plus) {
      EXPECT_GT(ops("readdirplus"), 0) << "--readdirplus was not used";
      EXPECT_LT(lookups, 6) << "a stat after a readdirplus listing looked entries up again";
    } else {
      EXPECT_GT(ops("readdir"), 0);
      EXPECT_LE(ops("readdirplus"), 0);
      EXPECT_GE(lookups, 6) << "plain listings carry no attributes: each stat is a LOOKUP";
    }
    ASSERT_TRUE(n.Stop()) << n.Log();
  }
}

// --fuse-no-open: the first OPEN is answered ENOSYS and the kernel sends neither OPEN nor RELEASE
// after it. Files read right (small ones, and a file of several blocks through its inode's read
// state), a file in the mount's page cache is read again with no request at all, write opens
// still fail, and nothing goes through passthrough.
TEST_F(OperateTest, NoOpenMountReadsFilesWithoutOpenRequests) {
  const std::string origin = dir_.Sub("small-origin");
  fs::create_directories(origin + "/d");
  for (int i = 0; i < 20; i++) {
    WriteRandomFile(absl::StrCat(origin, "/d/s", i, ".bin"), 1000 + i * 37, 70 + i);
  }
  WriteRandomFile(origin + "/big.bin", (9 << 20) + 5, 99);
  auto add = RunEmber({"dataset", "add", "small", origin, "--meta", meta_->address()});
  ASSERT_EQ(add.exit_code, 0) << add.err;
  NodeProcess::Options o;
  o.id = "noopen";
  o.cache_size = "64MiB";
  const std::string maddr = absl::StrCat("127.0.0.1:", testing::FreePort());
  o.extra_args = {"--metrics-listen", maddr, "--fuse-no-open"};
  NodeProcess n(dir_.Sub(o.id), meta_->address(), o);
  ASSERT_TRUE(n.Start());
  auto metric = [&](const std::string& series) {
    return std::max(0.0, MetricSample(HttpGet(maddr, "/metrics"), series));
  };
  auto ops = [&](const std::string& op) {
    return metric(absl::StrCat("ember_fuse_request_seconds_count{op=\"", op, "\"}"));
  };
  const std::string root = n.mount() + "/small";
  double reads_after_first = 0;
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 20; i++) {
      ASSERT_EQ(ReadFile(absl::StrCat(root, "/d/s", i, ".bin")),
                ReadFile(absl::StrCat(origin, "/d/s", i, ".bin")))
          << "file " << i << " round " << round;
    }
    if (round == 0) reads_after_first = ops("read");
  }
  EXPECT_GE(reads_after_first, 20);
  EXPECT_EQ(ops("read"), reads_after_first) << "files in the page cache were read again";
  ASSERT_EQ(ReadFile(root + "/big.bin"), ReadFile(origin + "/big.bin"));
  EXPECT_LE(ops("open"), 1) << "the kernel kept sending OPEN";
  EXPECT_EQ(ops("release"), 0);
  EXPECT_EQ(metric("ember_fuse_opens_total{mode=\"passthrough\"}"), 0);
  errno = 0;
  EXPECT_EQ(open((root + "/d/s0.bin").c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EROFS);
  // A name absent from the mount's root is asked every time (a dataset may be added under that
  // name); only the root directory is walked, so nothing else is asked.
  double lookups = ops("lookup");
  struct stat st;
  for (int i = 0; i < 3; i++) {
    EXPECT_NE(stat((n.mount() + "/missing").c_str(), &st), 0);
    EXPECT_EQ(errno, ENOENT);
  }
  testing::WaitFor([&] { return ops("lookup") >= lookups + 3; }, std::chrono::seconds(2));
  EXPECT_EQ(ops("lookup"), lookups + 3);
  // A name absent from a dataset's directory is asked once and kept as a negative entry. The
  // walk also revalidates the dataset's own entry in the root, kept 1 s: at most one lookup
  // more for each second the stats take (a loaded machine may stall them).
  lookups = ops("lookup");
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kStats = 10;
  for (int i = 0; i < kStats; i++) {
    EXPECT_NE(stat((root + "/d/missing").c_str(), &st), 0);
    EXPECT_EQ(errno, ENOENT);
  }
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  testing::WaitFor([&] { return ops("lookup") >= lookups + 1; }, std::chrono::seconds(2));
  const double asked = ops("lookup") - lookups;
  EXPECT_GE(asked, 1);
  EXPECT_LE(asked, 2 + std::floor(took_s))
      << "the negative entry was not kept (" << kStats << " stats took " << took_s << " s)";
  ASSERT_TRUE(n.Stop()) << n.Log();
}

// --fuse-request-size: a large read() of a file the agent serves comes in READ requests of that
// size (4 MiB by default, a whole block each; the agent raises fs.fuse.max_pages_limit, as root,
// where the kernel has it), and of 1 MiB when that is asked for.
TEST_F(OperateTest, ReadRequestsAreAsLargeAsTheNodeAsks) {
  const std::string origin = dir_.Sub("big-origin");
  fs::create_directories(origin);
  constexpr size_t kSize = 16 << 20;
  WriteRandomFile(origin + "/big.bin", kSize, 7);
  auto add = RunEmber({"dataset", "add", "big", origin, "--meta", meta_->address()});
  ASSERT_EQ(add.exit_code, 0) << add.err;
  const bool can_raise = fs::exists("/proc/sys/fs/fuse/max_pages_limit") && geteuid() == 0;
  for (const char* size : {"4MiB", "1MiB"}) {
    NodeProcess::Options o;
    o.id = absl::StrCat("rq", size);
    o.cache_size = "64MiB";
    const std::string maddr = absl::StrCat("127.0.0.1:", testing::FreePort());
    // No opens: nothing goes through passthrough once the file is resident.
    o.extra_args = {"--metrics-listen", maddr, "--fuse-no-open", "--fuse-request-size", size};
    NodeProcess n(dir_.Sub(o.id), meta_->address(), o);
    ASSERT_TRUE(n.Start());
    auto reads = [&] {
      return std::max(0.0, MetricSample(HttpGet(maddr, "/metrics"),
                                        "ember_fuse_request_seconds_count{op=\"read\"}"));
    };
    const std::string path = n.mount() + "/big/big.bin";
    ASSERT_EQ(ReadFile(path), ReadFile(origin + "/big.bin"));  // now resident on the node
    int fd = open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    const double before = reads();
    std::string buf(kSize, '\0');
    ASSERT_EQ(pread(fd, buf.data(), kSize, 0), static_cast<ssize_t>(kSize));
    close(fd);
    EXPECT_EQ(buf, ReadFile(origin + "/big.bin"));
    const double asked = reads() - before;
    if (std::string(size) == "1MiB") {
      EXPECT_GE(asked, 16) << "requests larger than the 1 MiB asked for";
    } else if (can_raise) {
      EXPECT_GE(asked, 4);
      EXPECT_LE(asked, 6) << "a 16 MiB read took " << asked << " requests, not 4 MiB ones";
    }
    ASSERT_TRUE(n.Stop()) << n.Log();
  }
}

TEST_F(OperateTest, PrometheusScrapesANodeAndAnswersAQuery) {
  if (!fs::exists("/usr/bin/prometheus"))
    GTEST_SKIP() << "prometheus not installed (Debian package prometheus)";
  std::string maddr;
  auto n = Node("n1", 2, &maddr);
  ASSERT_EQ(ReadUncached(n->mount() + "/ds/a/f0.bin"), ReadFile(origin_ + "/a/f0.bin"));
  std::string prom = absl::StrCat("127.0.0.1:", testing::FreePort());
  WriteFile(dir_.Sub("prometheus.yml"),
            absl::StrCat("global:\n  scrape_interval: 1s\nscrape_configs:\n"
                         "  - job_name: ember-node\n    static_configs:\n      - targets: ['",
                         maddr,
                         "']\n  - job_name: ember-meta\n    static_configs:\n"
                         "      - targets: ['",
                         http_, "']\n"));
  testing::Process p({"/usr/bin/prometheus", "--config.file=" + dir_.Sub("prometheus.yml"),
                      "--storage.tsdb.path=" + dir_.Sub("tsdb"), "--web.listen-address=" + prom},
                     dir_.Sub("prometheus"));
  double got = -1, alive = -1;
  bool answered = WaitFor(
      [&] {
        auto parse = [&](const std::string& q) {
          std::string body = HttpGet(prom, "/api/v1/query?query=" + q);
          if (body.empty()) return -1.0;
          auto j = nlohmann::json::parse(body, nullptr, false);
          if (j.is_discarded() || j["data"]["result"].empty()) return -1.0;
          return std::stod(j["data"]["result"][0]["value"][1].get<std::string>());
        };
        got = parse("ember_cache_capacity_bytes");
        alive = parse("ember_meta_nodes%7Bstate%3D%22alive%22%7D");
        return got > 0 && alive > 0;
      },
      std::chrono::seconds(40));
  EXPECT_TRUE(answered) << p.Stderr().substr(0, 2000);
  EXPECT_EQ(got, 256.0 * (1 << 20));
  EXPECT_EQ(alive, 1);
}

// NAME and NAME@V of the same version share one manifest table in the agent's memory.
TEST_F(OperateTest, ManifestOfAVersionIsHeldOnceWhateverItIsCalled) {
  std::string maddr;
  auto n = Node("n1", 2, &maddr);
  auto entries = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // figures are 500 ms fresh
    return MetricSample(HttpGet(maddr, "/metrics"), "ember_manifest_entries");
  };
  EXPECT_EQ(entries(), 0);
  ASSERT_EQ(ReadFile(n->mount() + "/ds/a/f1.bin"), ReadFile(origin_ + "/a/f1.bin"));
  EXPECT_EQ(entries(), 8);  // the root, a/ and 6 files
  ASSERT_EQ(ReadFile(n->mount() + "/ds@1/a/f2.bin"), ReadFile(origin_ + "/a/f2.bin"));
  EXPECT_EQ(entries(), 8) << "the version's manifest is held twice";
  std::vector<std::string> listed;
  for (const auto& e : fs::directory_iterator(n->mount() + "/ds@1/a")) {
    listed.push_back(e.path().filename());
  }
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(listed,
            (std::vector<std::string>{"f0.bin", "f1.bin", "f2.bin", "f3.bin", "f4.bin", "f5.bin"}));
  const double bytes = MetricSample(HttpGet(maddr, "/metrics"), "ember_manifest_memory_bytes");
  EXPECT_GT(bytes, 8 * 40);
  EXPECT_LT(bytes, 8 * 200);
}

TEST_F(OperateTest, GrafanaDashboardUsesOnlyExportedMetrics) {
  std::string maddr;
  auto n = Node("n1", 2, &maddr);
  ASSERT_EQ(ReadUncached(n->mount() + "/ds/a/f0.bin"), ReadFile(origin_ + "/a/f0.bin"));
  std::string exported = HttpGet(maddr, "/metrics") + HttpGet(http_, "/metrics");
  // Every family declared (# TYPE), also those without samples yet, and histogram series.
  std::set<std::string> names;
  std::regex family("# TYPE (ember_[a-z_]+) ([a-z]+)");
  for (auto it = std::sregex_iterator(exported.begin(), exported.end(), family);
       it != std::sregex_iterator(); ++it) {
    std::string name = (*it)[1];
    names.insert(name);
    if ((*it)[2] == "histogram") {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) names.insert(name + suffix);
    }
  }
  auto dash =
      nlohmann::json::parse(ReadFile(EMBER_SOURCE_DIR "/deploy/grafana/ember-dashboard.json"));
  int exprs = 0;
  std::regex used("ember_[a-z_]+");
  for (const auto& panel : dash["panels"]) {
    for (const auto& t : panel["targets"]) {
      std::string expr = t["expr"];
      exprs++;
      for (auto it = std::sregex_iterator(expr.begin(), expr.end(), used);
           it != std::sregex_iterator(); ++it) {
        EXPECT_TRUE(names.count(it->str()))
            << panel["title"] << " uses " << it->str() << ", which nothing exports";
      }
    }
  }
  EXPECT_GE(exprs, 10);
}

TEST_F(OperateTest, StatusPageInHeadlessChromiumMatchesEmberStatus) {
  std::string chromium = testing::HaveCommand("chromium")           ? "chromium"
                         : testing::HaveCommand("chromium-browser") ? "chromium-browser"
                                                                    : "";
  if (chromium.empty()) GTEST_SKIP() << "chromium not installed (Debian package chromium)";
  std::string m1, m2, m3;
  auto a = Node("a", 2, &m1);
  auto b = Node("b", 3, &m2);
  auto c = Node("c", 4, &m3);
  // Different amounts on each node: a everything, b two files, c none.
  for (int i = 0; i < 6; i++) ReadUncached(absl::StrCat(a->mount(), "/ds/a/f", i, ".bin"));
  for (int i = 0; i < 2; i++) ReadUncached(absl::StrCat(b->mount(), "/ds/a/f", i, ".bin"));
  for (auto* n : {a.get(), b.get(), c.get()})
    n->SettledStats(meta_->client(), std::chrono::milliseconds(700));
  std::string dom;
  int rc =
      testing::RunShell(chromium +
                            " --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 "
                            "--dump-dom http://" +
                            http_ + "/",
                        &dom);
  ASSERT_EQ(rc, 0) << dom.substr(0, 2000);
  ASSERT_NE(dom.find("data-loaded=\"1\""), std::string::npos) << "page did not render";
  auto status = RunEmber({"status", "--json", "--meta", meta_->address()});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  auto j = nlohmann::json::parse(status.out);
  ASSERT_EQ(j["nodes"].size(), 3u);
  int compared = 0;
  for (const auto& n : j["nodes"]) {
    std::string id = n["id"];
    size_t row = dom.find("<tr data-node=\"" + id + "\">");
    ASSERT_NE(row, std::string::npos) << id;
    std::string tr = dom.substr(row, dom.find("</tr>", row) - row);
    for (const char* field : {"used_bytes", "resident_blocks", "bytes_from_cache",
                              "bytes_from_peers", "bytes_from_origin", "peer_errors", "gpus"}) {
      std::smatch m;
      std::regex re(std::string("data-field=\"") + field + "\" data-value=\"([0-9]+)\"");
      ASSERT_TRUE(std::regex_search(tr, m, re)) << id << " " << field;
      EXPECT_EQ(std::stoull(m[1]), n[field].get<uint64_t>()) << id << " " << field;
      compared++;
    }
    EXPECT_NE(tr.find("data-value=\"alive\""), std::string::npos) << id;
  }
  EXPECT_EQ(compared, 21);
  // The heat map: a holds all of ds, c none, b a third.
  auto heat = [&](const std::string& node) {
    std::smatch m;
    std::regex re("data-dataset=\"ds\" data-node=\"" + node + "\" data-value=\"([0-9.]+)\"");
    return std::regex_search(dom, m, re) ? std::stod(m[1]) : -1.0;
  };
  EXPECT_DOUBLE_EQ(heat("a"), 1.0);
  EXPECT_DOUBLE_EQ(heat("c"), 0.0);
  EXPECT_NEAR(heat("b"), 2.0 / 6, 0.01);
  std::string shot = fs::current_path().string() + "/status-page.png";
  rc = testing::RunShell(chromium +
                             " --headless --no-sandbox --disable-gpu --hide-scrollbars "
                             "--virtual-time-budget=5000 --window-size=1300,900 --screenshot=" +
                             shot + " http://" + http_ + "/",
                         &dom);
  EXPECT_EQ(rc, 0) << dom;
  EXPECT_GT(fs::exists(shot) ? fs::file_size(shot) : 0, 10000u);
  std::printf("status page screenshot: %s\n", shot.c_str());
}

// The suite's "read and store" row is the ceiling Ember's cold reads are judged against: it
// must really read and store every byte, as 4 MiB chunks, and fail on a file it cannot read.
TEST(BenchToolsTest, ReadAndStoreBaselineStoresEveryChunk) {
  TempDir dir;
  const size_t kChunk = 4 << 20;
  std::vector<std::pair<std::string, size_t>> files = {
      {"one-byte", 1}, {"one-chunk", kChunk}, {"three-chunks", 2 * kChunk + 123}, {"empty", 0}};
  std::vector<std::string> want;
  std::string list;
  for (size_t i = 0; i < files.size(); i++) {
    std::string path = dir.Sub(files[i].first);
    testing::WriteRandomFile(path, files[i].second, 40 + i);
    std::string data = ReadFile(path);
    for (size_t at = 0; at < data.size(); at += kChunk) want.push_back(data.substr(at, kChunk));
    list += path + "\n";
  }
  WriteFile(dir.Sub("list"), list);
  const std::string bench = EMBER_BUILD_DIR "/bin/read_bench store " + dir.Sub("list");
  std::string out;
  ASSERT_EQ(testing::RunShell(bench + " 2 0 " + dir.Sub("stored") + " mib", &out), 0) << out;
  EXPECT_GT(std::stod(out), 0.0) << out;
  std::vector<std::string> got;
  for (const auto& e : fs::directory_iterator(dir.Sub("stored"))) {
    got.push_back(ReadFile(e.path().string()));
  }
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got.size(), 5u);
  EXPECT_TRUE(got == want) << "the stored chunks differ from the files' 4 MiB pieces";

  WriteFile(dir.Sub("list"), list + dir.Sub("missing") + "\n");
  EXPECT_NE(testing::RunShell(bench + " 2 0 " + dir.Sub("stored2") + " files", &out), 0) << out;
  EXPECT_NE(out.find("failed"), std::string::npos) << out;
}

TEST(DeployTest, SystemdUnitsVerify) {
  if (!testing::HaveCommand("systemd-analyze")) GTEST_SKIP() << "systemd-analyze not installed";
  TempDir dir;
  std::string units;
  for (const char* unit : {"ember-meta.service", "ember-node.service"}) {
    std::string text = ReadFile(std::string(EMBER_SOURCE_DIR "/deploy/systemd/") + unit);
    ASSERT_FALSE(text.empty()) << unit;
    // verify checks that ExecStart exists: point it at the binary built here.
    for (size_t at; (at = text.find("/usr/local/bin/ember")) != std::string::npos;) {
      text.replace(at, 20, EMBER_BINARY);
    }
    WriteFile(dir.Sub(unit), text);
    units += " " + dir.Sub(unit);
  }
  std::string out;
  int rc = testing::RunShell("systemd-analyze verify" + units, &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "") << "findings: " << out;
}

TEST(DeployTest, KubernetesManifestsMatchTheApiSchemas) {
  if (!testing::HaveCommand("node") || !testing::HaveCommand("npm"))
    GTEST_SKIP() << "node/npm not installed";
  // Installed once per build dir; offline afterwards.
  std::string npm_dir = EMBER_BUILD_DIR "/npm-k8s";
  std::string out;
  if (testing::NpmInstallOnce(npm_dir, "kubernetes-models@4 yaml@2",
                              "node_modules/kubernetes-models", &out) != 0) {
    GTEST_SKIP() << "cannot install npm kubernetes-models: " << out;
  }
  fs::copy_file(EMBER_SOURCE_DIR "/tests/k8s/validate.mjs", npm_dir + "/validate.mjs",
                fs::copy_options::overwrite_existing);
  std::string files;
  int n = 0;
  for (const auto& e : fs::directory_iterator(EMBER_SOURCE_DIR "/deploy/kubernetes")) {
    if (e.path().extension() == ".yaml") {
      files += " " + e.path().string();
      n++;
    }
  }
  ASSERT_GE(n, 6);
  int rc = testing::RunShell("cd " + npm_dir + " && node validate.mjs" + files, &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("DaemonSet/ember-node"), std::string::npos) << out;
  EXPECT_NE(out.find("StatefulSet/ember-meta"), std::string::npos) << out;
  // Meta as replicas: etcd and meta StatefulSets with their disruption budgets.
  EXPECT_NE(out.find("meta-replicas.yaml: StatefulSet/ember-etcd"), std::string::npos) << out;
  EXPECT_NE(out.find("meta-replicas.yaml: PodDisruptionBudget/ember-meta"), std::string::npos)
      << out;
  // Datasets as volumes (#24): the CSI driver, its node plugin (a DaemonSet of its own), the
  // webhook.
  EXPECT_NE(out.find("node-daemonset.yaml: DaemonSet/ember-csi-node"), std::string::npos) << out;
  EXPECT_NE(out.find("csi-driver.yaml: CSIDriver/csi.ember.io"), std::string::npos) << out;
  EXPECT_NE(out.find("webhook.yaml: MutatingWebhookConfiguration/ember-placement"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("example-dataset-pod.yaml: Pod/resnet-inline"), std::string::npos) << out;
  // The validator does reject a broken manifest.
  TempDir dir;
  std::string bad = ReadFile(EMBER_SOURCE_DIR "/deploy/kubernetes/meta.yaml");
  bad.replace(bad.find("containerPort: 7370"), 19, "containerPort: \"x\"");
  WriteFile(dir.Sub("bad.yaml"), bad);
  EXPECT_NE(
      testing::RunShell("cd " + npm_dir + " && node validate.mjs " + dir.Sub("bad.yaml"), &out), 0)
      << out;
}

// The node DaemonSet as an upgrade needs it (#27): the new pod starts beside the old one and
// takes its mount over; nothing in the pod's spec may keep the two apart or unmount.
TEST(DeployTest, TheNodeDaemonSetUpgradesBesideTheOldPodWithoutUnmounting) {
  std::vector<YAML::Node> docs =
      YAML::LoadAllFromFile(EMBER_SOURCE_DIR "/deploy/kubernetes/node-daemonset.yaml");
  YAML::Node node, csi;
  for (const auto& d : docs) {
    if (d["kind"].as<std::string>() != "DaemonSet") continue;
    (d["metadata"]["name"].as<std::string>() == "ember-node" ? node : csi) = d;
  }
  ASSERT_TRUE(node && csi);
  EXPECT_EQ(csi["metadata"]["name"].as<std::string>(), "ember-csi-node");
  auto rolling = node["spec"]["updateStrategy"]["rollingUpdate"];
  EXPECT_EQ(rolling["maxSurge"].as<int>(), 1);
  EXPECT_EQ(rolling["maxUnavailable"].as<int>(), 0);
  auto pod = node["spec"]["template"]["spec"];
  EXPECT_TRUE(pod["hostNetwork"].as<bool>());
  ASSERT_EQ(pod["containers"].size(), 1u);  // the CSI plugin's registrar cannot surge
  auto agent = pod["containers"][0];
  EXPECT_FALSE(agent["ports"]) << "a declared hostPort keeps the surge pod off the node";
  EXPECT_FALSE(agent["lifecycle"]) << "no preStop unmount: the successor has the mount";
  const std::string command = agent["args"][0].as<std::string>();
  EXPECT_NE(command.find("--supervise --ready-file /run/ember-ready"), std::string::npos)
      << command;
  const std::string probe = agent["readinessProbe"]["exec"]["command"][2].as<std::string>();
  EXPECT_NE(probe.find("/run/ember-ready"), std::string::npos) << probe;
  // The cache dir (where the supervisors meet) is the node's, shared by both pods.
  bool cache_on_host = false;
  for (const auto& v : pod["volumes"]) {
    if (v["name"].as<std::string>() == "cache") cache_on_host = static_cast<bool>(v["hostPath"]);
  }
  EXPECT_TRUE(cache_on_host);
  // The CSI plugin updates one node at a time, without surge.
  EXPECT_FALSE(csi["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"]);
}

}  // namespace
}  // namespace ember
