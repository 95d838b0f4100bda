// Security and bad input on real processes: the cluster token on every meta RPC, TLS with a CA
// made here, hostile gRPC requests, symlinks out of the origin, permissions through the mount,
// and loopback-only listening by default.
#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "meta/meta.grpc.pb.h"
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
using testing::WriteFile;
using testing::WriteRandomFile;

constexpr char kToken[] = "cluster-token-0123456789";

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    origin_ = dir_.Sub("origin");
    fs::create_directories(origin_ + "/sub");
    WriteRandomFile(origin_ + "/big.bin", 3 << 20, 7);
    WriteRandomFile(origin_ + "/sub/small.bin", 5000, 8);
    WriteFile(dir_.Sub("token"), absl::StrCat(kToken, "\n"));
    WriteFile(dir_.Sub("wrong-token"), "not-the-token");
  }

  // Calls every method of the Meta service with an empty request over `channel`, with
  // `token` (none if empty); returns the status codes seen, by method.
  std::map<std::string, grpc::StatusCode> CallEveryMethod(std::shared_ptr<grpc::Channel> channel,
                                                          const std::string& token) {
    const auto* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("ember.rpc.Meta");
    EXPECT_NE(service, nullptr);
    std::map<std::string, grpc::StatusCode> codes;
    grpc::GenericStub stub(channel);
    grpc::CompletionQueue cq;
    for (int i = 0; service != nullptr && i < service->method_count(); i++) {
      std::string method = absl::StrCat("/ember.rpc.Meta/", service->method(i)->name());
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      if (!token.empty()) ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
      grpc::Slice empty("");
      grpc::ByteBuffer req(&empty, 1), resp;
      auto call = stub.PrepareUnaryCall(&ctx, method, req, &cq);
      call->StartCall();
      grpc::Status st;
      call->Finish(&resp, &st, reinterpret_cast<void*>(1));
      void* tag;
      bool ok;
      EXPECT_TRUE(cq.Next(&tag, &ok));
      codes[service->method(i)->name()] = st.error_code();
    }
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
    return codes;
  }

  TempDir dir_;
  std::string origin_;
};

TEST_F(SecurityTest, TokenIsRequiredOnEveryMetaCall) {
  MetaProcess meta(dir_.Sub("meta"), "10s", {"--token-file", dir_.Sub("token")},
                   meta::MetaCredentials{kToken, ""});
  auto channel = grpc::CreateChannel(meta.address(), grpc::InsecureChannelCredentials());
  auto without = CallEveryMethod(channel, "");
  auto wrong = CallEveryMethod(channel, "not-the-token");
  auto right = CallEveryMethod(channel, kToken);
  ASSERT_GE(without.size(), 20u);
  for (const auto& [method, code] : without) {
    EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED) << method << " without a token";
    EXPECT_EQ(wrong[method], grpc::StatusCode::UNAUTHENTICATED) << method << " with a wrong token";
    // With the token the call gets past the check (empty requests then fail validation or
    // succeed, but never as UNAUTHENTICATED).
    EXPECT_NE(right[method], grpc::StatusCode::UNAUTHENTICATED) << method << " with the token";
  }
  EXPECT_NE((meta.process().Stdout() + meta.process().Stderr()).find("refused a call from"),
            std::string::npos);

  // The CLI: no token, a wrong one, then the right one by flag and by environment.
  auto r = RunEmber({"dataset", "ls", "--meta", meta.address()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("requires the cluster token"), std::string::npos) << r.err;
  r = RunEmber(
      {"dataset", "ls", "--meta", meta.address(), "--token-file", dir_.Sub("wrong-token")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("refused the cluster token"), std::string::npos) << r.err;
  r = RunEmber({"dataset", "add", "ds", origin_, "--meta", meta.address(), "--token-file",
                dir_.Sub("token")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunEmber({"dataset", "ls", "--meta", meta.address()},
               {absl::StrCat("EMBER_TOKEN_FILE=", dir_.Sub("token"))});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ds"), std::string::npos);
  r = RunEmber({"status", "--meta", meta.address(), "--token-file", dir_.Sub("missing")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--token-file"), std::string::npos) << r.err;

  // A node with the token registers and serves; one with a wrong token is refused by meta
  // (and logs why) but nothing it sent was recorded.
  NodeProcess::Options o;
  o.extra_args = {"--token-file", dir_.Sub("token")};
  NodeProcess good(dir_.Sub("good"), meta.address(), o);
  ASSERT_TRUE(good.Start());
  EXPECT_EQ(ReadUncached(good.mount() + "/ds/big.bin"), ReadFile(origin_ + "/big.bin"));
  o.id = "intruder";
  o.extra_args = {"--token-file", dir_.Sub("wrong-token")};
  NodeProcess bad(dir_.Sub("bad"), meta.address(), o);
  bad.Start();
  EXPECT_TRUE(testing::WaitFor(
      [&] { return bad.Log().find("refused the cluster token") != std::string::npos; }));
  auto nodes = meta.client().ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ(nodes->at(0).id(), "n1");
}

// A CA, and a server certificate for 127.0.0.1 signed by it, made with openssl.
void MakeCa(const std::string& dir, const std::string& name) {
  std::string cmd = absl::StrCat(
      "cd ", dir, " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=", name,
      "-ca -keyout ", name, "-ca.key -out ", name, "-ca.pem 2>/dev/null",
      " && openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout ", name,
      "-server.key -out ", name, "-server.csr 2>/dev/null",
      " && printf 'subjectAltName=IP:127.0.0.1' > ", name, "-ext.cnf", " && openssl x509 -req -in ",
      name, "-server.csr -CA ", name, "-ca.pem -CAkey ", name,
      "-ca.key -CAcreateserial -days 2 -extfile ", name, "-ext.cnf -out ", name,
      "-server.pem 2>/dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// With a cluster token, meta's and a node's HTTP endpoints want it too (Authorization: Bearer),
// except for the paths left open (/healthz by default; here /metrics too on the node).
TEST_F(SecurityTest, HttpEndpointsWantTheTokenExceptWhereLeftOpen) {
  const std::string http = absl::StrCat("127.0.0.1:", testing::FreePort());
  MetaProcess meta(dir_.Sub("meta"), "10s", {"--token-file", dir_.Sub("token"), "--http", http},
                   meta::MetaCredentials{kToken, ""});
  NodeProcess::Options o;
  const std::string node_http = absl::StrCat("127.0.0.1:", testing::FreePort());
  o.extra_args = {"--token-file", dir_.Sub("token"), "--metrics-listen",
                  node_http,      "--metrics-open",  "/healthz,/metrics"};
  NodeProcess node(dir_.Sub("node"), meta.address(), o);
  ASSERT_TRUE(node.Start());
  auto code = [](const std::string& host_port, const std::string& path, const std::string& token,
                 const std::string& post = "") {
    const size_t colon = host_port.rfind(':');
    httplib::Client c(host_port.substr(0, colon), std::stoi(host_port.substr(colon + 1)));
    httplib::Headers h;
    if (!token.empty()) h.emplace("Authorization", absl::StrCat("Bearer ", token));
    auto r = post.empty() ? c.Get(path, h) : c.Post(path, h, post, "application/json");
    return r ? r->status : -1;
  };
  EXPECT_EQ(code(http, "/healthz", ""), 200);
  for (const char* path : {"/api/status", "/metrics", "/"}) {
    EXPECT_EQ(code(http, path, ""), 401) << path;
    EXPECT_EQ(code(http, path, "wrong"), 401) << path;
    EXPECT_EQ(code(http, path, kToken), 200) << path;
  }
  EXPECT_EQ(code(http, "/scheduler/filter", "", "{}"), 401);
  EXPECT_EQ(code(http, "/scheduler/filter", kToken, "{}"), 200);
  // The node: /metrics left open, nothing else there needs it.
  EXPECT_EQ(code(node_http, "/metrics", ""), 200);
  EXPECT_EQ(code(node_http, "/healthz", ""), 200);
}

TEST_F(SecurityTest, TlsWithSelfSignedCa) {
  if (std::system("command -v openssl >/dev/null") != 0) GTEST_SKIP() << "openssl not installed";
  MakeCa(dir_.path(), "good");
  MakeCa(dir_.path(), "other");
  MetaProcess meta(dir_.Sub("meta"), "10s",
                   {"--token-file", dir_.Sub("token"), "--tls-cert", dir_.Sub("good-server.pem"),
                    "--tls-key", dir_.Sub("good-server.key")},
                   meta::MetaCredentials{kToken, dir_.Sub("good-ca.pem")});
  EXPECT_NE((meta.process().Stdout() + meta.process().Stderr()).find("TLS"), std::string::npos);
  std::vector<std::string> secure = {"--meta",          meta.address(), "--token-file",
                                     dir_.Sub("token"), "--tls-ca",     dir_.Sub("good-ca.pem")};
  auto with = [&](std::vector<std::string> args, const std::vector<std::string>& extra) {
    args.insert(args.end(), extra.begin(), extra.end());
    return RunEmber(args);
  };
  auto r = with({"dataset", "add", "ds", origin_}, secure);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Plaintext to a TLS server, and a server certificate from another CA, both fail clearly.
  r = with({"dataset", "ls"}, {"--meta", meta.address(), "--token-file", dir_.Sub("token")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("meta unreachable at " + meta.address()), std::string::npos) << r.err;
  r = with({"dataset", "ls"}, {"--meta", meta.address(), "--token-file", dir_.Sub("token"),
                               "--tls-ca", dir_.Sub("other-ca.pem")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("meta unreachable"), std::string::npos) << r.err;
  r = with({"dataset", "ls"}, {"--meta", meta.address(), "--token-file", dir_.Sub("token"),
                               "--tls-ca", dir_.Sub("no-such-ca.pem")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--tls-ca"), std::string::npos) << r.err;
  // Without the token, TLS alone is not enough.
  r = with({"dataset", "ls"}, {"--meta", meta.address(), "--tls-ca", dir_.Sub("good-ca.pem")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("requires the cluster token"), std::string::npos) << r.err;

  // A node over TLS serves the dataset.
  NodeProcess::Options o;
  o.extra_args = {"--token-file", dir_.Sub("token"), "--tls-ca", dir_.Sub("good-ca.pem")};
  NodeProcess node(dir_.Sub("node"), meta.address(), o);
  ASSERT_TRUE(node.Start());
  EXPECT_EQ(ReadUncached(node.mount() + "/ds/sub/small.bin"), ReadFile(origin_ + "/sub/small.bin"));
  EXPECT_TRUE(testing::WaitFor([&] {
    auto n = meta.client().ListNodes();
    return n.ok() && n->size() == 1;
  }));
}

rpc::BlockAddr Addr(uint32_t ds, uint32_t ver, uint64_t file, uint64_t idx) {
  rpc::BlockAddr a;
  a.set_dataset_id(ds);
  a.set_version(ver);
  a.set_file_id(file);
  a.set_index(idx);
  return a;
}

TEST_F(SecurityTest, HostileRequestsGetClearErrorsAndWriteNothing) {
  MetaProcess meta(dir_.Sub("meta"));
  auto& c = meta.client();
  auto r =
      RunEmber({"dataset", "add", "ds", origin_, "--meta", meta.address(), "--block-size", "1MiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  rpc::Node n;
  n.set_id("n1");
  n.set_address("127.0.0.1:1");
  ASSERT_TRUE(c.RegisterNode(n).ok());

  auto code = [](const absl::Status& s) { return s.code(); };
  // Checksums for blocks that cannot exist: unknown dataset, version, file, index far out.
  for (const auto& a : {Addr(99, 1, 2, 0), Addr(1, 7, 2, 0), Addr(1, 1, 0, 0),
                        Addr(1, 1, 1u << 30, 0), Addr(1, 1, 2, ~0ull), Addr(1, 1, 2, 1ull << 40)}) {
    rpc::RecordChecksumsRequest req;
    auto* cs = req.add_checksums();
    *cs->mutable_block() = a;
    cs->set_checksum(42);
    auto st = c.RecordChecksums(req).status();
    EXPECT_TRUE(absl::IsNotFound(st) || absl::IsInvalidArgument(st)) << a.ShortDebugString() << st;
    EXPECT_FALSE(st.message().empty());
    rpc::GetChecksumsRequest get;
    *get.add_blocks() = a;
    auto g = c.GetChecksums(get);
    ASSERT_TRUE(g.ok());
    EXPECT_FALSE(g->present(0)) << "written: " << a.ShortDebugString();
  }
  // Location reports that would grow a bitmap without bound.
  rpc::ReportBlocksRequest rep;
  rep.set_node_id("n1");
  *rep.add_added() = Addr(1, 1, 2, 1ull << 40);
  EXPECT_EQ(code(c.ReportBlocks(rep)), absl::StatusCode::kInvalidArgument);
  rpc::ReportBlocksRequest huge_bitmap;
  huge_bitmap.set_node_id("n1");
  auto* f = huge_bitmap.add_files();
  f->set_dataset_id(1);
  f->set_version(1);
  f->set_file_id(2);
  f->set_bitmap(std::string(1 << 20, '\xff'));
  EXPECT_EQ(code(c.ReportBlocks(huge_bitmap)), absl::StatusCode::kInvalidArgument);
  rpc::LocateRequest loc;
  *loc.add_blocks() = Addr(1, 1, 2, 1ull << 40);
  auto l = c.Locate(loc);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->holders(0).node_ids_size(), 0);

  // Paths: `..`, absolute, and unknown paths inside a dataset; unknown ids everywhere.
  for (const std::string path : {"../etc/passwd", "/etc/passwd", "sub/../../x", "nope"}) {
    rpc::PrefetchSpec spec;
    spec.set_dataset("ds");
    spec.add_paths(path);
    auto st = c.StartPrefetch(spec).status();
    EXPECT_FALSE(st.ok()) << path;
    EXPECT_TRUE(absl::IsNotFound(st) || absl::IsInvalidArgument(st)) << path << ": " << st;
  }
  EXPECT_EQ(code(c.GetDataset("nope").status()), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(c.GetPrefetch("pf-999").status()), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(c.CancelPrefetch("pf-999").status()), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(c.GetJob("job-999").status()), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(c.CancelJob("job-999").status()), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(c.Locality("nope", 0).status()), absl::StatusCode::kNotFound);
  EXPECT_FALSE(c.ReportPrefetch("pf-999", rpc::PrefetchNodeProgress()).ok());
  EXPECT_EQ(code(c.ListManifestPage("ds", 99, 0, 0).status()), absl::StatusCode::kNotFound);
  auto page = c.ListManifestPage("ds", 0, 0, ~0u);  // a huge page size is capped
  ASSERT_TRUE(page.ok());
  EXPECT_LE(page->entries_size(), 10000);
  page = c.ListManifestPage("ds", 0, ~0ull, 10);  // past the end: empty, not an error
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->entries_size(), 0);
  for (const std::string origin : {"relative/dir", "/no/such/dir", "s3x://weird", ""}) {
    EXPECT_FALSE(c.AddDataset("bad", origin, 0).ok()) << origin;
  }
  for (const std::string& name :
       std::vector<std::string>{"../up", "a/b", "", std::string(300, 'n')}) {
    EXPECT_EQ(code(c.AddDataset(name, origin_, 0).status()), absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_EQ(code(c.AddDataset("bs", origin_, 3).status()), absl::StatusCode::kInvalidArgument);
  // An oversized message is refused by gRPC's limit, with a message that says so.
  rpc::Node fat = n;
  (*fat.mutable_labels())["x"] = std::string(20 << 20, 'x');
  auto fat_st = c.RegisterNode(fat).status();
  EXPECT_EQ(fat_st.code(), absl::StatusCode::kResourceExhausted) << fat_st;

  // Meta is alive and holds exactly what was legitimately written.
  auto datasets = c.ListDatasets();
  ASSERT_TRUE(datasets.ok());
  ASSERT_EQ(datasets->size(), 1u);
  EXPECT_EQ(datasets->at(0).name(), "ds");
  auto jobs = c.ListPrefetches();
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->empty());
  auto nodes = c.ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_TRUE(nodes->at(0).labels().empty());
  EXPECT_TRUE(meta.process().Running());
}

TEST_F(SecurityTest, SymlinksAreNeverFollowedOutOfTheOrigin) {
  std::string outside = dir_.Sub("outside");
  fs::create_directories(outside);
  WriteFile(outside + "/secret", "outside bytes");
  fs::create_symlink(outside + "/secret", origin_ + "/escape");
  MetaProcess meta(dir_.Sub("meta"));
  ASSERT_EQ(RunEmber({"dataset", "add", "ds", origin_, "--meta", meta.address()}).exit_code, 0);
  NodeProcess node(dir_.Sub("node"), meta.address());
  ASSERT_TRUE(node.Start());
  // The link is shown as a link (the kernel resolves it on this host like any symlink); the
  // dataset never contains the outside file's bytes.
  struct stat st;
  ASSERT_EQ(lstat((node.mount() + "/ds/escape").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(fs::read_symlink(node.mount() + "/ds/escape").string(), outside + "/secret");

  // A directory swapped for a symlink after the scan, to a look-alike file outside with the
  // same size and mtime: the fill refuses to follow it (EIO), never serving outside bytes.
  std::string small = origin_ + "/sub/small.bin";
  fs::create_directories(outside + "/sub");
  WriteRandomFile(outside + "/sub/small.bin", 5000, 9);
  std::string touch = absl::StrCat("touch -r ", small, " ", outside, "/sub/small.bin");
  ASSERT_EQ(std::system(touch.c_str()), 0);
  fs::rename(origin_ + "/sub", dir_.Sub("moved-sub"));
  fs::create_symlink(outside + "/sub", origin_ + "/sub");
  std::string got = ReadUncached(node.mount() + "/ds/sub/small.bin");
  EXPECT_NE(got, ReadFile(outside + "/sub/small.bin"));
  EXPECT_NE(got.find("read failed"), std::string::npos) << got.substr(0, 100);
  EXPECT_NE(node.Log().find("not followed out of the origin"), std::string::npos) << node.Log();
}

TEST_F(SecurityTest, MountIsReadOnlyAndHonoursOriginPermissions) {
  WriteFile(origin_ + "/private", "root only");
  chmod((origin_ + "/private").c_str(), 0600);
  chmod((origin_ + "/sub/small.bin").c_str(), 0644);
  MetaProcess meta(dir_.Sub("meta"));
  ASSERT_EQ(RunEmber({"dataset", "add", "ds", origin_, "--meta", meta.address()}).exit_code, 0);
  NodeProcess::Options o;
  o.extra_args = {"--allow-other"};
  NodeProcess node(dir_.Sub("node"), meta.address(), o);
  ASSERT_TRUE(node.Start());
  // Writes are refused.
  std::ofstream w(node.mount() + "/ds/new-file");
  EXPECT_FALSE(w.good());
  EXPECT_NE(mkdir((node.mount() + "/ds/newdir").c_str(), 0755), 0);
  EXPECT_EQ(errno, EROFS);
  // As user nobody: the 0644 file reads, the 0600 root file does not.
  fs::permissions(dir_.path(),
                  fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec);
  auto as_nobody = [&](const std::string& path) {
    std::string cmd = absl::StrCat("setpriv --reuid=65534 --regid=65534 --clear-groups cat ", path,
                                   " >/dev/null 2>&1");
    return std::system(cmd.c_str());
  };
  EXPECT_EQ(as_nobody(node.mount() + "/ds/sub/small.bin"), 0);
  EXPECT_NE(as_nobody(node.mount() + "/ds/private"), 0);
  EXPECT_EQ(ReadUncached(node.mount() + "/ds/private"), "root only");  // root still can
}

TEST_F(SecurityTest, MountWithoutAllowOtherIsPrivate) {
  MetaProcess meta(dir_.Sub("meta"));
  ASSERT_EQ(RunEmber({"dataset", "add", "ds", origin_, "--meta", meta.address()}).exit_code, 0);
  NodeProcess node(dir_.Sub("node"), meta.address());
  ASSERT_TRUE(node.Start());
  fs::permissions(dir_.path(),
                  fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec);
  std::string cmd = absl::StrCat("setpriv --reuid=65534 --regid=65534 --clear-groups cat ",
                                 node.mount(), "/ds/sub/small.bin >/dev/null 2>&1");
  EXPECT_NE(std::system(cmd.c_str()), 0);
}

// Every listening TCP socket of these processes, as "addr:port" (IPv4, from /proc/PID/net/tcp
// filtered by the process's socket inodes).
std::set<std::string> ListeningAddresses(pid_t pid) {
  std::set<std::string> inodes;
  for (const auto& e : fs::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    std::error_code ec;
    std::string target = fs::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::set<std::string> out;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/net/", table));
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() < 10 || f[3] != "0A" || !inodes.count(f[9])) continue;  // 0A = LISTEN
      out.insert(f[1]);
    }
  }
  return out;
}

TEST_F(SecurityTest, NothingListensBeyondLoopbackByDefault) {
  // `ember up` with no address flags: meta and the node's block server on their defaults.
  if (testing::PortOpen("127.0.0.1:7370") || testing::PortOpen("127.0.0.1:7371")) {
    GTEST_SKIP() << "default ports 7370/7371 are in use on this machine";
  }
  std::string mnt = dir_.Sub("mnt");
  testing::Process up({EMBER_BINARY, "up", "--data-dir", dir_.Sub("data"), "--mount", mnt,
                       "--dataset", "ds=" + origin_, "--cache-size", "64MiB"},
                      dir_.Sub("up"));
  ASSERT_TRUE(testing::WaitFor([&] { return testing::IsMounted(mnt) || !up.Running(); },
                               std::chrono::seconds(30)));
  ASSERT_TRUE(up.Running()) << up.Stderr();
  EXPECT_EQ(ReadUncached(mnt + "/ds/sub/small.bin"), ReadFile(origin_ + "/sub/small.bin"));
  int sockets = 0;
  for (const std::string& a : ListeningAddresses(up.pid())) {
    sockets++;
    // /proc/net/tcp: 0100007F = 127.0.0.1 (little-endian hex); loopback is 127.0.0.0/8.
    std::string ip = a.substr(0, a.find(':'));
    bool loopback4 = ip.size() == 8 && ip.substr(6) == "7F";
    bool loopback6 = ip == "00000000000000000000000001000000" ||
                     (ip.size() == 32 && ip.substr(0, 24) == "0000000000000000FFFF0000" &&
                      ip.substr(30) == "7F");  // ::1, or ::ffff:127.x.x.x
    EXPECT_TRUE(loopback4 || loopback6) << "listens on " << a;
  }
  EXPECT_GE(sockets, 2);  // meta's gRPC, the node's block server
  up.Signal(SIGTERM);
  EXPECT_EQ(up.Wait(std::chrono::seconds(20)), 0) << up.Stderr();
  testing::ForceUnmount(mnt);
}

}  // namespace
}  // namespace ember
