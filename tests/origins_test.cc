// Remote origins against real servers on loopback: an S3-compatible server (npm s3rver,
// installed into the build dir by this test) and nginx (Debian) serving a JSON directory index
// with range requests. Bytes through the mount must equal the objects; bad credentials, missing
// and changed objects and a stalled server must fail clearly.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "origin/http_client.h"
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
using testing::WriteFile;
using testing::WriteRandomFile;

std::string Q(const std::string& s) {  // shell single quotes
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class S3Test : public ::testing::Test {
 protected:
  void SetUp() override {
    npm_ = EMBER_BUILD_DIR "/npm-s3";
    std::string out;
    if (testing::NpmInstallOnce(npm_, "s3rver@3", "node_modules/.bin/s3rver", &out) != 0) {
      GTEST_SKIP() << "cannot install npm s3rver: " << out;
    }
    endpoint_ = absl::StrCat("127.0.0.1:", testing::FreePort());
    fs::create_directories(dir_.Sub("s3data"));
    s3_ = std::make_unique<testing::Process>(
        // s3rver's continuation tokens use a cipher OpenSSL 3 only has in its legacy provider.
        std::vector<std::string>{"/usr/bin/node", "--openssl-legacy-provider",
                                 npm_ + "/node_modules/.bin/s3rver", "-d", dir_.Sub("s3data"), "-a",
                                 "127.0.0.1", "-p", endpoint_.substr(endpoint_.find(':') + 1),
                                 "--configure-bucket", "bkt", "--silent"},
        dir_.Sub("s3rver"));
    ASSERT_TRUE(WaitFor([&] { return testing::PortOpen(endpoint_); }, std::chrono::seconds(20)))
        << s3_->Stderr();
    setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
    setenv("EMBER_S3_ENDPOINT", ("http://" + endpoint_).c_str(), 1);
    setenv("EMBER_ORIGIN_STALL_TIMEOUT", "2", 1);
    // Up once the bucket answers a listing.
    ASSERT_TRUE(WaitFor(
        [&] {
          return testing::RunShell(
                     "curl -sf -o /dev/null -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "
                     "--aws-sigv4 "
                     "aws:amz:us-east-1:s3 --user S3RVER:S3RVER 'http://" +
                     endpoint_ + "/bkt?list-type=2'") == 0;
        },
        std::chrono::seconds(20)));
  }

  // PUTs local files (relative paths under `local`) as keys under `prefix`, 8 at a time.
  void Put(const std::string& local, const std::vector<std::string>& rels,
           const std::string& prefix) {
    std::string list = dir_.Sub("put-list");
    std::string lines;
    for (const auto& r : rels)
      lines += local + "/" + r + "\t" + origin::UrlEncode(prefix + r, true) + "\n";
    WriteFile(list, lines);
    std::string cmd = absl::StrCat(
        "while IFS=$'\\t' read -r f k; do printf '%s\\0%s\\0' \"$f\" \"$k\"; done < ", list,
        " | xargs -0 -n 2 -P 8 sh -c 'curl -sf -o /dev/null -H \"x-amz-content-sha256: "
        "UNSIGNED-PAYLOAD\" --aws-sigv4 aws:amz:us-east-1:s3 --user S3RVER:S3RVER -T \"$0\" "
        "\"http://",
        endpoint_, "/bkt/$1\"'");
    std::string out;
    ASSERT_EQ(testing::RunShell("bash -c " + Q(cmd), &out), 0) << out;
  }

  // The objects of the main fixture: unusual keys, >1000 keys, an empty and a 3-block object.
  void MakeBucket() {
    std::string src = dir_.Sub("src");
    std::vector<std::string> names = {"dir a/file b.txt", "données/été.bin",
                                      "d1/d2/d3/d4/d5/deep.bin", "empty.bin", "big.bin"};
    for (int i = 0; i < 1050; i++) names.push_back(absl::StrCat("many/k", 10000 + i, ".bin"));
    for (size_t i = 0; i < names.size(); i++) {
      fs::create_directories(fs::path(src + "/" + names[i]).parent_path());
      size_t size = names[i] == "empty.bin" ? 0 : names[i] == "big.bin" ? (9 << 20) + 7 : 700 + i;
      WriteRandomFile(src + "/" + names[i], size, 1000 + i);
    }
    names_ = names;
    Put(src, names, "train/");
  }

  TempDir dir_;
  std::string npm_, endpoint_;
  std::unique_ptr<testing::Process> s3_;
  std::vector<std::string> names_;
};

TEST_F(S3Test, ObjectsThroughTheMountEqualTheObjects) {
  MakeBucket();
  MetaProcess meta(dir_.Sub("meta"));
  auto r = RunEmber({"dataset", "add", "s3ds", "s3://bkt/train", "--meta", meta.address()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(absl::StrCat(names_.size(), " files")), std::string::npos) << r.out;
  // Without --block-size an object store gets the larger remote default.
  r = RunEmber({"dataset", "show", "s3ds", "--json", "--meta", meta.address()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["block_size"], 16 << 20) << r.out;
  NodeProcess node(dir_.Sub("node"), meta.address());
  ASSERT_TRUE(node.Start());
  int same = 0;
  for (const auto& n : names_) {
    if (ReadUncached(node.mount() + "/s3ds/" + n) == ReadFile(dir_.Sub("src/" + n))) same++;
  }
  EXPECT_EQ(same, static_cast<int>(names_.size()));
  int listed = 0;
  for (auto& e : fs::recursive_directory_iterator(node.mount() + "/s3ds"))
    listed += e.is_regular_file();
  EXPECT_EQ(listed, static_cast<int>(names_.size()));
  EXPECT_EQ(fs::file_size(node.mount() + "/s3ds/empty.bin"), 0u);
  // Prefetch and locality work as for a directory origin.
  r = RunEmber({"prefetch", "s3ds", "--meta", meta.address()});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  auto loc = RunEmber({"locality", "s3ds", "--json", "--meta", meta.address()});
  ASSERT_EQ(loc.exit_code, 0) << loc.err;
  auto j = nlohmann::json::parse(loc.out);
  EXPECT_DOUBLE_EQ(j["nodes"][0]["fraction"].get<double>(), 1.0) << loc.out;
}

TEST_F(S3Test, WrongCredentialsMissingChangedAndStalledFailClearly) {
  std::string src = dir_.Sub("src");
  fs::create_directories(src);
  for (const char* n : {"a.bin", "b.bin", "c.bin"}) WriteRandomFile(src + "/" + n, 300000, n[0]);
  Put(src, {"a.bin", "b.bin", "c.bin"}, "p/");
  {
    setenv("AWS_ACCESS_KEY_ID", "NOBODY", 1);
    MetaProcess wrong(dir_.Sub("meta-wrong"));
    auto r = RunEmber({"dataset", "add", "x", "s3://bkt/p", "--meta", wrong.address()});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("InvalidAccessKeyId"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
  }
  MetaProcess meta(dir_.Sub("meta"));
  auto r = RunEmber({"dataset", "add", "s3ds", "s3://bkt/p", "--meta", meta.address()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  NodeProcess node(dir_.Sub("node"), meta.address());
  ASSERT_TRUE(node.Start());
  // A deleted object: EIO, and the log names the key.
  std::string out;
  ASSERT_EQ(testing::RunShell(
                "curl -sf -X DELETE -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --aws-sigv4 "
                "aws:amz:us-east-1:s3 --user S3RVER:S3RVER http://" +
                    endpoint_ + "/bkt/p/a.bin",
                &out),
            0)
      << out;
  EXPECT_NE(ReadUncached(node.mount() + "/s3ds/a.bin").find("failed"), std::string::npos);
  EXPECT_TRUE(WaitFor([&] { return node.Log().find("s3://bkt/p/a.bin") != std::string::npos; }))
      << node.Log();
  // An object replaced by other bytes of the same size: refused as stale, never mixed.
  WriteRandomFile(src + "/b.bin", 300000, 99);
  Put(src, {"b.bin"}, "p/");
  std::string got = ReadUncached(node.mount() + "/s3ds/b.bin");
  EXPECT_NE(got.find("failed"), std::string::npos) << got.substr(0, 40);
  EXPECT_TRUE(WaitFor([&] {
    return node.Log().find("changed since the manifest") != std::string::npos;
  })) << node.Log();
  EXPECT_EQ(ReadUncached(node.mount() + "/s3ds/c.bin"), ReadFile(src + "/c.bin"));

  // A server that accepts and never answers: a timeout, not a hang.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  setenv("EMBER_S3_ENDPOINT", absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port)).c_str(), 1);
  MetaProcess stalled(dir_.Sub("meta-stall"));
  auto start = std::chrono::steady_clock::now();
  r = RunEmber({"dataset", "add", "y", "s3://bkt/p", "--meta", stalled.address()});
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("origin unreachable"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Timeout"), std::string::npos) << r.err;
  EXPECT_LT(seconds, 30);  // 4 attempts x 2 s stall timeout, plus backoff
  close(fd);
}

// A checkpoint volume whose origin is a bucket prefix: files are uploaded (a large one in parts),
// renames and removals reach the bucket, and a node restores from it when no holder is left.
TEST_F(S3Test, AVolumeWritesBackToABucketAndRestoresFromIt) {
  MetaProcess meta(dir_.Sub("meta"));
  auto ember = [&](std::vector<std::string> args) {
    args.push_back("--meta");
    args.push_back(meta.address());
    return RunEmber(args);
  };
  auto r = ember({"volume", "add", "bad", "s3://no-such-bucket/ckpt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no-such-bucket"), std::string::npos) << r.err;
  r = ember({"volume", "add", "ckpt", "s3://bkt/ckpt/"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto start = [&](const std::string& id, int host) {
    NodeProcess::Options o;
    o.id = id;
    o.listen_host = absl::StrCat("127.0.0.", host);
    auto n = std::make_unique<NodeProcess>(dir_.Sub(id), meta.address(), o);
    return n->Start() ? std::move(n) : nullptr;
  };
  auto a = start("n1", 61), b = start("n2", 62);
  ASSERT_TRUE(a && b);
  // The bucket's object at `key` ("<missing>" when it is not there).
  auto object = [&](const std::string& key) {
    const std::string to = dir_.Sub("got");
    fs::remove(to);
    const int rc = testing::RunShell(
        "curl -sf -o " + to +
        " -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --aws-sigv4 aws:amz:us-east-1:s3 --user "
        "S3RVER:S3RVER http://" +
        endpoint_ + "/bkt/ckpt/" + key);
    return rc == 0 ? ReadFile(to) : std::string("<missing>");
  };
  auto persisted_at = [&](const std::string& path, const std::string& where) {
    return WaitFor(
        [&] {
          auto st = ember({"volume", "status", "ckpt", "--json"});
          if (st.exit_code != 0) return false;
          const nlohmann::json all = nlohmann::json::parse(st.out);
          for (const auto& f : all["files"]) {
            if (f["path"] == path) return f["state"] == "persisted" && f["origin_path"] == where;
          }
          return false;
        },
        std::chrono::seconds(60));
  };
  const std::string big = dir_.Sub("big"), small = dir_.Sub("small");
  WriteRandomFile(big, (37 << 20) + 11, 7);  // 3 parts of 16 MiB
  WriteRandomFile(small, (1 << 20) + 5, 8);
  const std::string vol = a->mount() + "/ckpt";
  ASSERT_EQ(mkdir((vol + "/step.tmp").c_str(), 0755), 0);
  fs::copy_file(big, vol + "/step.tmp/r0.pt");
  fs::copy_file(small, vol + "/step.tmp/r1.pt");
  ASSERT_TRUE(persisted_at("step.tmp/r0.pt", "step.tmp/r0.pt")) << a->Log();
  ASSERT_TRUE(persisted_at("step.tmp/r1.pt", "step.tmp/r1.pt"));
  EXPECT_TRUE(object("step.tmp/r0.pt") == ReadFile(big));
  EXPECT_TRUE(object("step.tmp/r1.pt") == ReadFile(small));

  // The save's rename and a removal reach the bucket.
  ASSERT_EQ(rename((vol + "/step.tmp").c_str(), (vol + "/step").c_str()), 0);
  ASSERT_TRUE(persisted_at("step/r0.pt", "step/r0.pt"));
  ASSERT_TRUE(persisted_at("step/r1.pt", "step/r1.pt"));
  EXPECT_TRUE(object("step/r0.pt") == ReadFile(big));
  EXPECT_EQ(object("step.tmp/r0.pt"), "<missing>");
  EXPECT_EQ(object("step.tmp/r1.pt"), "<missing>");
  ASSERT_EQ(unlink((vol + "/step/r1.pt").c_str()), 0);
  EXPECT_TRUE(
      WaitFor([&] { return object("step/r1.pt") == "<missing>"; }, std::chrono::seconds(30)));

  // Saved again with the same bytes (the same MD5 ETag): the old copy's deletion never takes
  // the new one.
  fs::copy_file(small, vol + "/same.pt");
  ASSERT_TRUE(persisted_at("same.pt", "same.pt"));
  fs::copy_file(small, vol + "/same.pt", fs::copy_options::overwrite_existing);
  ASSERT_TRUE(persisted_at("same.pt", "same.pt"));
  EXPECT_TRUE(WaitFor(
      [&] {
        auto st = ember({"volume", "status", "ckpt", "--json"});
        return st.exit_code == 0 &&
               nlohmann::json::parse(st.out)["origin_deletions_waiting"].empty();
      },
      std::chrono::seconds(30)));
  sleep(3);  // a pass more
  EXPECT_TRUE(object("same.pt") == ReadFile(small));

  // The only holder gone: the other node reads the file from the bucket, checked.
  a->Kill(SIGKILL);
  EXPECT_TRUE(ReadFile(b->mount() + "/ckpt/step/r0.pt") == ReadFile(big));
}

TEST(HttpOriginTest, NginxDirectoryIndexThroughTheMount) {
  std::string nginx = fs::exists("/usr/sbin/nginx") ? "/usr/sbin/nginx" : "";
  if (nginx.empty()) GTEST_SKIP() << "nginx not installed (Debian package nginx-light)";
  TempDir dir;
  std::string www = dir.Sub("www/data");
  std::vector<std::string> names = {"a.bin", "sub dir/b.bin", "sub dir/deeper/c.txt", "zero",
                                    "later.bin"};
  for (size_t i = 0; i < names.size(); i++) {
    fs::create_directories(fs::path(www + "/" + names[i]).parent_path());
    WriteRandomFile(www + "/" + names[i], names[i] == "zero" ? 0 : (5 << 20) + i * 1000, 70 + i);
  }
  std::string port = std::to_string(testing::FreePort());
  WriteFile(
      dir.Sub("nginx.conf"),
      absl::StrCat("daemon off; master_process off; pid ", dir.Sub("nginx.pid"), "; error_log ",
                   dir.Sub("nginx.err"), ";\nevents {}\nhttp {\n",
                   "  access_log off; client_body_temp_path ", dir.Sub("tmp"), "; proxy_temp_path ",
                   dir.Sub("tmp"), "; fastcgi_temp_path ", dir.Sub("tmp"), "; uwsgi_temp_path ",
                   dir.Sub("tmp"), "; scgi_temp_path ", dir.Sub("tmp"),
                   ";\n  server { listen 127.0.0.1:", port, "; root ", dir.Sub("www"),
                   "; location / { autoindex on; autoindex_format json; } }\n}\n"));
  testing::Process server({nginx, "-c", dir.Sub("nginx.conf"), "-p", dir.path()}, dir.Sub("nginx"));
  ASSERT_TRUE(WaitFor([&] { return testing::PortOpen("127.0.0.1:" + port); }))
      << ReadFile(dir.Sub("nginx.err"));
  MetaProcess meta(dir.Sub("meta"));
  auto r = RunEmber(
      {"dataset", "add", "web", "http://127.0.0.1:" + port + "/data/", "--meta", meta.address()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  NodeProcess node(dir.Sub("node"), meta.address());
  ASSERT_TRUE(node.Start());
  for (const auto& n : names) {
    if (n == "later.bin") continue;
    EXPECT_TRUE(ReadUncached(node.mount() + "/web/" + n) == ReadFile(www + "/" + n)) << n;
  }
  // A file changed on the server after the scan (same size, new time): refused, never mixed.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // a new Last-Modified second
  WriteRandomFile(www + "/later.bin", (5 << 20) + 4000, 5);
  std::string got = ReadUncached(node.mount() + "/web/later.bin");
  EXPECT_NE(got.find("failed"), std::string::npos) << got.substr(0, 40);
  EXPECT_TRUE(WaitFor([&] {
    return node.Log().find("changed since the manifest") != std::string::npos;
  })) << node.Log();
  // A path the server does not have: one clear error at add.
  r = RunEmber(
      {"dataset", "add", "bad", "http://127.0.0.1:" + port + "/nope/", "--meta", meta.address()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("404"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ember
