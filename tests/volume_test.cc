// Writable volumes (checkpoints) on a real cluster: one `ember meta`, two `ember node` processes
// on 127.0.0.x with their own caches and FUSE mounts; files written with plain POSIX calls (and
// Debian's python3-torch when installed) through one mount and read through the other.
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/cluster.h"
#include "tests/testing/testing.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::HttpGet;
using testing::MetaProcess;
using testing::MetricSample;
using testing::NodeProcess;
using testing::RunEmber;
using testing::TempDir;

constexpr size_t kMiB = 1 << 20;

std::string Random(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

// Writes `data` to `path` through a mount as a checkpoint writer would: create, write in 1 MiB
// pieces, fsync, close. Returns 0 or the errno of the first call that failed.
int Save(const std::string& path, const std::string& data, bool fsync_it = true) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  for (size_t off = 0; off < data.size(); off += kMiB) {
    const size_t len = std::min(kMiB, data.size() - off);
    if (pwrite(fd, data.data() + off, len, static_cast<off_t>(off)) != static_cast<ssize_t>(len)) {
      int err = errno;
      close(fd);
      return err;
    }
  }
  if (fsync_it && fsync(fd) != 0) {
    int err = errno;
    close(fd);
    return err;
  }
  return close(fd) == 0 ? 0 : errno;
}

// The whole file through a fresh open, or "<errno N>".
std::string Load(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::StrCat("<errno ", errno, ">");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      int err = errno;
      close(fd);
      return absl::StrCat("<errno ", err, ">");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

class VolumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The io_uring run (tests/CMakeLists.txt): NodeProcess adds --fuse-uring.
    const char* uring = std::getenv("EMBER_TEST_FUSE_URING");
    if (uring != nullptr && *uring == '1' && !testing::EnableFuseUring()) {
      GTEST_SKIP() << "this kernel has no FUSE over io_uring";
    }
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), "2s");
    fs::create_directories(dir_.Sub("upload"));
    auto r = Ember({"volume", "add", "ckpt", dir_.Sub("upload"), "--block-size", "1MiB"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    a_ = Node("n1", 51);
    b_ = Node("n2", 52);
    ASSERT_TRUE(a_ && b_);
  }

  testing::RunResult Ember(std::vector<std::string> args) {
    args.push_back("--meta");
    args.push_back(meta_->address());
    return RunEmber(args);
  }

  // `metrics`: set to the address its /metrics is served on.
  // `extra`: more flags.
  std::unique_ptr<NodeProcess> Node(const std::string& id, int host, std::string* metrics = nullptr,
                                    const std::vector<std::string>& extra = {}) {
    NodeProcess::Options o;
    o.id = id;
    o.listen_host = absl::StrCat("127.0.0.", host);
    o.extra_args = extra;
    if (metrics != nullptr) {
      *metrics = absl::StrCat("127.0.0.1:", testing::FreePort());
      o.extra_args.push_back("--metrics-listen");
      o.extra_args.push_back(*metrics);
    }
    auto n = std::make_unique<NodeProcess>(dir_.Sub(id), meta_->address(), o);
    if (!n->Start()) return nullptr;
    return n;
  }

  // Waits until meta lists node `id` as dead (its lease ran out); false after 20 s.
  bool DeadInMeta(const std::string& id) {
    return testing::WaitFor(
        [&] {
          auto nodes = meta_->client().ListNodes();
          return nodes.ok() && std::any_of(nodes->begin(), nodes->end(), [&](const rpc::Node& n) {
                   return n.id() == id && n.state() == rpc::Node::DEAD;
                 });
        },
        std::chrono::seconds(20));
  }

  // How many volume contents `node` holds on its disk (whole or being written).
  static int Copies(const NodeProcess& node) {
    int n = 0;
    std::error_code ec;
    for (auto& e : fs::recursive_directory_iterator(node.cache_dir() + "/volumes", ec)) {
      if (e.is_regular_file() && e.path().extension() == "") n++;
    }
    return n;
  }

  // The file's record in `ember volume status --json`.
  json Status(const std::string& name) {
    auto r = Ember({"volume", "status", "ckpt", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const json all = json::parse(r.out);
    for (const auto& f : all["files"]) {
      if (f["path"] == name) return f;
    }
    return json();
  }
  // Waits up to 30 s for the file's state to be `state` at origin path `origin_path`.
  bool WaitFor(const std::string& name, const std::string& state, const std::string& origin_path) {
    for (int i = 0; i < 300; ++i) {
      json f = Status(name);
      if (f.is_object() && f["state"] == state && f["origin_path"] == origin_path) return true;
      usleep(100'000);
    }
    return false;
  }

  std::string A(const std::string& rel) { return a_->mount() + "/ckpt/" + rel; }
  std::string B(const std::string& rel) { return b_->mount() + "/ckpt/" + rel; }

  TempDir dir_;
  std::unique_ptr<MetaProcess> meta_;
  std::unique_ptr<NodeProcess> a_, b_;
};

TEST_F(VolumeTest, ACheckpointSavedOnOneNodeIsReadWholeOnAnotherAfterItsRename) {
  ASSERT_TRUE(fs::is_directory(a_->mount() + "/ckpt"));
  std::vector<std::string> root;  // the volume is listed at the root beside datasets
  for (auto& e : fs::directory_iterator(b_->mount())) root.push_back(e.path().filename());
  EXPECT_EQ(root, (std::vector<std::string>{"ckpt"}));
  ASSERT_EQ(mkdir(A("run7").c_str(), 0755), 0) << strerror(errno);
  ASSERT_EQ(mkdir(A("run7/step_1000.tmp").c_str(), 0755), 0) << strerror(errno);
  const std::string r0 = Random(9 * kMiB + 123, 1), r1 = Random(3 * kMiB, 2);
  ASSERT_EQ(Save(A("run7/step_1000.tmp/rank0.pt"), r0), 0);
  ASSERT_EQ(Save(A("run7/step_1000.tmp/rank1.pt"), r1, /*fsync_it=*/false), 0);  // close alone
  ASSERT_EQ(rename(A("run7/step_1000.tmp").c_str(), A("run7/step_1000").c_str()), 0)
      << strerror(errno);

  // The other node sees the renamed directory at once, and every byte (copied from n1).
  EXPECT_FALSE(fs::exists(B("run7/step_1000.tmp")));
  EXPECT_EQ(fs::file_size(B("run7/step_1000/rank0.pt")), r0.size());
  EXPECT_TRUE(Load(B("run7/step_1000/rank0.pt")) == r0);
  EXPECT_TRUE(Load(B("run7/step_1000/rank1.pt")) == r1);
  EXPECT_TRUE(Load(A("run7/step_1000/rank0.pt")) == r0);
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(B("run7/step_1000"))) {
    names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"rank0.pt", "rank1.pt"}));
  // n2 read them from n1's copy into memory as they were read: none on n2's disk.
  EXPECT_EQ(Copies(*b_), 0);
  EXPECT_EQ(Copies(*a_), 2);

  char state[32] = {0};
  ssize_t n =
      getxattr(B("run7/step_1000/rank0.pt").c_str(), "user.ember.state", state, sizeof(state));
  ASSERT_GT(n, 0) << strerror(errno);
  // --replicas 1: replicated at the close, persisted once the background upload is done.
  EXPECT_TRUE(std::string(state, static_cast<size_t>(n)) == "replicated" ||
              std::string(state, static_cast<size_t>(n)) == "persisted")
      << state;
  ASSERT_TRUE(WaitFor("run7/step_1000/rank1.pt", "persisted", "run7/step_1000/rank1.pt"));
  ASSERT_TRUE(WaitFor("run7/step_1000/rank0.pt", "persisted", "run7/step_1000/rank0.pt"));
  n = getxattr(B("run7/step_1000/rank0.pt").c_str(), "user.ember.state", state, sizeof(state));
  EXPECT_EQ(std::string(state, static_cast<size_t>(std::max<ssize_t>(n, 0))), "persisted");
  auto st = Ember({"volume", "status", "ckpt", "--json"});
  ASSERT_EQ(st.exit_code, 0) << st.err;
  json j = json::parse(st.out);
  ASSERT_EQ(j["files"].size(), 2u) << st.out;
  EXPECT_EQ(j["files"][0]["path"], "run7/step_1000/rank0.pt");
  EXPECT_EQ(j["files"][0]["holders"][0], "n1");
  EXPECT_EQ(j["bytes_unpersisted"], 0);

  // A new save replaces the file: the next open on the other node sees the new bytes.
  const std::string r0b = Random(2 * kMiB + 5, 3);
  ASSERT_EQ(Save(A("run7/step_1000/rank0.pt"), r0b), 0);
  // Its open on the other node reads from the holder, past the mount's page cache
  // (FOPEN_DIRECT_IO): a shared mapping of it still reads the new bytes.
  int fd = open(B("run7/step_1000/rank0.pt").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << strerror(errno);
  void* m = mmap(nullptr, r0b.size(), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED) << strerror(errno);
  EXPECT_TRUE(std::string(static_cast<const char*>(m), r0b.size()) == r0b);
  munmap(m, r0b.size());
  close(fd);
  EXPECT_TRUE(Load(B("run7/step_1000/rank0.pt")) == r0b);
}

TEST_F(VolumeTest, NothingUncommittedIsSeenElsewhereAndOneNodeWritesAFileAtATime) {
  int fd = open(A("shard").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  const std::string half = Random(2 * kMiB, 4);
  ASSERT_EQ(write(fd, half.data(), half.size()), static_cast<ssize_t>(half.size()));
  // Written, not yet flushed: the other node sees the file empty (created), never a part.
  EXPECT_EQ(fs::file_size(B("shard")), 0u);
  EXPECT_EQ(Load(B("shard")), "");
  EXPECT_EQ(fs::file_size(A("shard")), half.size());  // the writer sees its own writes
  // A second writer elsewhere is refused while the first holds the file.
  int other = open(B("shard").c_str(), O_WRONLY);
  EXPECT_EQ(other, -1);
  EXPECT_EQ(errno, EBUSY);
  ASSERT_EQ(close(fd), 0);
  EXPECT_TRUE(Load(B("shard")) == half);
  // Once closed, the other node may write it; the first sees that at its next open.
  const std::string next = Random(kMiB + 1, 5);
  ASSERT_EQ(Save(B("shard"), next), 0);
  EXPECT_TRUE(Load(A("shard")) == next);
}

TEST_F(VolumeTest, ChangesAnswerAsPosixSaysAndDatasetsStayReadOnly) {
  ASSERT_EQ(mkdir(A("d").c_str(), 0755), 0);
  ASSERT_EQ(Save(A("d/f"), "x"), 0);
  EXPECT_EQ(rmdir(A("d").c_str()), -1);
  EXPECT_EQ(errno, ENOTEMPTY);
  EXPECT_EQ(rename(A("d").c_str(), A("d/inside").c_str()), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(mkdir(A("d").c_str(), 0755), -1);
  EXPECT_EQ(errno, EEXIST);
  EXPECT_EQ(symlink("f", A("d/link").c_str()), -1);
  EXPECT_EQ(errno, EPERM);
  ASSERT_EQ(truncate(A("d/f").c_str(), 0), 0) << strerror(errno);
  EXPECT_EQ(fs::file_size(B("d/f")), 0u);
  ASSERT_EQ(unlink(B("d/f").c_str()), 0);
  EXPECT_FALSE(fs::exists(A("d/f")));
  EXPECT_EQ(rmdir(A("d").c_str()), 0);
  // A file open for writing goes past the mount's page cache; a shared mapping of it still
  // writes (numpy.memmap-style saves).
  int fd = open(A("mapped").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 3 * 4096), 0);
  void* map = mmap(nullptr, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED) << strerror(errno);
  const std::string bytes = Random(3 * 4096, 61);
  std::memcpy(map, bytes.data(), bytes.size());
  ASSERT_EQ(msync(map, bytes.size(), MS_SYNC), 0);
  munmap(map, bytes.size());
  ASSERT_EQ(close(fd), 0) << strerror(errno);
  EXPECT_TRUE(Load(B("mapped")) == bytes);
  // Outside volumes the mount is read-only.
  EXPECT_EQ(mkdir((a_->mount() + "/new").c_str(), 0755), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(rename(A("x").c_str(), (a_->mount() + "/x").c_str()), -1);
}

TEST_F(VolumeTest, AWriterKilledBeforeCloseLeavesNoTornFile) {
  ASSERT_EQ(Save(A("model.pt"), Random(kMiB, 7)), 0);
  const std::string old = Load(B("model.pt"));
  int fd = open(A("model.pt").c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  const std::string part = Random(2 * kMiB, 8);
  ASSERT_EQ(write(fd, part.data(), part.size()), static_cast<ssize_t>(part.size()));
  a_->Kill(SIGKILL);
  close(fd);
  // The last committed contents stand, from n1's... copy on n2: never the part written.
  EXPECT_TRUE(Load(B("model.pt")) == old);
}

TEST_F(VolumeTest, AWriteInProgressAcrossATakeoverNeverCommitsATornFile) {
  if (const char* u = std::getenv("EMBER_TEST_FUSE_URING"); u != nullptr && *u == '1') {
    GTEST_SKIP() << "io_uring rings are not handed over (--fuse-uring refuses --takeover)";
  }
  const std::string old = Random(kMiB + 3, 9);
  ASSERT_EQ(Save(A("opt.pt"), old), 0);
  int fd = open(A("opt.pt").c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  const std::string part = Random(kMiB, 10);
  ASSERT_EQ(write(fd, part.data(), part.size()), static_cast<ssize_t>(part.size()));
  ASSERT_TRUE(a_->Takeover()) << a_->Log();
  // The successor does not continue the write: it fails rather than add to a truncated copy.
  EXPECT_EQ(write(fd, part.data(), part.size()), -1);
  close(fd);
  EXPECT_TRUE(Load(B("opt.pt")) == old);
  EXPECT_TRUE(Load(A("opt.pt")) == old);
  // Once the lease the old agent held is given back or runs out, the file is writable again;
  // the same node asks for it under its own name, so at once.
  const std::string next = Random(kMiB, 11);
  EXPECT_EQ(Save(A("opt.pt"), next), 0);
  EXPECT_TRUE(Load(B("opt.pt")) == next);
}

TEST_F(VolumeTest, FilesReachTheOriginFollowRenamesThereAndRestoreFromItWithoutAHolder) {
  ASSERT_EQ(mkdir(A("run").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(A("run/step.tmp").c_str(), 0755), 0);
  const std::string data = Random(3 * kMiB + 5, 31);
  ASSERT_EQ(Save(A("run/step.tmp/r0.pt"), data), 0);
  // Uploaded in the background; a rename afterwards is carried to the origin.
  ASSERT_TRUE(WaitFor("run/step.tmp/r0.pt", "persisted", "run/step.tmp/r0.pt"));
  EXPECT_TRUE(testing::ReadFile(dir_.Sub("upload/run/step.tmp/r0.pt")) == data);
  ASSERT_EQ(rename(A("run/step.tmp").c_str(), A("run/step").c_str()), 0);
  ASSERT_TRUE(WaitFor("run/step/r0.pt", "persisted", "run/step/r0.pt"))
      << Status("run/step/r0.pt").dump();
  EXPECT_TRUE(testing::ReadFile(dir_.Sub("upload/run/step/r0.pt")) == data);
  EXPECT_FALSE(fs::exists(dir_.Sub("upload/run/step.tmp")));

  // A rotation (the last checkpoint renamed, a new one saved under its old name; the new one
  // comes first in the listing): each lands at its own path in the origin, the old one is not
  // written over.
  ASSERT_EQ(rename(A("run/step").c_str(), A("run/zold").c_str()), 0);
  ASSERT_EQ(mkdir(A("run/step").c_str(), 0755), 0);
  const std::string newer = Random(kMiB + 1, 33);
  ASSERT_EQ(Save(A("run/step/r0.pt"), newer), 0);
  ASSERT_TRUE(WaitFor("run/zold/r0.pt", "persisted", "run/zold/r0.pt"));
  ASSERT_TRUE(WaitFor("run/step/r0.pt", "persisted", "run/step/r0.pt"));
  EXPECT_TRUE(testing::ReadFile(dir_.Sub("upload/run/zold/r0.pt")) == data);
  EXPECT_TRUE(testing::ReadFile(dir_.Sub("upload/run/step/r0.pt")) == newer);

  // The origin away for a while (a shared file system not mounted): the upload waits for it.
  const std::string later = Random(kMiB, 32);
  ASSERT_EQ(rename(dir_.Sub("upload").c_str(), dir_.Sub("away").c_str()), 0);
  ASSERT_EQ(Save(A("u.pt"), later), 0);
  sleep(3);
  EXPECT_EQ(Status("u.pt")["state"], "replicated") << Status("u.pt").dump();
  EXPECT_FALSE(fs::exists(dir_.Sub("upload")));  // never created by an upload
  ASSERT_EQ(rename(dir_.Sub("away").c_str(), dir_.Sub("upload").c_str()), 0);
  ASSERT_TRUE(WaitFor("u.pt", "persisted", "u.pt")) << Status("u.pt").dump();
  EXPECT_TRUE(testing::ReadFile(dir_.Sub("upload/u.pt")) == later);

  // The only holder gone: n2 restores from the origin's copy, checked against meta's checksums.
  a_->Kill(SIGKILL);
  EXPECT_TRUE(Load(B("run/zold/r0.pt")) == data);
  EXPECT_TRUE(Load(B("run/step/r0.pt")) == newer);
  // A damaged origin copy is refused, never served.
  std::string bad = later;
  bad[kMiB / 2] ^= 1;
  testing::WriteFile(dir_.Sub("upload/u.pt"), bad);
  EXPECT_EQ(Load(B("u.pt")), absl::StrCat("<errno ", EIO, ">"));
}

TEST_F(VolumeTest, NodesRestoringAFileAtOnceReadTheOriginOnceBetweenThem) {
  // A checkpoint in the origin whose only holder is gone (a cluster restarted after a failure).
  const std::string data = Random(24 * kMiB + 3, 41);
  ASSERT_EQ(Save(A("step.pt"), data), 0);
  ASSERT_TRUE(WaitFor("step.pt", "persisted", "step.pt"));
  a_->Kill(SIGKILL);
  ASSERT_TRUE(DeadInMeta("n1"));
  b_.reset();  // started again with its metrics served
  std::string mb, mc, md;
  b_ = Node("n2", 52, &mb);
  auto c = Node("n3", 53, &mc);
  auto d = Node("n4", 54, &md);
  ASSERT_TRUE(b_ && c && d);
  auto origin_bytes = [](const std::string& m) {
    const std::string text = HttpGet(m, "/metrics");
    EXPECT_NE(text.find("ember_"), std::string::npos) << m << ": " << text;
    // A node that never read the origin has no sample (-1): none read.
    return std::max(0.0, MetricSample(text, "ember_volume_origin_read_bytes_total"));
  };
  // Three nodes restore it at once: each gets every byte right, and the origin is read once.
  std::string got[3];
  std::vector<std::thread> readers;
  const std::string paths[3] = {b_->mount(), c->mount(), d->mount()};
  for (int i = 0; i < 3; ++i) {
    readers.emplace_back([&, i] { got[i] = Load(paths[i] + "/ckpt/step.pt"); });
  }
  for (auto& t : readers) t.join();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(got[i] == data) << "node " << i << ": " << got[i].size();
  EXPECT_EQ(origin_bytes(mb) + origin_bytes(mc) + origin_bytes(md),
            static_cast<double>(data.size()));
  // A node restoring it later copies the copier's copy, not the origin's.
  std::string me;
  auto e = Node("n5", 55, &me);
  ASSERT_TRUE(e);
  EXPECT_TRUE(Load(e->mount() + "/ckpt/step.pt") == data);
  EXPECT_EQ(origin_bytes(me), 0.0);
  // Every node that restored it gone: the next one reads the origin (the copier it is sent to
  // cannot be reached) and gets it right.
  b_->Kill(SIGKILL);
  c->Kill(SIGKILL);
  d->Kill(SIGKILL);
  e->Kill(SIGKILL);
  std::string mf;
  auto f = Node("n6", 56, &mf);
  ASSERT_TRUE(f);
  EXPECT_TRUE(Load(f->mount() + "/ckpt/step.pt") == data);
  EXPECT_EQ(origin_bytes(mf), static_cast<double>(data.size()));
}

// A copier that dropped its copy for room is replaced by the next node at once: it answers that
// it neither copies nor holds the contents, and that node reads the origin itself.
TEST_F(VolumeTest, ACopierThatDroppedItsCopyForRoomIsReplacedByTheNextNode) {
  const std::string step = Random(8 * kMiB + 5, 43), other = Random(8 * kMiB, 44);
  ASSERT_EQ(Save(A("step.pt"), step), 0);
  ASSERT_EQ(Save(A("other.pt"), other), 0);
  ASSERT_TRUE(WaitFor("step.pt", "persisted", "step.pt"));
  ASSERT_TRUE(WaitFor("other.pt", "persisted", "other.pt"));
  a_->Kill(SIGKILL);  // no holder left: restores read the origin through a copier
  ASSERT_TRUE(DeadInMeta("n1"));
  // n2 has room for one of the two: it copies step.pt from the origin (meta names it the
  // copier), then drops that copy to make room for other.pt.
  b_.reset();
  b_ = Node("n2", 52, nullptr, {"--volume-space", "12MiB"});
  ASSERT_TRUE(b_);
  EXPECT_TRUE(Load(b_->mount() + "/ckpt/step.pt") == step);
  EXPECT_TRUE(Load(b_->mount() + "/ckpt/other.pt") == other);
  EXPECT_EQ(Copies(*b_), 1);
  std::string mc;
  auto c = Node("n3", 53, &mc);
  ASSERT_TRUE(c);
  EXPECT_TRUE(Load(c->mount() + "/ckpt/step.pt") == step);
  EXPECT_NE(c->Log().find("neither copies nor holds"), std::string::npos) << c->Log();
  EXPECT_EQ(MetricSample(HttpGet(mc, "/metrics"), "ember_volume_origin_read_bytes_total"),
            static_cast<double>(step.size()));
}

// The origin's files, relative to it (regular files only, hidden temp names included).
std::set<std::string> OriginFiles(const std::string& root) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto& e : fs::recursive_directory_iterator(root, ec)) {
    if (e.is_regular_file()) out.insert(fs::relative(e.path(), root).string());
  }
  return out;
}

TEST_F(VolumeTest, RemovalsAndReplacementsAreCarriedToTheOriginWithoutTouchingOtherFiles) {
  const std::string up = dir_.Sub("upload");
  auto origin_settles = [&](const std::set<std::string>& want) {
    for (int i = 0; i < 300; ++i) {
      auto r = Ember({"volume", "status", "ckpt", "--json"});
      if (r.exit_code == 0 && json::parse(r.out)["origin_deletions_waiting"].empty() &&
          OriginFiles(up) == want) {
        return true;
      }
      usleep(100'000);
    }
    return false;
  };
  // Rotation as trainers do it: keep the last step, remove the one before.
  const std::string s1 = Random(kMiB + 7, 41), s2 = Random(2 * kMiB, 42);
  for (const char* d : {"run", "run/step_1", "run/step_2"}) ASSERT_EQ(mkdir(A(d).c_str(), 0755), 0);
  ASSERT_EQ(Save(A("run/step_1/r0.pt"), s1), 0);
  ASSERT_EQ(Save(A("run/step_1/r1.pt"), s1), 0);
  ASSERT_EQ(Save(B("run/step_2/r0.pt"), s2), 0);  // written and uploaded by the other node
  ASSERT_TRUE(WaitFor("run/step_1/r1.pt", "persisted", "run/step_1/r1.pt"));
  ASSERT_TRUE(WaitFor("run/step_2/r0.pt", "persisted", "run/step_2/r0.pt"));
  ASSERT_TRUE(fs::remove_all(A("run/step_1")) == 3u);
  ASSERT_TRUE(origin_settles({"run/step_2/r0.pt"})) << absl::StrJoin(OriginFiles(up), " ");
  EXPECT_FALSE(fs::exists(up + "/run/step_1"));  // the directory it left empty too
  EXPECT_TRUE(testing::ReadFile(up + "/run/step_2/r0.pt") == s2);

  // `latest` replaced by a rename over it, then rewritten in place: the origin ends with the
  // last contents under that name and nothing else.
  const std::string v1 = Random(kMiB, 43), v2 = Random(kMiB + 3, 44), v3 = Random(3000, 45);
  ASSERT_EQ(Save(A("latest.pt"), v1), 0);
  ASSERT_TRUE(WaitFor("latest.pt", "persisted", "latest.pt"));
  ASSERT_EQ(Save(B("latest.pt.tmp"), v2), 0);
  ASSERT_EQ(rename(B("latest.pt.tmp").c_str(), B("latest.pt").c_str()), 0);
  ASSERT_TRUE(WaitFor("latest.pt", "persisted", "latest.pt"));
  ASSERT_TRUE(origin_settles({"run/step_2/r0.pt", "latest.pt"}));
  EXPECT_TRUE(testing::ReadFile(up + "/latest.pt") == v2);
  ASSERT_EQ(Save(A("latest.pt"), v3), 0);
  ASSERT_TRUE(WaitFor("latest.pt", "persisted", "latest.pt"));
  ASSERT_TRUE(origin_settles({"run/step_2/r0.pt", "latest.pt"}));
  EXPECT_TRUE(testing::ReadFile(up + "/latest.pt") == v3);

  // A file someone else put at a removed file's path meanwhile (the origin away while the
  // removal waited) is not deleted: only the copy the upload made is.
  ASSERT_EQ(Save(A("mine.pt"), v1), 0);
  ASSERT_TRUE(WaitFor("mine.pt", "persisted", "mine.pt"));
  ASSERT_TRUE(origin_settles({"run/step_2/r0.pt", "latest.pt", "mine.pt"}));
  ASSERT_EQ(rename(up.c_str(), dir_.Sub("away").c_str()), 0);
  ASSERT_EQ(unlink(A("mine.pt").c_str()), 0);
  sleep(3);
  auto r = Ember({"volume", "status", "ckpt"});
  EXPECT_NE(r.out.find("1 copy(ies) of removed or replaced files waiting"), std::string::npos)
      << r.out;
  testing::WriteFile(dir_.Sub("away/mine.pt"), "theirs");
  ASSERT_EQ(rename(dir_.Sub("away").c_str(), up.c_str()), 0);
  ASSERT_TRUE(origin_settles({"run/step_2/r0.pt", "latest.pt", "mine.pt"}));
  EXPECT_EQ(testing::ReadFile(up + "/mine.pt"), "theirs");

  // An empty marker file reaches the origin, and its removal too.
  ASSERT_EQ(Save(A("run/step_2/DONE"), ""), 0);
  ASSERT_TRUE(origin_settles({"run/step_2/r0.pt", "latest.pt", "mine.pt", "run/step_2/DONE"}));
  EXPECT_EQ(fs::file_size(up + "/run/step_2/DONE"), 0u);
  ASSERT_EQ(unlink(A("run/step_2/DONE").c_str()), 0);
  ASSERT_TRUE(origin_settles({"run/step_2/r0.pt", "latest.pt", "mine.pt"}));
}

TEST_F(VolumeTest, AFullVolumeSpaceNeverDropsUnuploadedFilesWritersWaitThenGetEnospc) {
  NodeProcess::Options o;
  o.id = "n3";
  o.listen_host = "127.0.0.53";
  o.extra_args = {"--volume-space", "4MiB"};
  NodeProcess c(dir_.Sub("n3"), meta_->address(), o);
  ASSERT_TRUE(c.Start()) << c.Log();
  auto C = [&](const std::string& rel) { return c.mount() + "/ckpt/" + rel; };
  ASSERT_EQ(rename(dir_.Sub("upload").c_str(), dir_.Sub("away").c_str()), 0);
  const std::string first = Random(3 * kMiB, 41), second = Random(3 * kMiB, 42);
  ASSERT_EQ(Save(C("first.pt"), first), 0);
  // No room while first.pt is only here: the writer waits, and once the upload makes first.pt
  // droppable (the origin is back) it goes on.
  std::thread back([&] {
    sleep(2);
    rename(dir_.Sub("away").c_str(), dir_.Sub("upload").c_str());
  });
  EXPECT_EQ(Save(C("second.pt"), second), 0);
  back.join();
  EXPECT_TRUE(Load(C("first.pt")) == first);  // from the origin, dropped here for room
  EXPECT_TRUE(Load(B("second.pt")) == second);
  // The origin away again: second.pt cannot be dropped, so a third save waits and then fails
  // with ENOSPC, counted; what was saved before stays whole.
  ASSERT_TRUE(WaitFor("second.pt", "persisted", "second.pt"));
  ASSERT_EQ(rename(dir_.Sub("upload").c_str(), dir_.Sub("away").c_str()), 0);
  ASSERT_EQ(Save(C("third.pt"), Random(2 * kMiB, 43)), 0);
  EXPECT_EQ(Save(C("fourth.pt"), Random(3 * kMiB, 44)), ENOSPC);
  EXPECT_TRUE(Load(B("third.pt")).size() == 2 * kMiB);
  EXPECT_NE(c.Log().find("volume space full"), std::string::npos);
  // The origin back: whatever was dropped for room reads back from it.
  ASSERT_EQ(rename(dir_.Sub("away").c_str(), dir_.Sub("upload").c_str()), 0);
  EXPECT_TRUE(Load(C("second.pt")) == second);
}

TEST_F(VolumeTest, WhileMetaIsAwayNodesReadWhatTheyHoldAndChangesFailClearly) {
  ASSERT_EQ(mkdir(A("run").c_str(), 0755), 0);
  const std::string data = Random(2 * kMiB + 9, 51), other = Random(kMiB, 52);
  ASSERT_EQ(Save(A("run/r0.pt"), data), 0);
  ASSERT_EQ(Save(A("run/r1.pt"), other), 0);
  ASSERT_TRUE(Load(B("run/r0.pt")) == data);  // n2 knows r0.pt's checksums now, not r1.pt's
  auto list = [](const std::string& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return ec ? std::vector<std::string>{ec.message()} : names;
  };
  ASSERT_EQ(list(B("run")).size(), 2u);  // n2 has listed run/ once
  meta_->Kill(SIGKILL);
  EXPECT_TRUE(Load(A("run/r0.pt")) == data);
  EXPECT_TRUE(Load(A("run/r1.pt")) == other);
  EXPECT_TRUE(Load(B("run/r0.pt")) == data);
  EXPECT_EQ(list(B("run")), (std::vector<std::string>{"r0.pt", "r1.pt"}));
  // A directory this node never listed is not guessed at.
  EXPECT_EQ(list(A("run")), (std::vector<std::string>{std::strerror(EIO)}));
  // What needs meta fails with EIO, not a hang and not a guess: contents n2 never read (their
  // checksums are meta's), any change.
  EXPECT_EQ(Load(B("run/r1.pt")), absl::StrCat("<errno ", EIO, ">"));
  EXPECT_EQ(Save(A("run/r2.pt"), other), EIO);
  EXPECT_EQ(mkdir(A("run2").c_str(), 0755), -1);
  EXPECT_EQ(errno, EIO);
  // Meta back: everything goes on, and nothing was committed while it was away.
  meta_->Restart();
  // (each node's meta client reconnects with gRPC's backoff: wait for it)
  auto answered = [&](const std::string& path) {
    std::error_code ec;
    for (int i = 0; i < 100; ++i, usleep(100'000)) {
      if (!fs::exists(path, ec) && !ec) return true;
    }
    return false;
  };
  ASSERT_TRUE(answered(A("run/r2.pt")));
  ASSERT_TRUE(answered(B("run/r9.pt")));
  EXPECT_EQ(Save(A("run/r2.pt"), other), 0);
  EXPECT_TRUE(Load(B("run/r1.pt")) == other);
}

TEST_F(VolumeTest, TorchSavesAndLoadsAStateDictThroughTheMounts) {
  ASSERT_TRUE(fs::exists("/usr/lib/python3/dist-packages/torch"))
      << "Debian's python3-torch is missing: make deps installs it";
  ASSERT_EQ(mkdir(A("run").c_str(), 0755), 0);
  const std::string save = absl::StrCat(
      "import torch, os\n"
      "torch.manual_seed(7)\n"
      "m = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), "
      "torch.nn.Linear(1024, 256))\n"
      "tmp = '",
      A("run/step_10.tmp"),
      "'\n"
      "os.mkdir(tmp)\n"
      "with open(tmp + '/model.pt', 'wb') as f:\n"
      "    torch.save(m.state_dict(), f)\n"
      "    f.flush(); os.fsync(f.fileno())\n"
      "os.rename(tmp, '",
      A("run/step_10"),
      "')\n"
      "torch.save({k: v.sum() for k, v in m.state_dict().items()}, '",
      dir_.Sub("sums.pt"), "')\n");
  testing::WriteFile(dir_.Sub("save.py"), save);
  std::string out;
  ASSERT_EQ(testing::RunShell("/usr/bin/python3 " + dir_.Sub("save.py"), &out), 0) << out;
  const std::string load = absl::StrCat(
      "import torch\n"
      "sd = torch.load('",
      B("run/step_10/model.pt"), "')\n", "sums = torch.load('", dir_.Sub("sums.pt"), "')\n",
      "assert set(sd) == set(sums), (list(sd), list(sums))\n"
      "for k in sd: assert torch.equal(sd[k].sum(), sums[k]), k\n"
      "print(len(sd))\n");
  testing::WriteFile(dir_.Sub("load.py"), load);
  ASSERT_EQ(testing::RunShell("/usr/bin/python3 " + dir_.Sub("load.py"), &out), 0) << out;
  EXPECT_EQ(out, "4\n");
}

// --replicas 2 on three nodes: n1 and n2 in rack r1, n3 in rack r2.
class ReplicatedVolumeTest : public VolumeTest {
 protected:
  void SetUp() override {
    if (const char* u = std::getenv("EMBER_TEST_FUSE_URING"); u != nullptr && *u == '1') {
      GTEST_SKIP() << "replicas do not depend on the FUSE transport: run once";
    }
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), "2s");
    fs::create_directories(dir_.Sub("upload"));
    auto r = Ember(
        {"volume", "add", "ckpt", dir_.Sub("upload"), "--block-size", "1MiB", "--replicas", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    a_ = Node("n1", 51, "rack=r1");
    b_ = Node("n2", 52, "rack=r1");
    c_ = Node("n3", 53, "rack=r2");
    ASSERT_TRUE(a_ && b_ && c_);
  }
  std::unique_ptr<NodeProcess> Node(const std::string& id, int host, const std::string& labels) {
    NodeProcess::Options o;
    o.id = id;
    o.listen_host = absl::StrCat("127.0.0.", host);
    o.extra_args = {"--labels", labels};
    auto n = std::make_unique<NodeProcess>(dir_.Sub(id), meta_->address(), o);
    if (!n->Start()) return nullptr;
    return n;
  }
  std::string C(const std::string& rel) { return c_->mount() + "/ckpt/" + rel; }
  std::unique_ptr<NodeProcess> c_;
};

TEST_F(ReplicatedVolumeTest, AFileSurvivesItsWriterAfterCloseFromTheCopyInAnotherRack) {
  const std::string data = Random(5 * kMiB + 77, 21);
  // The origin away until the writer is dead: the node holding the replica uploads.
  ASSERT_EQ(rename(dir_.Sub("upload").c_str(), dir_.Sub("away").c_str()), 0);
  ASSERT_EQ(Save(A("step_1.pt"), data, /*fsync_it=*/false), 0);  // close alone
  json st = Status("step_1.pt");
  EXPECT_TRUE(st["state"] == "replicated" || st["state"] == "persisted") << st.dump();
  // The copy went to the other rack, and is whole there before the close returned.
  EXPECT_EQ(st["holders"], json::array({"n1", "n3"})) << st.dump();
  a_->Kill(SIGKILL);
  // n2 has no copy: it reads n3's; n3 reads its own.
  EXPECT_TRUE(Load(B("step_1.pt")) == data);
  EXPECT_TRUE(Load(C("step_1.pt")) == data);
  ASSERT_EQ(rename(dir_.Sub("away").c_str(), dir_.Sub("upload").c_str()), 0);
  EXPECT_TRUE(WaitFor("step_1.pt", "persisted", "step_1.pt")) << Status("step_1.pt").dump();
  EXPECT_TRUE(testing::ReadFile(dir_.Sub("upload/step_1.pt")) == data);
  // fsync makes the same promise for a file still open.
  const std::string more = Random(2 * kMiB, 22);
  int fd = open(B("step_2.pt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, more.data(), more.size()), static_cast<ssize_t>(more.size()));
  ASSERT_EQ(fsync(fd), 0) << strerror(errno);
  json st2 = Status("step_2.pt");
  EXPECT_TRUE(st2["state"] == "replicated" || st2["state"] == "persisted") << st2.dump();
  b_->Kill(SIGKILL);
  close(fd);
  EXPECT_TRUE(Load(C("step_2.pt")) == more);
}

TEST_F(ReplicatedVolumeTest, ACorruptCopyIsNeverServedAndReadsGoToAnotherHolder) {
  const std::string data = Random(3 * kMiB, 6);
  ASSERT_EQ(Save(A("w.pt"), data), 0);
  ASSERT_EQ(Status("w.pt")["holders"], json::array({"n1", "n3"}));
  // Flip a byte of n3's copy on its disk.
  std::string copy;
  for (auto& e : fs::recursive_directory_iterator(c_->cache_dir() + "/volumes")) {
    if (e.is_regular_file() && e.path().extension() == "") copy = e.path();
  }
  ASSERT_FALSE(copy.empty());
  int fd = open(copy.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "!", 1, kMiB + 7), 1);
  close(fd);
  const std::string first = Load(C("w.pt"));
  EXPECT_TRUE(first == data || first == absl::StrCat("<errno ", EIO, ">")) << "served wrong bytes";
  EXPECT_FALSE(fs::exists(copy + ".sums"));  // the bad copy is no longer whole
  EXPECT_TRUE(Load(C("w.pt")) == data);      // and n3 reads n1's
  // A node holding nothing asks both holders; the bad bytes of one would be taken from the other.
  EXPECT_TRUE(Load(B("w.pt")) == data);
}

TEST_F(ReplicatedVolumeTest, TooFewNodesFailTheCloseAndCommitNothing) {
  const std::string old = Random(kMiB, 23);
  ASSERT_EQ(Save(A("w.pt"), old), 0);
  // Only n1 is left: a second copy cannot be made. fsync and close say so; nobody sees the
  // new bytes, and the file keeps its copies.
  ASSERT_TRUE(b_->Stop());
  c_->Kill(SIGKILL);
  int fd = open(A("w.pt").c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  const std::string next = Random(kMiB, 24);
  ASSERT_EQ(write(fd, next.data(), next.size()), static_cast<ssize_t>(next.size()));
  EXPECT_EQ(fsync(fd), -1);
  EXPECT_EQ(errno, EIO);
  EXPECT_TRUE(Load(A("w.pt")) == old);
  json st = Status("w.pt");
  EXPECT_TRUE(st["state"] == "replicated" || st["state"] == "persisted") << st.dump();
  EXPECT_EQ(st["size"], kMiB) << st.dump();
  // n2 back: the same handle writes on and its close commits (under a new contents id: the
  // failed attempt's copies, if any, never pass for these bytes).
  ASSERT_TRUE(b_->Start()) << b_->Log();
  const std::string tail = Random(kMiB, 25);
  ASSERT_EQ(pwrite(fd, tail.data(), tail.size(), kMiB), static_cast<ssize_t>(tail.size()));
  EXPECT_EQ(close(fd), 0) << strerror(errno);
  EXPECT_TRUE(Load(B("w.pt")) == next + tail);
  EXPECT_EQ(Status("w.pt")["holders"], json::array({"n1", "n2"}));
}

// The largest file of n3's volume copies (staging and copies ahead have no `.sums`).
uint64_t LargestCopy(const std::string& cache_dir) {
  uint64_t most = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(cache_dir + "/volumes", ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) most = std::max<uint64_t>(most, it->file_size(ec));
  }
  return most;
}

TEST_F(ReplicatedVolumeTest, ReplicasCopyAheadWhileTheWriterWritesAndTheCommitMendsRewrites) {
  const std::string data = Random(40 * kMiB + 11, 26);
  int fd = open(A("big.pt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  // Before any close, n3 (the other rack) copies the first 32 MiB ahead; nobody sees them yet.
  bool ahead = false;
  for (int i = 0; i < 200 && !ahead; ++i) {
    ahead = LargestCopy(c_->cache_dir()) >= 32 * kMiB;
    if (!ahead) usleep(50'000);
  }
  EXPECT_TRUE(ahead) << "no copy ahead on n3";
  struct stat st;
  EXPECT_EQ(stat(C("big.pt").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);  // created, never committed: empty elsewhere
  // A block already copied ahead is written again: the commit's copy takes the new bytes.
  std::string next = data;
  const std::string patch = Random(kMiB / 2, 27);
  next.replace(kMiB + 100, patch.size(), patch);
  ASSERT_EQ(pwrite(fd, patch.data(), patch.size(), kMiB + 100), static_cast<ssize_t>(patch.size()));
  ASSERT_EQ(close(fd), 0) << strerror(errno) << a_->Log() << c_->Log();
  EXPECT_EQ(Status("big.pt")["holders"], json::array({"n1", "n3"}));
  a_->Kill(SIGKILL);
  EXPECT_TRUE(Load(C("big.pt")) == next);  // n3's own copy, every block checked
  EXPECT_TRUE(Load(B("big.pt")) == next);  // copied from n3
}

}  // namespace
}  // namespace ember
