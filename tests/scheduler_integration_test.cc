// The scheduler through a real `ember meta`: simulated nodes registered through the API (as the
// scale tests do), real node agents where data must really move, the CLI, and the extender over
// HTTP on 127.0.0.1.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/escaping.h"
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
using testing::WriteFile;
using testing::WriteRandomFile;

class SchedulerTest : public ::testing::Test {
 protected:
  // More `ember meta` flags (a subclass's).
  virtual std::vector<std::string> MetaArgs() { return {}; }
  void SetUp() override {
    http_port_ = testing::FreePort();
    std::vector<std::string> args{"--http", absl::StrCat("127.0.0.1:", http_port_)};
    for (std::string& a : MetaArgs()) args.push_back(std::move(a));
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), "1500ms", args);
    fs::create_directories(dir_.Sub("origin"));
    for (int i = 0; i < 4; i++) {
      WriteRandomFile(dir_.Sub(absl::StrCat("origin/part-", i)), 3 << 20, i);
    }
    ASSERT_EQ(Ember({"dataset", "add", "ds", dir_.Sub("origin")}).exit_code, 0);
    ds_id_ = json::parse(Ember({"dataset", "show", "ds", "--json"}).out)["id"];
  }
  void TearDown() override {
    stop_ = true;
    if (beater_.joinable()) beater_.join();
  }

  testing::RunResult Ember(std::vector<std::string> args) {
    args.push_back("--meta");
    args.push_back(meta_->address());
    return RunEmber(args);
  }

  // Registers simulated nodes (no agents) and keeps them alive, except those in `silent_`.
  void SimulatedNodes(int switches, int per_switch, uint32_t gpus) {
    for (int s = 0; s < switches; s++) {
      for (int i = 0; i < per_switch; i++) {
        rpc::Node n;
        n.set_id(absl::StrCat("s", s, "n", i));
        n.set_address(absl::StrCat("127.0.0.1:", 20000 + s * 100 + i));
        (*n.mutable_labels())["switch"] = absl::StrCat("s", s);
        (*n.mutable_labels())["rack"] = absl::StrCat("r", s / 2);
        n.set_gpus(gpus);
        ASSERT_TRUE(meta_->client().RegisterNode(n).ok());
        ids_.push_back(n.id());
      }
    }
    beater_ = std::thread([this] {
      while (!stop_) {
        for (const auto& id : ids_) {
          if (!silent_.count(id)) (void)meta_->client().Heartbeat(id, rpc::NodeStats());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }

  // Marks every block of the dataset resident on `node` (a full bitmap report).
  void Warm(const std::string& node) {
    rpc::ReportBlocksRequest r;
    r.set_node_id(node);
    for (uint64_t f = 2; f <= 5; f++) {  // file ids of part-0..3 (root is 1)
      auto* fb = r.add_files();
      fb->set_dataset_id(ds_id_);
      fb->set_version(1);
      fb->set_file_id(f);
      fb->set_bitmap(std::string(1, '\x01'));  // one 4 MiB block per 3 MiB file
    }
    ASSERT_TRUE(meta_->client().ReportBlocks(r).ok());
  }

  json Submit(const std::string& yaml) {
    static int n = 0;
    std::string path = dir_.Sub(absl::StrCat("job", n++, ".yaml"));
    WriteFile(path, yaml);
    auto r = Ember({"job", "submit", path, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out) : json();
  }

  json Show(const std::string& id) { return json::parse(Ember({"job", "show", id, "--json"}).out); }

  TempDir dir_;
  int http_port_ = 0;
  uint32_t ds_id_ = 0;
  std::unique_ptr<MetaProcess> meta_;
  std::vector<std::string> ids_;
  std::set<std::string> silent_;
  std::atomic<bool> stop_{false};
  std::thread beater_;
};

TEST_F(SchedulerTest, LocalityGangTopologyAndQueue) {
  SimulatedNodes(3, 4, 8);
  Warm("s2n1");
  Warm("s2n3");
  json j = Submit("name: bert\nworkers: 2\ngpus: 8\ndataset: ds\ntopology: same-switch\n");
  EXPECT_EQ(j["state"], "running");
  std::set<std::string> on;
  for (auto& w : j["workers"]) on.insert(w["node"]);
  EXPECT_EQ(on, (std::set<std::string>{"s2n1", "s2n3"}));  // where the data is
  EXPECT_DOUBLE_EQ(j["chosen"]["locality"].get<double>(), 1.0);
  EXPECT_EQ(j["chosen"]["switches"], 1);
  EXPECT_FALSE(j["runners_up"].empty());  // the explanation lists alternatives
  auto show = Ember({"job", "show", "bert"});
  EXPECT_NE(show.out.find("runner-up"), std::string::npos) << show.out;

  // Fill the cluster: 10 more nodes' worth of 8-GPU workers fit, the 11th gang waits.
  json big = Submit("name: big\nworkers: 10\ngpus: 8\n");
  EXPECT_EQ(big["state"], "running");
  json waiting = Submit("name: waits\nworkers: 2\ngpus: 8\n");
  EXPECT_EQ(waiting["state"], "queued");
  // A small job backfills while the head waits? No GPUs are free at all, so it queues too.
  json small = Submit("name: small\nworkers: 1\ngpus: 8\n");
  EXPECT_EQ(small["state"], "queued");
  // Completing `bert` frees two nodes: the head (2 x 8) starts first, FIFO.
  ASSERT_EQ(Ember({"job", "complete", "bert"}).exit_code, 0);
  EXPECT_EQ(Show("waits")["state"], "running");
  EXPECT_EQ(Show("small")["state"], "queued");
  // Never oversubscribed: GPUs in use <= GPUs per node.
  json ls = json::parse(Ember({"job", "ls", "--json"}).out);
  std::map<std::string, int> used;
  for (auto& job : ls["jobs"]) {
    if (job["state"] != "running") continue;
    for (auto& w : job["workers"]) used[w["node"]] += job["gpus_per_worker"].get<int>();
  }
  for (auto& [node, g] : used) EXPECT_LE(g, 8) << node;
  EXPECT_EQ(ls["queue_length"], 1);
}

TEST_F(SchedulerTest, DeadNodesWorkerIsReplaced) {
  SimulatedNodes(2, 3, 8);
  Warm("s0n0");
  Warm("s0n2");
  json j = Submit("name: resnet\nworkers: 2\ngpus: 8\ndataset: ds\n");
  ASSERT_EQ(j["state"], "running");
  std::string victim = j["workers"][0]["node"];
  silent_.insert(victim);  // its heartbeats stop: the lease (1.5 s) expires
  json after;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        after = Show("resnet");
        for (auto& w : after["workers"]) {
          if (w["node"] == victim) return false;
        }
        return true;
      },
      std::chrono::seconds(10)));
  bool recorded = false;
  for (auto& e : after["events"]) {
    std::string s = e;
    if (s.find("moved from " + victim) != std::string::npos &&
        s.find("ms after the node's lease expired") != std::string::npos) {
      recorded = true;
      std::printf("recovery event: %s\n", s.c_str());
    }
  }
  EXPECT_TRUE(recorded) << after.dump(2);
  // The new node is on the same switch as the dead one (nearest), and alive.
  std::string moved_to = after["workers"][0]["node"];
  EXPECT_EQ(moved_to.substr(0, 2), victim.substr(0, 2));
}

TEST_F(SchedulerTest, ExtenderOverHttp) {
  SimulatedNodes(1, 3, 8);
  Warm("s0n1");
  httplib::Client http("127.0.0.1", http_port_);
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", "p"},
                {"namespace", "default"},
                {"annotations", {{"ember.io/dataset", "ds"}, {"ember.io/data-mode", "required"}}}}},
              {"spec", {{"containers", json::array()}}}};
  json args = {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", {"s0n0", "s0n1", "s0n2", "other"}}};
  auto res = http.Post("/scheduler/filter", args.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  json f = json::parse(res->body);
  EXPECT_EQ(f["NodeNames"], json({"s0n1"}));
  EXPECT_EQ(f["FailedNodes"].size(), 3u);
  res = http.Post("/scheduler/prioritize", args.dump(), "application/json");
  ASSERT_TRUE(res);
  json p = json::parse(res->body);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[1], json({{"Host", "s0n1"}, {"Score", 10}}));
  res = http.Post("/scheduler/filter", "garbage{", "application/json");
  ASSERT_TRUE(res);
  EXPECT_FALSE(json::parse(res->body)["Error"].get<std::string>().empty());
  EXPECT_TRUE(http.Get("/healthz"));  // still serving
}

// Meta's HTTP over TLS, as the API server calls admission webhooks.
class SchedulerTlsTest : public SchedulerTest {
 protected:
  std::vector<std::string> MetaArgs() override {
    if (std::system("command -v openssl >/dev/null") != 0) return {};
    cert_ = dir_.Sub("meta.pem");
    const std::string cmd = absl::StrCat(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ember-meta -addext "
        "subjectAltName=IP:127.0.0.1 -keyout ",
        dir_.Sub("meta.key"), " -out ", cert_, " 2>/dev/null");
    if (std::system(cmd.c_str()) != 0) cert_.clear();
    if (cert_.empty()) return {};
    https_port_ = testing::FreePort();
    return {"--https",      absl::StrCat("127.0.0.1:", https_port_),
            "--https-cert", cert_,
            "--https-key",  dir_.Sub("meta.key")};
  }
  std::string cert_;
  int https_port_ = 0;
};

TEST_F(SchedulerTlsTest, AdmissionWebhookOverHttps) {
  if (cert_.empty()) GTEST_SKIP() << "openssl not installed";
  SimulatedNodes(2, 2, 8);  // s0n0 s0n1 on switch s0, s1n0 s1n1 on s1; all on rack r0
  Warm("s0n0");
  httplib::SSLClient https("127.0.0.1", https_port_);
  https.set_ca_cert_path(cert_.c_str());
  https.enable_server_certificate_verification(true);
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"generateName", "trainer-"},
                {"namespace", "ml"},
                {"annotations", {{"ember.io/dataset", "ds"}, {"ember.io/mount-path", "/data"}}}}},
              {"spec", {{"containers", {{{"name", "train"}, {"image", "trainer:1"}}}}}}};
  json review = {{"apiVersion", "admission.k8s.io/v1"},
                 {"kind", "AdmissionReview"},
                 {"request",
                  {{"uid", "e911857d-c318-11e8-bbad-025000000001"},
                   {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                   {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
                   {"operation", "CREATE"},
                   {"object", pod}}}};
  auto res = https.Post("/webhook/mutate", review.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200);
  json out = json::parse(res->body)["response"];
  EXPECT_EQ(out["uid"], "e911857d-c318-11e8-bbad-025000000001");
  EXPECT_EQ(out["allowed"], true);
  ASSERT_EQ(out["patchType"], "JSONPatch") << out.dump();
  std::string ops;
  ASSERT_TRUE(absl::Base64Unescape(out["patch"].get<std::string>(), &ops));
  json patched = pod.patch(json::parse(ops));
  const json& pref = patched["spec"]["affinity"]["nodeAffinity"]
                            ["preferredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(pref.size(), 3u) << patched.dump(1);
  EXPECT_EQ(pref[0]["weight"], 100);
  EXPECT_EQ(pref[0]["preference"]["matchExpressions"][0]["values"], json({"s0n0"}));
  EXPECT_EQ(pref[1]["preference"]["matchExpressions"][0]["values"], json({"s0n1"}));
  EXPECT_EQ(pref[2]["preference"]["matchExpressions"][0]["values"], json({"s1n0", "s1n1"}));
  EXPECT_EQ(patched["spec"]["volumes"][0]["csi"]["volumeAttributes"]["dataset"], "ds");
  EXPECT_EQ(patched["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], "/data");
  // Garbage gets an allowed answer, and the server goes on.
  res = https.Post("/webhook/mutate", "garbage{", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["response"]["allowed"], true);
  EXPECT_TRUE(https.Get("/healthz"));
  // Plain HTTP to the HTTPS port gets nothing useful.
  httplib::Client http("127.0.0.1", https_port_);
  auto plain = http.Get("/healthz");
  EXPECT_TRUE(!plain || plain->status != 200);
}

TEST_F(SchedulerTest, RequiredModePrefetchesThenStarts) {
  // Two real node agents with GPUs; nothing is warm yet.
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  for (int i = 0; i < 2; i++) {
    NodeProcess::Options o;
    o.id = absl::StrCat("gpu", i);
    o.listen_host = absl::StrCat("127.0.0.", i + 2);
    o.extra_args = {"--gpus", "4", "--labels", "switch=s0,rack=r0"};
    nodes.push_back(std::make_unique<NodeProcess>(dir_.Sub(o.id), meta_->address(), o));
    ASSERT_TRUE(nodes.back()->Start());
  }
  ASSERT_TRUE(testing::WaitFor([&] { return meta_->client().ListNodes()->size() == 2; }));
  json j = Submit("name: llm\nworkers: 2\ngpus: 4\ndataset: ds\ndata_mode: required\n");
  EXPECT_EQ(j["state"], "warming");
  EXPECT_FALSE(j["prefetch"].get<std::string>().empty());
  json now;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        now = Show("llm");
        return now["state"] == "running";
      },
      std::chrono::seconds(30)));
  // Started only once its nodes hold the whole dataset: the nodes count a block done once it is
  // stored, but tell meta where blocks are in their own reports (every 20 ms while blocks
  // arrive), which may reach meta just after their last prefetch report: allow one of those.
  json l;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        l = json::parse(Ember({"locality", "ds", "--json"}).out);
        for (auto& n : l["nodes"]) {
          if (n["fraction"].get<double>() != 1.0) return false;
        }
        return l["nodes"].size() == 2u;
      },
      std::chrono::seconds(2)))
      << l;
}

TEST_F(SchedulerTest, BadSpecsAreRefused) {
  SimulatedNodes(1, 2, 8);
  struct Case {
    std::string yaml;
    std::string says;
  };
  std::vector<Case> cases = {
      {"name: [unclosed", "yaml-cpp: error"},
      {"workers: 2\n", "'name' is required"},
      {"name: x\ncolour: red\n", "unknown field 'colour'"},
      {"name: x\ndataset: nope\n", "unknown dataset 'nope'"},
      {"name: x\nworkers: 3\ngpus: 8\n", "could never fit"},
      {"name: x\ndata_mode: maybe\n", "data mode 'maybe'"},
      {"name: x\nworkers: lots\n", "bad conversion"},
  };
  int i = 0;
  for (const auto& c : cases) {
    std::string path = dir_.Sub(absl::StrCat("bad", i++, ".yaml"));
    WriteFile(path, c.yaml);
    auto r = Ember({"job", "submit", path});
    EXPECT_EQ(r.exit_code, 1) << c.yaml;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << "want '" << c.says << "' in: " << r.err;
  }
  EXPECT_NE(Ember({"job", "show", "nobody"}).err.find("unknown job 'nobody'"), std::string::npos);
}

}  // namespace
}  // namespace ember
