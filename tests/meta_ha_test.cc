// Meta replicas (#26 part 2; docs/meta-ha.md) as real processes: an etcd member and three
// `ember meta --replica-id` on 127.0.0.x, and a client given every replica's address.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "meta/etcd_client.h"
#include "meta/meta.grpc.pb.h"
#include "meta/meta_client.h"
#include "nlohmann/json.hpp"
#include "tests/testing/cluster.h"
#include "tests/testing/testing.h"

namespace ember {
namespace {

using testing::Process;
using testing::TempDir;

const char kPrefix[] = "/ember-test/meta/";

// Sets `stop` and joins the threads when the test ends, also when an ASSERT ends it early (a
// joinable std::thread destroyed would end the whole test binary).
struct JoinOnExit {
  std::atomic<bool>* stop;
  std::vector<std::thread*> threads;
  ~JoinOnExit() {
    *stop = true;
    for (auto* t : threads) {
      if (t->joinable()) t->join();
    }
  }
};

// Debian's etcd-server, where it installs it.
const char kEtcd[] = "/usr/bin/etcd";
bool HaveEtcd() { return access(kEtcd, X_OK) == 0; }

// One etcd member on 127.0.0.1 (a cluster of its own), or member `name` of a cluster whose
// peer URLs are `cluster` ("e1=http://...,e2=..."), listening on `address` and `peer_url`.
class Etcd {
 public:
  explicit Etcd(const std::string& dir) : dir_(dir), name_("e1") {
    address_ = absl::StrCat("127.0.0.1:", testing::FreePort("127.0.0.1"));
    peer_url_ = absl::StrCat("http://127.0.0.1:", testing::FreePort("127.0.0.1"));
    cluster_ = "e1=" + peer_url_;
    Start(/*wait=*/true);
  }
  Etcd(const std::string& dir, const std::string& name, const std::string& address,
       const std::string& peer_url, const std::string& cluster)
      : dir_(dir), name_(name), address_(address), peer_url_(peer_url), cluster_(cluster) {
    Start(/*wait=*/false);  // a member alone has no quorum: the caller waits for the cluster
  }
  void Start(bool wait) {
    process_ = std::make_unique<Process>(
        std::vector<std::string>{kEtcd, "--name", name_, "--data-dir", dir_, "--listen-client-urls",
                                 "http://" + address_, "--advertise-client-urls",
                                 "http://" + address_, "--listen-peer-urls", peer_url_,
                                 "--initial-advertise-peer-urls", peer_url_, "--initial-cluster",
                                 cluster_,
                                 // Tolerant of a loaded machine (the suite runs tests side by
                                 // side on two cores): a starved member must not keep calling
                                 // elections.
                                 "--heartbeat-interval", "250", "--election-timeout", "2500"},
        absl::StrCat(dir_, ".", starts_++));
    if (!wait) return;
    EXPECT_TRUE(
        testing::WaitFor([&] { return testing::PortOpen(address_); }, std::chrono::seconds(20)));
    client_ = *meta::EtcdClient::Connect(address_);
    // Ready when it answers a read (it has elected itself).
    absl::Status last;
    EXPECT_TRUE(testing::WaitFor(
        [&] {
          last = client_->Get("x").status();
          return last.ok();
        },
        std::chrono::seconds(20)))
        << last;
  }
  const std::string& address() const { return address_; }
  meta::EtcdClient& client() { return *client_; }
  void Kill() {
    process_->Signal(SIGKILL);
    process_->Wait();
  }
  std::string Log() const { return process_->Stdout() + process_->Stderr(); }

 private:
  std::string dir_, name_, address_, peer_url_, cluster_;
  int starts_ = 0;
  std::unique_ptr<Process> process_;
  std::unique_ptr<meta::EtcdClient> client_;
};

class Replica {
 public:
  Replica(const std::string& id, const std::string& host, const std::string& dir,
          const std::string& etcd, std::vector<std::string> extra = {})
      : id_(id), dir_(dir), etcd_(etcd), extra_(std::move(extra)) {
    address_ = absl::StrCat(host, ":", testing::FreePort(host));
    Start();
  }
  void Start() {
    std::vector<std::string> argv{EMBER_BINARY, "meta", "--listen",      address_,
                                  "--data-dir", dir_,   "--replica-id",  id_,
                                  "--etcd",     etcd_,  "--etcd-prefix", kPrefix};
    argv.insert(argv.end(), extra_.begin(), extra_.end());
    process_ = std::make_unique<Process>(argv, absl::StrCat(dir_, ".", starts_++));
  }
  void Kill() {
    process_->Signal(SIGKILL);
    process_->Wait();
  }
  const std::string& id() const { return id_; }
  const std::string& address() const { return address_; }
  Process& process() { return *process_; }

 private:
  std::string id_, dir_, etcd_, address_;
  std::vector<std::string> extra_;
  int starts_ = 0;
  std::unique_ptr<Process> process_;
};

// Three replicas m1-m3 on 127.0.0.(base+1..3), data under tmp; returns every address,
// comma-separated.
std::string StartReplicas(TempDir& tmp, int base, const std::string& etcd,
                          std::vector<std::unique_ptr<Replica>>* replicas,
                          const std::vector<std::string>& extra = {}) {
  std::string all;
  for (int i = 1; i <= 3; i++) {
    replicas->push_back(std::make_unique<Replica>(absl::StrCat("m", i),
                                                  absl::StrCat("127.0.0.", base + i),
                                                  tmp.Sub(absl::StrCat("m", i)), etcd, extra));
    all += (all.empty() ? "" : ",") + replicas->back()->address();
  }
  return all;
}

// The replica etcd names as leader ("" if none).
std::string LeaderId(meta::EtcdClient& etcd) {
  auto kv = etcd.Get(absl::StrCat(kPrefix, "leader"));
  if (!kv.ok() || !kv->has_value()) return "";
  return (*kv)->value.substr(0, (*kv)->value.find(' '));
}
// A leader other than `old` within 10 s (the failover target).
bool NewLeaderWithin10s(meta::EtcdClient& etcd, const std::string& old) {
  return testing::WaitFor(
      [&] {
        std::string l = LeaderId(etcd);
        return !l.empty() && l != old;
      },
      std::chrono::seconds(10));
}
size_t InSync(meta::EtcdClient& etcd) {
  auto kvs = etcd.GetPrefix(absl::StrCat(kPrefix, "in-sync/"));
  return kvs.ok() ? kvs->size() : 0;
}

// Claims are checked against the manifest: batch k claims blocks k*n .. k*n+n-1 of one large
// (sparse) file of dataset 1.
uint64_t g_file_id = 0;
BlockAddr Claimed(uint64_t batch, uint64_t i, uint64_t n) {
  return BlockAddr{1, 1, g_file_id, batch * n + i};
}
// Adds dataset "d1": one sparse 8 TiB file (2,097,152 blocks) under `dir`, and notes its id.
absl::Status AddClaimsDataset(meta::MetaClient& client, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/a.bin").put('x');
  std::filesystem::resize_file(dir + "/a.bin", 1ull << 43);
  auto added = client.AddDataset("d1", dir, 0);
  if (!added.ok()) return added.status();
  g_file_id = 0;
  absl::Status st = client.ForEachManifestEntry("d1", 0, [](const rpc::FileEntry& e) {
    if (e.type() == rpc::FileEntry::FILE) g_file_id = e.file_id();
  });
  if (st.ok() && g_file_id == 0) st = absl::InternalError("no file in d1's manifest");
  return st;
}

rpc::RecordChecksumsRequest Claims(uint64_t batch, uint64_t n) {
  rpc::RecordChecksumsRequest req;
  for (uint64_t i = 0; i < n; i++) {
    auto* c = req.add_checksums();
    *c->mutable_block() = meta::ToProto(Claimed(batch, i, n));
    c->set_checksum(batch * 1000003 + i);
  }
  return req;
}

// Every claim acknowledged is there, with its value.
void ExpectClaims(meta::MetaClient& client, const std::vector<uint64_t>& files, uint64_t n) {
  for (uint64_t file : files) {
    rpc::GetChecksumsRequest req;
    for (uint64_t i = 0; i < n; i++) *req.add_blocks() = meta::ToProto(Claimed(file, i, n));
    auto r = client.GetChecksums(req);
    ASSERT_TRUE(r.ok()) << r.status();
    for (uint64_t i = 0; i < n; i++) {
      ASSERT_TRUE(r->present(static_cast<int>(i))) << "claim " << file << "/" << i << " lost";
      ASSERT_EQ(r->checksums(static_cast<int>(i)), file * 1000003 + i);
    }
  }
}

TEST(MetaHaTest, KilledLeaderIsReplacedWithEveryAcknowledgedWrite) {
  if (!HaveEtcd()) GTEST_SKIP() << "etcd is not installed (apt-get install etcd-server)";
  TempDir tmp;
  Etcd etcd(tmp.Sub("etcd"));
  std::vector<std::unique_ptr<Replica>> replicas;
  const std::string all = StartReplicas(tmp, 20, etcd.address(), &replicas);
  meta::MetaClient client(all, std::chrono::seconds(15));
  auto by_id = [&](const std::string& id) -> Replica& {
    for (auto& r : replicas) {
      if (r->id() == id) return *r;
    }
    ADD_FAILURE() << "no replica " << id;
    return *replicas[0];
  };

  // A dataset and claims through whichever replica leads; standbys join the in-sync set.
  auto logs = [&] {
    std::string out;
    for (auto& r : replicas)
      absl::StrAppend(&out, "---- ", r->id(), "\n", r->process().Stdout(), r->process().Stderr());
    return out;
  };
  absl::Status added = AddClaimsDataset(client, tmp.Sub("origin"));
  ASSERT_TRUE(added.ok()) << added << "\n" << logs();
  ASSERT_TRUE(
      testing::WaitFor([&] { return InSync(etcd.client()) == 3; }, std::chrono::seconds(20)))
      << "in sync: " << InSync(etcd.client());
  const std::string first = LeaderId(etcd.client());
  ASSERT_FALSE(first.empty());

  // A standby names the leader; a client given only the standby cannot write through it.
  Replica& standby = by_id(first == "m1" ? "m2" : "m1");
  meta::MetaClient standby_only(standby.address(), std::chrono::milliseconds(500));
  auto refused = standby_only.ListDatasets();
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("leader is " + by_id(first).address()),
            std::string::npos)
      << refused.status();

  // Claims written without pause; the leader is killed in the middle.
  std::atomic<bool> stop{false};
  std::vector<uint64_t> acked;
  absl::Mutex acked_mu;
  std::string first_error;
  std::atomic<int64_t> last_ok_ms{0}, longest_gap_ms{0};
  auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  std::thread writer;
  JoinOnExit joiner{&stop, {&writer}};
  writer = std::thread([&] {
    last_ok_ms = now_ms();
    for (uint64_t file = 1; !stop; file++) {
      auto r = client.RecordChecksums(Claims(file, 50));
      if (!r.ok()) {  // not acknowledged: may or may not be there
        absl::MutexLock lock(&acked_mu);
        if (first_error.empty()) first_error = r.status().ToString();
        continue;
      }
      const int64_t t = now_ms();
      longest_gap_ms = std::max<int64_t>(longest_gap_ms, t - last_ok_ms);
      last_ok_ms = t;
      absl::MutexLock lock(&acked_mu);
      acked.push_back(file);
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  by_id(first).Kill();
  ASSERT_TRUE(NewLeaderWithin10s(etcd.client(), first));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  stop = true;
  writer.join();
  const std::string second = LeaderId(etcd.client());
  EXPECT_LT(longest_gap_ms.load(), 10000) << "writes stopped for longer than 10 s";
  {
    absl::MutexLock lock(&acked_mu);
    ASSERT_GT(acked.size(), 10u) << first_error << "\n" << logs();
    ExpectClaims(client, acked, 50);
  }
  auto datasets = client.ListDatasets();
  ASSERT_TRUE(datasets.ok()) << datasets.status();
  ASSERT_EQ(datasets->size(), 1u);
  EXPECT_EQ((*datasets)[0].name(), "d1");

  // The killed replica comes back as a standby and catches up; then the second leader dies
  // and the data is still all there on the third.
  by_id(first).Start();
  ASSERT_TRUE(client.AddDataset("d2", tmp.Sub("origin"), 0).ok());
  ASSERT_TRUE(
      testing::WaitFor([&] { return InSync(etcd.client()) == 3; }, std::chrono::seconds(20)))
      << "in sync: " << InSync(etcd.client()) << "\n"
      << logs();
  by_id(second).Kill();
  ASSERT_TRUE(NewLeaderWithin10s(etcd.client(), second));
  datasets = client.ListDatasets();
  ASSERT_TRUE(datasets.ok()) << datasets.status();
  EXPECT_EQ(datasets->size(), 2u);
  {
    absl::MutexLock lock(&acked_mu);
    ExpectClaims(client, acked, 50);
  }
  // SIGTERM ends leader and standby alike, promptly and cleanly.
  for (auto& rep : replicas) {
    if (rep->id() == second || !rep->process().Running()) continue;
    rep->process().Signal(SIGTERM);
    EXPECT_EQ(rep->process().Wait(std::chrono::seconds(15)), 0) << rep->id() << "\n" << logs();
  }
}

// A leader that hangs (SIGSTOP: a frozen host) rather than dies: a call in flight to it is given
// up by the client's keepalive within seconds and goes to the new leader, well before its own
// deadline. A start retried with the same request id (a lost answer) starts one prefetch.
TEST(MetaHaTest, AHungLeaderIsLeftWithinSecondsAndARetriedStartStartsOnce) {
  if (!HaveEtcd()) GTEST_SKIP() << "etcd is not installed (apt-get install etcd-server)";
  TempDir tmp;
  Etcd etcd(tmp.Sub("etcd"));
  std::vector<std::unique_ptr<Replica>> replicas;
  const std::string all = StartReplicas(tmp, 60, etcd.address(), &replicas);
  meta::MetaClient client(all, std::chrono::seconds(40));
  ASSERT_TRUE(AddClaimsDataset(client, tmp.Sub("origin")).ok());
  ASSERT_TRUE(
      testing::WaitFor([&] { return InSync(etcd.client()) == 3; }, std::chrono::seconds(20)));
  rpc::Node node;
  node.set_id("n1");
  node.set_address("127.0.0.1:1");
  node.set_capacity_bytes(1ull << 40);
  ASSERT_TRUE(client.RegisterNode(node).ok());
  ASSERT_TRUE(client.RecordChecksums(Claims(1, 50)).ok());  // the client's channel is the leader's
  const std::string first = LeaderId(etcd.client());
  Replica* leader = nullptr;
  for (auto& r : replicas) {
    if (r->id() == first) leader = r.get();
  }
  ASSERT_NE(leader, nullptr);

  leader->process().Signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = client.RecordChecksums(Claims(2, 50));
  const auto took = std::chrono::steady_clock::now() - t0;
  leader->process().Signal(SIGCONT);  // it finds it lost the lead and exits
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(took, std::chrono::seconds(20)) << "the call waited for its deadline (40 s)";
  EXPECT_NE(LeaderId(etcd.client()), first);
  ExpectClaims(client, {1, 2}, 50);
  EXPECT_EQ(leader->process().Wait(std::chrono::seconds(15)), 75) << leader->process().Stderr();

  // The same start sent twice with one request id (as a client retrying a lost answer does).
  ASSERT_TRUE(client.RegisterNode(node).ok());  // alive on the new leader
  const std::string second = LeaderId(etcd.client());
  std::string second_address;
  for (auto& rep : replicas) {
    if (rep->id() == second) second_address = rep->address();
  }
  auto stub =
      rpc::Meta::NewStub(grpc::CreateChannel(second_address, grpc::InsecureChannelCredentials()));
  rpc::PrefetchSpec spec;
  spec.set_dataset("d1");
  std::vector<std::string> ids;
  for (const char* request : {"r-1", "r-1", "r-2"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.AddMetadata(meta::kRequestIdMetadataKey, request);
    rpc::PrefetchJob job;
    grpc::Status st = stub->StartPrefetch(&ctx, spec, &job);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ids.push_back(job.id());
  }
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_NE(ids[0], ids[2]);
  auto jobs = client.ListPrefetches();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 2u);
}

// Replicas serving TLS: clients reach them with the CA, the leader ships its writes to the
// standbys over TLS (they reach the in-sync set), and a new leader serves everything. A replica
// with --tls-cert but no --tls-ca is refused at start with a clear error.
TEST(MetaHaTest, ReplicasServeAndReplicateOverTls) {
  if (!HaveEtcd()) GTEST_SKIP() << "etcd is not installed (apt-get install etcd-server)";
  if (std::system("command -v openssl >/dev/null") != 0) GTEST_SKIP() << "openssl not installed";
  TempDir tmp;
  const std::string dir = tmp.Sub("tls");
  std::filesystem::create_directories(dir);
  // One CA; one certificate naming every replica's address (as a StatefulSet's would name its
  // pods' DNS names).
  const std::string cmd = absl::StrCat(
      "cd ", dir,
      " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ember-ca -keyout ca.key "
      "-out ca.pem 2>/dev/null && openssl req -newkey rsa:2048 -nodes -subj /CN=meta -keyout "
      "meta.key -out meta.csr 2>/dev/null && printf "
      "'subjectAltName=IP:127.0.0.91,IP:127.0.0.92,IP:127.0.0.93' > ext.cnf && openssl x509 "
      "-req -in meta.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext.cnf -out "
      "meta.pem 2>/dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Etcd etcd(tmp.Sub("etcd"));
  const std::vector<std::string> tls{"--tls-cert",      dir + "/meta.pem", "--tls-key",
                                     dir + "/meta.key", "--tls-ca",        dir + "/ca.pem"};

  {  // no --tls-ca: refused
    Process refused({EMBER_BINARY, "meta", "--listen", "127.0.0.94:0", "--data-dir", tmp.Sub("m0"),
                     "--replica-id", "m0", "--etcd", etcd.address(), "--etcd-prefix", kPrefix,
                     "--tls-cert", dir + "/meta.pem", "--tls-key", dir + "/meta.key"},
                    tmp.Sub("m0.log"));
    EXPECT_NE(refused.Wait(std::chrono::seconds(15)), 0);
    EXPECT_NE(refused.Stderr().find("need --tls-ca"), std::string::npos) << refused.Stderr();
  }

  std::vector<std::unique_ptr<Replica>> replicas;
  const std::string all = StartReplicas(tmp, 90, etcd.address(), &replicas, tls);
  auto logs = [&] {
    std::string out;
    for (auto& r : replicas)
      absl::StrAppend(&out, "---- ", r->id(), "\n", r->process().Stdout(), r->process().Stderr());
    return out;
  };
  meta::MetaClient client(all, meta::MetaCredentials{"", dir + "/ca.pem"},
                          std::chrono::seconds(20));
  absl::Status added = AddClaimsDataset(client, tmp.Sub("origin"));
  ASSERT_TRUE(added.ok()) << added << "\n" << logs();
  ASSERT_TRUE(client.RecordChecksums(Claims(1, 50)).ok());
  ASSERT_TRUE(
      testing::WaitFor([&] { return InSync(etcd.client()) == 3; }, std::chrono::seconds(20)))
      << "in sync: " << InSync(etcd.client()) << "\n"
      << logs();
  // A client without the CA does not get in.
  meta::MetaClient plain(all, std::chrono::seconds(2));
  EXPECT_FALSE(plain.ListDatasets().ok());

  const std::string first = LeaderId(etcd.client());
  for (auto& r : replicas) {
    if (r->id() == first) r->Kill();
  }
  ASSERT_TRUE(NewLeaderWithin10s(etcd.client(), first));
  ASSERT_TRUE(client.RecordChecksums(Claims(2, 50)).ok()) << logs();
  ExpectClaims(client, {1, 2}, 50);
  auto datasets = client.ListDatasets();
  ASSERT_TRUE(datasets.ok()) << datasets.status();
  EXPECT_EQ(datasets->size(), 1u);
}

// The scenario: nodes reading through their mounts, a prefetch running (of another
// dataset, at 1 MiB/s from the origin: ~30 s), a job placed and a `dataset add` in flight when
// the leader is killed. Readers see no error, the prefetch finishes, the job and every dataset
// acknowledged are on the new leader.
TEST(MetaHaTest, NodesPrefetchesAndJobsRideOutALeaderKill) {
  if (!HaveEtcd()) GTEST_SKIP() << "etcd is not installed (apt-get install etcd-server)";
  namespace fs = std::filesystem;
  TempDir tmp;
  Etcd etcd(tmp.Sub("etcd"));
  std::vector<std::unique_ptr<Replica>> replicas;
  const std::string all = StartReplicas(tmp, 30, etcd.address(), &replicas);
  auto ember = [&](std::vector<std::string> args) {
    args.insert(args.end(), {"--meta", all});
    return testing::RunEmber(args, {}, std::chrono::seconds(60));
  };
  const std::string origin = tmp.Sub("origin");
  fs::create_directories(origin);
  for (int i = 0; i < 16; i++) {
    testing::WriteRandomFile(absl::StrCat(origin, "/f", i), (2 << 20) + i, 100 + i);
  }
  const std::string many = tmp.Sub("many");
  for (int d = 0; d < 20; d++) {
    fs::create_directories(absl::StrCat(many, "/", d));
    for (int i = 0; i < 500; i++) {
      std::ofstream(absl::StrCat(many, "/", d, "/", i)) << i;
    }
  }
  // What the prefetch warms: files nobody reads meanwhile, so it is still running at the kill.
  const std::string warm = tmp.Sub("warm");
  fs::create_directories(warm);
  for (int i = 0; i < 16; i++) {
    testing::WriteRandomFile(absl::StrCat(warm, "/w", i), (2 << 20) + i, 300 + i);
  }
  auto r = ember({"dataset", "add", "ds", origin});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = ember({"dataset", "add", "pf", warm});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::unique_ptr<testing::NodeProcess>> nodes;
  for (int i = 1; i <= 2; i++) {
    testing::NodeProcess::Options o;
    o.id = absl::StrCat("n", i);
    o.listen_host = absl::StrCat("127.0.0.", 40 + i);
    o.extra_args = {"--gpus", "8"};
    nodes.push_back(std::make_unique<testing::NodeProcess>(tmp.Sub(o.id), all, o));
    ASSERT_TRUE(nodes.back()->Start());
  }
  meta::MetaClient client(all, std::chrono::seconds(15));
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto n = client.ListNodes();
        return n.ok() && n->size() == 2;
      },
      std::chrono::seconds(20)));
  ASSERT_TRUE(
      testing::WaitFor([&] { return InSync(etcd.client()) == 3; }, std::chrono::seconds(20)));

  // Readers on node 1, comparing every byte with the origin, all through the kill.
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, errors{0};
  std::string first_error;
  std::thread reader, scan;
  JoinOnExit joiner{&stop, {&reader, &scan}};
  reader = std::thread([&] {
    while (!stop) {
      for (int i = 0; i < 16 && !stop; i++) {
        const std::string got = testing::ReadFile(absl::StrCat(nodes[0]->mount(), "/ds/f", i));
        if (got != testing::ReadFile(absl::StrCat(origin, "/f", i)) && errors++ == 0) {
          first_error = absl::StrCat("f", i, ": ", got.size(), " bytes");
        }
        reads++;
      }
    }
  });
  // A slow prefetch to both nodes (the origin at 1 MiB/s: ~30 s), a job, and a scan in flight.
  r = ember({"prefetch", "pf", "--mode", "full", "--all", "--origin-rate", "1MiB", "--detach"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.out.rfind("prefetch ", 0), 0u) << r.out;  // "prefetch ID: ..."
  const std::string prefetch_id = r.out.substr(9, r.out.find(':') - 9);
  const std::string spec = tmp.Sub("job.yaml");
  std::ofstream(spec) << "name: train\nworkers: 1\ngpus: 8\ndataset: ds\n";
  r = ember({"job", "submit", spec, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string job_id = nlohmann::json::parse(r.out)["id"];
  scan = std::thread([&] {
    // In flight when the leader dies: either acknowledged (then it must be there) or failed
    // (then it is tried again, as a user would).
    for (int attempt = 0; attempt < 3; attempt++) {
      if (ember({"dataset", "add", "many", many}).exit_code == 0) return;
      if (ember({"dataset", "ls"}).out.find("many") != std::string::npos) return;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string first = LeaderId(etcd.client());
  for (auto& rep : replicas) {
    if (rep->id() == first) rep->Kill();
  }
  ASSERT_TRUE(NewLeaderWithin10s(etcd.client(), first));
  scan.join();

  // The prefetch finishes on both nodes; the job and both datasets are there.
  std::string state;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto j = client.GetPrefetch(prefetch_id);
        if (!j.ok()) return false;
        state = rpc::PrefetchJob::State_Name(j->state());
        return j->state() != rpc::PrefetchJob::RUNNING;
      },
      std::chrono::seconds(90)))
      << state;
  auto job = client.GetPrefetch(prefetch_id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), rpc::PrefetchJob::DONE) << job->DebugString();
  auto placed = client.GetJob(job_id);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->spec().name(), "train");
  auto datasets = client.ListDatasets();
  ASSERT_TRUE(datasets.ok());
  EXPECT_EQ(datasets->size(), 3u);
  stop = true;
  reader.join();
  EXPECT_GT(reads.load(), 16);
  EXPECT_EQ(errors.load(), 0) << first_error;
  // The prefetched files read whole on both nodes, the origin read once for the two.
  uint64_t from_origin = 0;
  for (const auto& n : job->nodes()) from_origin += n.bytes_from_origin();
  EXPECT_EQ(from_origin, job->dataset_bytes()) << job->DebugString();
  for (auto& n : nodes) {
    for (int i = 0; i < 16; i++) {
      EXPECT_EQ(testing::ReadFile(absl::StrCat(n->mount(), "/pf/w", i)),
                testing::ReadFile(absl::StrCat(warm, "/w", i)));
    }
  }
}

// A replica that joins with an empty store, behind what the leader keeps of its recent writes
// (--replica-keep 1B: the last batch only), gets a copy of the whole store, catches up, and
// then holds everything: it serves alone once both others are killed.
TEST(MetaHaTest, AReplicaFarBehindGetsACopyOfTheStore) {
  if (!HaveEtcd()) GTEST_SKIP() << "etcd is not installed (apt-get install etcd-server)";
  TempDir tmp;
  Etcd etcd(tmp.Sub("etcd"));
  std::vector<std::unique_ptr<Replica>> replicas;
  std::string all;
  for (int i = 1; i <= 3; i++) {
    replicas.push_back(std::make_unique<Replica>(
        absl::StrCat("m", i), absl::StrCat("127.0.0.", 50 + i), tmp.Sub(absl::StrCat("m", i)),
        etcd.address(), std::vector<std::string>{"--replica-keep", "1B"}));
    all += (all.empty() ? "" : ",") + replicas.back()->address();
    if (i == 2) {
      ASSERT_TRUE(
          testing::WaitFor([&] { return InSync(etcd.client()) == 2; }, std::chrono::seconds(20)));
      break;
    }
  }
  meta::MetaClient client(all, std::chrono::seconds(15));
  ASSERT_TRUE(AddClaimsDataset(client, tmp.Sub("origin")).ok());
  std::vector<uint64_t> batches;
  for (uint64_t b = 1; b <= 20; b++) {
    ASSERT_TRUE(client.RecordChecksums(Claims(b, 50)).ok());
    batches.push_back(b);
  }
  // The third replica starts empty, far behind.
  replicas.push_back(std::make_unique<Replica>("m3", "127.0.0.53", tmp.Sub("m3"), etcd.address(),
                                               std::vector<std::string>{"--replica-keep", "1B"}));
  const std::string m3 = replicas.back()->address();
  ASSERT_TRUE(
      testing::WaitFor([&] { return InSync(etcd.client()) == 3; }, std::chrono::seconds(30)))
      << replicas[0]->process().Stderr() << replicas[1]->process().Stderr()
      << replicas[2]->process().Stderr();
  replicas[0]->Kill();
  replicas[1]->Kill();
  meta::MetaClient only_m3(m3, std::chrono::seconds(15));
  ASSERT_TRUE(
      testing::WaitFor([&] { return LeaderId(etcd.client()) == "m3"; }, std::chrono::seconds(15)))
      << replicas[2]->process().Stderr();
  // Leading, then serving (a moment later: the standby's server makes way for the leader's).
  absl::StatusOr<std::vector<rpc::Dataset>> datasets;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        datasets = only_m3.ListDatasets();
        return datasets.ok();
      },
      std::chrono::seconds(10)))
      << datasets.status() << replicas[2]->process().Stdout();
  ASSERT_EQ(datasets->size(), 1u);
  ExpectClaims(only_m3, batches, 50);
  EXPECT_NE(replicas[2]->process().Stdout().find("installed a copy of the leader's store"),
            std::string::npos);
}

// Chaos: three etcd members and three meta replicas; while a client records claims without
// pause, every 2-3 s a random meta replica or etcd member is killed -9 (and started again a
// moment later; one of each kind down at most). Every acknowledged claim is there afterwards,
// with its value, and no value ever differs.
TEST(MetaHaTest, RandomKillsOfReplicasAndEtcdMembersLoseNoAcknowledgedWrite) {
  if (!HaveEtcd()) GTEST_SKIP() << "etcd is not installed (apt-get install etcd-server)";
  TempDir tmp;
  std::vector<std::string> addresses, peers;
  std::string cluster;
  for (int i = 1; i <= 3; i++) {
    const std::string host = absl::StrCat("127.0.0.", 70 + i);
    addresses.push_back(absl::StrCat(host, ":", testing::FreePort(host)));
    peers.push_back(absl::StrCat("http://", host, ":", testing::FreePort(host)));
    cluster += absl::StrCat(cluster.empty() ? "" : ",", "e", i, "=", peers.back());
  }
  std::vector<std::unique_ptr<Etcd>> members;
  for (int i = 0; i < 3; i++) {
    members.push_back(std::make_unique<Etcd>(tmp.Sub(absl::StrCat("etcd", i + 1)),
                                             absl::StrCat("e", i + 1), addresses[i], peers[i],
                                             cluster));
  }
  const std::string endpoints = absl::StrJoin(addresses, ",");
  auto etcd = *meta::EtcdClient::Connect(endpoints);
  absl::Status etcd_status;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        etcd_status = etcd->Get("x").status();
        return etcd_status.ok();
      },
      std::chrono::seconds(90)))
      << etcd_status << "\n"
      << members[0]->Log().substr(0, 4000);
  std::vector<std::unique_ptr<Replica>> replicas;
  std::string all;
  for (int i = 1; i <= 3; i++) {
    replicas.push_back(std::make_unique<Replica>(absl::StrCat("m", i),
                                                 absl::StrCat("127.0.0.", 80 + i),
                                                 tmp.Sub(absl::StrCat("m", i)), endpoints));
    all += (all.empty() ? "" : ",") + replicas.back()->address();
  }
  meta::MetaClient client(all, std::chrono::seconds(15));
  ASSERT_TRUE(AddClaimsDataset(client, tmp.Sub("origin")).ok());
  ASSERT_TRUE(testing::WaitFor([&] { return InSync(*etcd) == 3; }, std::chrono::seconds(30)));

  std::atomic<bool> stop{false};
  std::atomic<int> conflicts{0};
  std::vector<uint64_t> acked;
  absl::Mutex acked_mu;
  std::thread writer;
  JoinOnExit joiner{&stop, {&writer}};
  writer = std::thread([&] {
    for (uint64_t b = 1; !stop; b++) {
      auto r = client.RecordChecksums(Claims(b, 20));
      if (!r.ok()) continue;
      for (bool c : r->conflict()) conflicts += c ? 1 : 0;
      absl::MutexLock lock(&acked_mu);
      acked.push_back(b);
    }
  });
  std::mt19937 rng(42);
  int meta_kills = 0, etcd_kills = 0, exits = 0;
  // As a supervisor (Kubernetes, systemd) would: a replica that exited by itself (a leader that
  // could not renew its lease while etcd had no leader exits 75) is started again.
  auto supervise = [&] {
    for (auto& r : replicas) {
      if (r->process().Running()) continue;
      EXPECT_EQ(r->process().Wait(), 75) << r->process().Stderr();
      r->Start();
      exits++;
    }
  };
  for (int round = 0; round < 12; round++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2000 + rng() % 1000));
    supervise();
    if (rng() % 2 == 0) {
      // Mostly the leader: the case that matters; sometimes a standby.
      std::string victim = LeaderId(*etcd);
      if (victim.empty() || rng() % 3 == 0) victim = absl::StrCat("m", 1 + rng() % 3);
      for (auto& r : replicas) {
        if (r->id() == victim) {
          r->Kill();
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          r->Start();
        }
      }
      meta_kills++;
    } else {
      auto& m = members[rng() % 3];
      m->Kill();
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      m->Start(/*wait=*/false);
      etcd_kills++;
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  stop = true;
  writer.join();
  EXPECT_EQ(conflicts.load(), 0);
  // The last kill may have been the leader's: wait for its successor to answer.
  absl::Status answer;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        supervise();
        answer = client.ListDatasets().status();
        return answer.ok();
      },
      std::chrono::seconds(20)))
      << answer << "\nleader: " << LeaderId(*etcd) << ", in sync: " << InSync(*etcd) << "\n"
      << [&] {
           std::string out;
           for (auto& r : replicas) {
             std::string log = r->process().Stdout() + r->process().Stderr();
             if (log.size() > 3000) log = log.substr(log.size() - 3000);
             absl::StrAppend(&out, "---- ", r->id(), r->process().Running() ? "" : " (exited)",
                             "\n", log);
           }
           return out;
         }();
  absl::MutexLock lock(&acked_mu);
  ASSERT_GT(acked.size(), 50u);
  ExpectClaims(client, acked, 20);
  std::cout << "chaos: " << meta_kills << " meta kills, " << etcd_kills << " etcd kills, " << exits
            << " replicas exited by themselves and restarted, " << acked.size()
            << " claim batches acknowledged, all there\n";
}

}  // namespace
}  // namespace ember
