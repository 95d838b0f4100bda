// Integration tests of the metadata service: a real `ember meta` process, real RocksDB in a temp
// dir, gRPC on 127.0.0.1, driven through the CLI and the client library.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/statvfs.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "meta/meta_client.h"
#include "tests/testing/cluster.h"
#include "tests/testing/testing.h"

namespace ember {
namespace {

using nlohmann::json;
using testing::MetaProcess;
using testing::RunEmber;
using testing::TempDir;
using testing::WaitFor;
using testing::WriteFile;

namespace fs = std::filesystem;

class MetaIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("m"), lease_);
    fs::create_directories(dir_.Sub("origin/sub/deeper"));
    WriteFile(dir_.Sub("origin/a.bin"), std::string(5 << 20, 'a'));
    WriteFile(dir_.Sub("origin/sub/b.txt"), "bee");
    WriteFile(dir_.Sub("origin/sub/deeper/c"), "");
    fs::create_symlink("sub/b.txt", dir_.Sub("origin/link"));
  }

  // Creates `name` under directory `parent` of volume "ckpt" as written by node n1 and commits
  // 5 bytes of it held by n1. Returns: the create's reply (the inode and its contents id).
  absl::StatusOr<rpc::VolumeOpReply> CommitFile(uint64_t parent, const std::string& name) {
    rpc::VolumeOpRequest cr;
    cr.set_volume("ckpt");
    cr.mutable_create()->set_parent(parent);
    cr.mutable_create()->set_name(name);
    cr.mutable_create()->set_node("n1");
    auto file = meta_->client().VolumeOp(cr);
    if (!file.ok()) return file.status();
    rpc::VolumeOpRequest commit;
    commit.set_volume("ckpt");
    commit.mutable_commit()->set_ino(file->inode().ino());
    commit.mutable_commit()->set_node("n1");
    commit.mutable_commit()->set_file_id(file->inode().writing_file_id());
    commit.mutable_commit()->set_size(5);
    commit.mutable_commit()->add_checksums(42);
    commit.mutable_commit()->add_holders("n1");
    auto done = meta_->client().VolumeOp(commit);
    if (!done.ok()) return done.status();
    return file;
  }

  testing::RunResult Ember(std::vector<std::string> args) {
    args.push_back("--meta");
    args.push_back(meta_->address());
    return RunEmber(args);
  }

  json EmberJson(std::vector<std::string> args) {
    args.push_back("--json");
    auto r = Ember(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out);
  }

  rpc::Node MakeNode(const std::string& id, const std::string& addr) {
    rpc::Node n;
    n.set_id(id);
    n.set_address(addr);
    (*n.mutable_labels())["rack"] = "r1";
    n.set_gpus(8);
    n.set_capacity_bytes(1 << 30);
    return n;
  }

  static rpc::BlockAddr Addr(uint32_t ds, uint32_t ver, uint64_t file, uint64_t idx) {
    rpc::BlockAddr a;
    a.set_dataset_id(ds);
    a.set_version(ver);
    a.set_file_id(file);
    a.set_index(idx);
    return a;
  }

  std::vector<std::string> HolderIds(const rpc::BlockAddr& a) {
    rpc::LocateRequest req;
    *req.add_blocks() = a;
    auto r = meta_->client().Locate(req);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    auto ids = r->holders(0).node_ids();
    std::vector<std::string> out(ids.begin(), ids.end());
    std::sort(out.begin(), out.end());
    return out;
  }

  TempDir dir_;
  std::string lease_ = "10s";
  std::unique_ptr<MetaProcess> meta_;
};

TEST_F(MetaIntegrationTest, DatasetLifecycleThroughCli) {
  auto r = Ember({"dataset", "add", "train", dir_.Sub("origin"), "--block-size", "1MiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("3 files, 3 dirs, 1 symlinks"), std::string::npos) << r.out;
  json ls = EmberJson({"dataset", "ls"});
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0]["name"], "train");
  EXPECT_EQ(ls[0]["block_size"], 1 << 20);
  EXPECT_EQ(ls[0]["versions"][0]["files"], 3);
  EXPECT_EQ(ls[0]["versions"][0]["dirs"], 3);
  EXPECT_EQ(ls[0]["versions"][0]["symlinks"], 1);
  EXPECT_EQ(ls[0]["versions"][0]["bytes"], (5 << 20) + 3);

  json files = EmberJson({"dataset", "show", "train", "--files"});
  std::vector<std::string> paths;
  for (auto& f : files) paths.push_back(f["path"]);
  EXPECT_EQ(paths, (std::vector<std::string>{"a.bin", "link", "sub", "sub/b.txt", "sub/deeper",
                                             "sub/deeper/c"}));

  // Bad input: one clear line, non-zero exit, nothing changed.
  struct Bad {
    std::vector<std::string> args;
    std::string says;
  };
  std::vector<Bad> bad = {
      {{"dataset", "add", "train", dir_.Sub("origin")}, "already exists"},
      {{"dataset", "add", "other", "relative/dir"}, "absolute"},
      {{"dataset", "add", "other", dir_.Sub("missing")}, "No such file"},
      {{"dataset", "add", "other", dir_.Sub("origin/a.bin")}, "not a directory"},
      {{"dataset", "add", "bad name", dir_.Sub("origin")}, "allowed are"},
      {{"dataset", "add", "other", dir_.Sub("origin"), "--block-size", "4X"}, "invalid size '4X'"},
      {{"dataset", "add", "other", dir_.Sub("origin"), "--block-size", "3MiB"}, "power of two"},
      {{"dataset", "show", "nope"}, "unknown dataset 'nope'"},
      {{"dataset", "rm", "nope"}, "unknown dataset 'nope'"},
      {{"dataset", "refresh", "nope"}, "unknown dataset 'nope'"},
  };
  for (const auto& b : bad) {
    auto res = Ember(b.args);
    EXPECT_NE(res.exit_code, 0) << b.args[2];
    EXPECT_NE(res.err.find(b.says), std::string::npos) << "stderr: " << res.err;
    EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << res.err;
  }
  EXPECT_EQ(EmberJson({"dataset", "ls"}).size(), 1u);

  r = Ember({"dataset", "rm", "train"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(EmberJson({"dataset", "ls"}).size(), 0u);
  // The name is free again, with a new id (ids are never reused).
  ASSERT_EQ(Ember({"dataset", "add", "train", "file://" + dir_.Sub("origin")}).exit_code, 0);
  json again = EmberJson({"dataset", "show", "train"});
  EXPECT_EQ(again["id"], 2);
  EXPECT_EQ(again["block_size"], 4 << 20);
}

TEST_F(MetaIntegrationTest, RefreshMakesVersionOnlyOnChange) {
  ASSERT_EQ(Ember({"dataset", "add", "d", dir_.Sub("origin")}).exit_code, 0);
  json r = EmberJson({"dataset", "refresh", "d"});
  EXPECT_FALSE(r["changed"]);
  EXPECT_EQ(r["latest_version"], 1);

  WriteFile(dir_.Sub("origin/new.txt"), "new");
  fs::remove(dir_.Sub("origin/sub/deeper/c"));
  WriteFile(dir_.Sub("origin/sub/b.txt"), "bees!");
  r = EmberJson({"dataset", "refresh", "d"});
  EXPECT_TRUE(r["changed"]);
  EXPECT_EQ(r["latest_version"], 2);
  EXPECT_EQ(r["added"], 1);
  EXPECT_EQ(r["removed"], 1);
  EXPECT_GE(r["modified"], 1);  // b.txt (and parent dirs' mtimes)

  // The old version stays readable by id; the new one has the change.
  json v1 = EmberJson({"dataset", "show", "d@1", "--files"});
  json v2 = EmberJson({"dataset", "show", "d@2", "--files"});
  auto find = [](const json& files, const std::string& path) -> json {
    for (auto& f : files) {
      if (f["path"] == path) return f;
    }
    return nullptr;
  };
  EXPECT_EQ(find(v1, "sub/b.txt")["size"], 3);
  EXPECT_EQ(find(v2, "sub/b.txt")["size"], 5);
  EXPECT_TRUE(find(v1, "new.txt").is_null());
  EXPECT_FALSE(find(v2, "new.txt").is_null());
  EXPECT_FALSE(find(v1, "sub/deeper/c").is_null());
  EXPECT_TRUE(find(v2, "sub/deeper/c").is_null());

  // Refresh again without change: still version 2.
  EXPECT_FALSE(EmberJson({"dataset", "refresh", "d"})["changed"]);
  // The latest version cannot be removed alone; an old one can.
  EXPECT_NE(Ember({"dataset", "rm", "d@2"}).exit_code, 0);
  ASSERT_EQ(Ember({"dataset", "rm", "d@1"}).exit_code, 0);
  auto gone = Ember({"dataset", "show", "d@1", "--files"});
  EXPECT_NE(gone.exit_code, 0);
  EXPECT_NE(gone.err.find("no version 1"), std::string::npos) << gone.err;

  // Origin vanished: refresh fails clearly and keeps what exists.
  fs::rename(dir_.Sub("origin"), dir_.Sub("moved"));
  auto lost = Ember({"dataset", "refresh", "d"});
  EXPECT_NE(lost.exit_code, 0);
  EXPECT_NE(lost.err.find(dir_.Sub("origin")), std::string::npos) << lost.err;
  EXPECT_EQ(EmberJson({"dataset", "show", "d"})["latest_version"], 2);
}

TEST_F(MetaIntegrationTest, ChecksumsFirstWriterWins) {
  // Block addresses must exist: dataset 1 version 1 with 1 MiB blocks (a.bin has 5).
  ASSERT_EQ(Ember({"dataset", "add", "d", dir_.Sub("origin"), "--block-size", "1MiB"}).exit_code,
            0);
  rpc::RecordChecksumsRequest req;
  auto* c = req.add_checksums();
  *c->mutable_block() = Addr(1, 1, 2, 3);
  c->set_checksum(111);
  auto r = meta_->client().RecordChecksums(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->conflict(0));
  // The same value again is fine; another value is a conflict and does not replace it.
  r = meta_->client().RecordChecksums(req);
  EXPECT_FALSE(r->conflict(0));
  c->set_checksum(222);
  r = meta_->client().RecordChecksums(req);
  EXPECT_TRUE(r->conflict(0));
  EXPECT_EQ(r->recorded(0).checksum(), 111u);
  rpc::GetChecksumsRequest get;
  *get.add_blocks() = Addr(1, 1, 2, 3);
  *get.add_blocks() = Addr(1, 1, 2, 4);
  auto g = meta_->client().GetChecksums(get);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->present(0));
  EXPECT_EQ(g->checksums(0), 111u);
  EXPECT_FALSE(g->present(1));
}

class LeaseTest : public MetaIntegrationTest {
 protected:
  LeaseTest() { lease_ = "600ms"; }
};

TEST_F(LeaseTest, ExpiredLeaseMarksNodeDeadAndHidesItsBlocks) {
  ASSERT_EQ(Ember({"dataset", "add", "d", dir_.Sub("origin"), "--block-size", "1MiB"}).exit_code,
            0);
  auto& c = meta_->client();
  ASSERT_TRUE(c.RegisterNode(MakeNode("n1", "127.0.0.2:7001")).ok());
  auto reg = c.RegisterNode(MakeNode("n2", "127.0.0.3:7001"));
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ(reg->lease_ms(), 600u);
  EXPECT_LE(reg->heartbeat_interval_ms(), 200u);

  // n1 holds blocks 0 and 2 of file 5; n2 holds block 0 (through a full bitmap report).
  rpc::ReportBlocksRequest r1;
  r1.set_node_id("n1");
  *r1.add_added() = Addr(1, 1, 5, 0);
  *r1.add_added() = Addr(1, 1, 5, 2);
  ASSERT_TRUE(c.ReportBlocks(r1).ok());
  rpc::ReportBlocksRequest r2;
  r2.set_node_id("n2");
  r2.set_full_report_start(true);
  auto* f = r2.add_files();
  f->set_dataset_id(1);
  f->set_version(1);
  f->set_file_id(5);
  f->set_bitmap(std::string("\x01", 1));
  ASSERT_TRUE(c.ReportBlocks(r2).ok());
  EXPECT_EQ(HolderIds(Addr(1, 1, 5, 0)), (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ(HolderIds(Addr(1, 1, 5, 2)), (std::vector<std::string>{"n1"}));
  EXPECT_TRUE(HolderIds(Addr(1, 1, 5, 1)).empty());

  // A report from an unknown node is refused.
  rpc::ReportBlocksRequest stranger;
  stranger.set_node_id("ghost");
  *stranger.add_added() = Addr(1, 1, 5, 1);
  EXPECT_EQ(c.ReportBlocks(stranger).code(), absl::StatusCode::kFailedPrecondition);

  // n1 keeps heartbeating, n2 goes silent: n2 turns dead and drops out of locate.
  std::atomic<bool> stop{false};
  std::thread beat([&] {
    while (!stop) {
      (void)c.Heartbeat("n1", rpc::NodeStats());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto state_of = [&](const std::string& id) {
    auto nodes = c.ListNodes();
    if (!nodes.ok()) return rpc::Node::UNKNOWN;
    for (const auto& n : *nodes) {
      if (n.id() == id) return n.state();
    }
    return rpc::Node::UNKNOWN;
  };
  EXPECT_EQ(state_of("n2"), rpc::Node::ALIVE);
  EXPECT_TRUE(WaitFor([&] { return state_of("n2") == rpc::Node::DEAD; }, std::chrono::seconds(5)));
  EXPECT_EQ(state_of("n1"), rpc::Node::ALIVE);
  EXPECT_EQ(HolderIds(Addr(1, 1, 5, 0)), (std::vector<std::string>{"n1"}));
  json status = EmberJson({"status"});
  ASSERT_EQ(status["nodes"].size(), 2u);
  for (auto& n : status["nodes"]) {
    EXPECT_EQ(n["state"], n["id"] == "n1" ? "alive" : "dead");
    EXPECT_EQ(n["labels"]["rack"], "r1");
  }
  // A heartbeat brings n2 back.
  ASSERT_TRUE(c.Heartbeat("n2", rpc::NodeStats()).ok());
  EXPECT_EQ(HolderIds(Addr(1, 1, 5, 0)), (std::vector<std::string>{"n1", "n2"}));
  // Removing a block: n1 no longer holds block 2.
  rpc::ReportBlocksRequest rm;
  rm.set_node_id("n1");
  *rm.add_removed() = Addr(1, 1, 5, 2);
  ASSERT_TRUE(c.ReportBlocks(rm).ok());
  EXPECT_TRUE(HolderIds(Addr(1, 1, 5, 2)).empty());
  stop = true;
  beat.join();
  // An unknown node's heartbeat is told to register.
  EXPECT_TRUE(c.Heartbeat("ghost", rpc::NodeStats())->reregister());
}

// Locate tells a node when no other live node holds anything of a dataset version, so a cold
// first epoch need not ask again for every block.
TEST_F(LeaseTest, LocateTellsWhenNoOtherLiveNodeHoldsTheDataset) {
  ASSERT_EQ(Ember({"dataset", "add", "d", dir_.Sub("origin"), "--block-size", "1MiB"}).exit_code,
            0);
  auto& c = meta_->client();
  ASSERT_TRUE(c.RegisterNode(MakeNode("n1", "127.0.0.2:7001")).ok());
  ASSERT_TRUE(c.RegisterNode(MakeNode("n2", "127.0.0.3:7001")).ok());
  auto unheld = [&](const std::string& asker, const rpc::BlockAddr& a) {
    rpc::LocateRequest req;
    req.set_node_id(asker);
    *req.add_blocks() = a;
    auto r = c.Locate(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->holders(0).dataset_unheld();
  };
  EXPECT_TRUE(unheld("n1", Addr(1, 1, 6, 0)));  // nobody holds anything yet
  rpc::ReportBlocksRequest r1;
  r1.set_node_id("n1");
  *r1.add_added() = Addr(1, 1, 5, 0);
  ASSERT_TRUE(c.ReportBlocks(r1).ok());
  EXPECT_TRUE(unheld("n1", Addr(1, 1, 6, 0)));   // only the asker holds some of it
  EXPECT_FALSE(unheld("n2", Addr(1, 1, 6, 0)));  // n1 does
  EXPECT_FALSE(unheld("", Addr(1, 1, 6, 0)));    // an anonymous caller: n1 does
  EXPECT_FALSE(unheld("n2", Addr(1, 1, 5, 0)));  // the block itself is held
  EXPECT_TRUE(unheld("n2", Addr(1, 2, 6, 0)));   // another version: nobody
  // n1 goes silent and turns dead: its blocks no longer count.
  std::atomic<bool> stop{false};
  std::thread beat([&] {
    while (!stop) {
      (void)c.Heartbeat("n2", rpc::NodeStats());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  EXPECT_TRUE(WaitFor([&] { return unheld("n2", Addr(1, 1, 6, 0)); }, std::chrono::seconds(5)));
  stop = true;
  beat.join();
}

TEST_F(MetaIntegrationTest, EverythingSurvivesKill9) {
  ASSERT_EQ(Ember({"dataset", "add", "d", dir_.Sub("origin")}).exit_code, 0);
  WriteFile(dir_.Sub("origin/more"), "x");
  ASSERT_EQ(Ember({"dataset", "refresh", "d"}).exit_code, 0);
  auto& c = meta_->client();
  ASSERT_TRUE(c.RegisterNode(MakeNode("n1", "127.0.0.2:7001")).ok());
  rpc::ReportBlocksRequest rep;
  rep.set_node_id("n1");
  *rep.add_added() = Addr(1, 2, 2, 1);
  ASSERT_TRUE(c.ReportBlocks(rep).ok());
  rpc::RecordChecksumsRequest sums;
  auto* s = sums.add_checksums();
  *s->mutable_block() = Addr(1, 2, 2, 1);
  s->set_checksum(0xfeed);
  ASSERT_TRUE(c.RecordChecksums(sums).ok());
  json before = EmberJson({"dataset", "show", "d@2", "--files"});

  meta_->Kill(SIGKILL);
  EXPECT_FALSE(c.ListDatasets().ok());
  meta_->Restart();

  json ds = EmberJson({"dataset", "show", "d"});
  EXPECT_EQ(ds["latest_version"], 2);
  EXPECT_EQ(ds["versions"].size(), 2u);
  EXPECT_EQ(EmberJson({"dataset", "show", "d@2", "--files"}), before);
  EXPECT_EQ(EmberJson({"dataset", "show", "d@1", "--files"}).size(), before.size() - 1);
  auto nodes = c.ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ(nodes->at(0).address(), "127.0.0.2:7001");
  EXPECT_EQ(nodes->at(0).gpus(), 8u);
  EXPECT_EQ(HolderIds(Addr(1, 2, 2, 1)), (std::vector<std::string>{"n1"}));
  sums.mutable_checksums(0)->set_checksum(0xbad);
  EXPECT_TRUE(c.RecordChecksums(sums)->conflict(0));
  // A new dataset after the restart gets a fresh id.
  ASSERT_EQ(Ember({"dataset", "add", "e", dir_.Sub("origin")}).exit_code, 0);
  EXPECT_EQ(EmberJson({"dataset", "show", "e"})["id"], 2);
}

// Meta's data dir on a small file system that fills up: every write fails with a clear error
// and changes nothing, reads go on, writes resume once there is room, and a restart finds exactly
// what was acknowledged.
TEST_F(MetaIntegrationTest, AFullDataDirFailsWritesClearlyAndLosesNothingAcknowledged) {
  const std::string small = dir_.Sub("small");
  fs::create_directories(small);
  if (testing::RunShell("mount -t tmpfs -o size=160m tmpfs " + small) != 0) {
    GTEST_SKIP() << "needs root to mount a tmpfs";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { testing::RunShell("umount -l " + path); }
  } unmount{small};
  MetaProcess meta(small + "/m");
  auto ember = [&](std::vector<std::string> args) {
    args.push_back("--meta");
    args.push_back(meta.address());
    return RunEmber(args);
  };
  auto& c = meta.client();
  ASSERT_EQ(ember({"dataset", "add", "kept", dir_.Sub("origin")}).exit_code, 0);
  ASSERT_TRUE(c.RegisterNode(MakeNode("n1", "127.0.0.2:7001")).ok());
  rpc::JobSpec spec;
  spec.set_name("j1");
  spec.set_workers(1);
  spec.set_gpus_per_worker(4);
  auto j1 = c.SubmitJob(spec);
  ASSERT_TRUE(j1.ok()) << j1.status();
  rpc::PrefetchSpec pf;
  pf.set_dataset("kept");
  auto p1 = c.StartPrefetch(pf);
  ASSERT_TRUE(p1.ok()) << p1.status();

  // Fill the file system to 32 MiB short of full: below meta's 64 MiB reserve.
  struct statvfs vfs;
  ASSERT_EQ(statvfs(small.c_str(), &vfs), 0);
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  ASSERT_GT(avail, 64u << 20);
  ASSERT_EQ(
      testing::RunShell(absl::StrCat("fallocate -l ", avail - (32u << 20), " ", small, "/filler")),
      0);

  auto r = ember({"dataset", "add", "more", dir_.Sub("origin")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("MiB kept in reserve"), std::string::npos) << r.err;
  spec.set_name("j2");
  EXPECT_EQ(c.SubmitJob(spec).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c.CancelPrefetch(p1->id()).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c.RegisterNode(MakeNode("n2", "127.0.0.3:7001")).status().code(),
            absl::StatusCode::kResourceExhausted);
  rpc::RecordChecksumsRequest sums;
  auto* s = sums.add_checksums();
  *s->mutable_block() = Addr(1, 1, 2, 0);
  s->set_checksum(0xfeed);
  EXPECT_EQ(c.RecordChecksums(sums).status().code(), absl::StatusCode::kResourceExhausted);
  // Reads go on, and show nothing of what was refused.
  auto datasets = c.ListDatasets();
  ASSERT_TRUE(datasets.ok());
  EXPECT_EQ(datasets->size(), 1u);
  EXPECT_EQ(c.ListJobs()->jobs_size(), 1);
  EXPECT_EQ(c.GetPrefetch(p1->id())->state(), rpc::PrefetchJob::RUNNING);
  EXPECT_EQ(c.ListNodes()->size(), 1u);

  // Room again: writes work at once, no restart needed.
  fs::remove(small + "/filler");
  ASSERT_EQ(ember({"dataset", "add", "more", dir_.Sub("origin")}).exit_code, 0);
  ASSERT_TRUE(c.RecordChecksums(sums).ok());

  // A restart after kill -9 finds exactly what was acknowledged.
  meta.Kill(SIGKILL);
  meta.Restart();
  datasets = c.ListDatasets();
  ASSERT_TRUE(datasets.ok());
  std::vector<std::string> names;
  for (const auto& ds : *datasets) names.push_back(ds.name());
  EXPECT_EQ(names, (std::vector<std::string>{"kept", "more"}));
  auto jobs = c.ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->jobs_size(), 1);
  EXPECT_EQ(jobs->jobs(0).spec().name(), "j1");
  EXPECT_EQ(c.GetPrefetch(p1->id())->state(), rpc::PrefetchJob::RUNNING);
  EXPECT_EQ(c.ListNodes()->size(), 1u);
  sums.mutable_checksums(0)->set_checksum(0xbad);
  EXPECT_TRUE(c.RecordChecksums(sums)->conflict(0));
}

TEST_F(MetaIntegrationTest, UnreachableMetaNamesTheAddress) {
  int port = testing::FreePort();
  auto r = RunEmber({"dataset", "ls", "--meta", absl::StrCat("127.0.0.1:", port)});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(absl::StrCat("meta unreachable at 127.0.0.1:", port)), std::string::npos)
      << r.err;
  // EMBER_META selects the service too.
  r = RunEmber({"status"}, {"EMBER_META=" + meta_->address()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(meta_->address()), std::string::npos);
}

// 200,000 files: the scan streams to RocksDB and the manifest pages, so meta's memory stays
// bounded (measured: see docs/benchmarks.md) and no RPC message is large.
TEST_F(MetaIntegrationTest, LargeManifestBoundedMemoryAndPaged) {
  const int kDirs = 200, kPerDir = 1000;
  for (int d = 0; d < kDirs; d++) {
    std::string dir = dir_.Sub(absl::StrCat("big/d", d));
    fs::create_directories(dir);
    for (int f = 0; f < kPerDir; f++) {
      std::string path = absl::StrCat(dir, "/file-", f, ".jpg");
      FILE* fp = fopen(path.c_str(), "w");
      ASSERT_NE(fp, nullptr);
      if (f % 10 == 0) fputs("x", fp);
      fclose(fp);
    }
  }
  size_t rss_before = testing::PeakRss(meta_->process().pid());
  auto r = Ember({"dataset", "add", "big", dir_.Sub("big")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  size_t rss_after = testing::PeakRss(meta_->process().pid());
  std::printf("meta peak RSS: %.1f MiB before, %.1f MiB after scanning 200,000 files\n",
              rss_before / 1048576.0, rss_after / 1048576.0);
#if !defined(__SANITIZE_ADDRESS__)  // ASan's shadow memory makes RSS meaningless
  EXPECT_LT(rss_after, 160u << 20);
#endif

  uint64_t count = 0, after = 0, pages = 0, last_id = 0;
  while (true) {
    auto page = meta_->client().ListManifestPage("big", 0, after, 0);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LT(page->ByteSizeLong(), 4u << 20);
    for (const auto& e : page->entries()) {
      EXPECT_GT(e.file_id(), last_id);
      last_id = e.file_id();
    }
    count += page->entries_size();
    pages++;
    if (page->next_after_file_id() == 0) break;
    after = page->next_after_file_id();
  }
  EXPECT_EQ(count, 1u + kDirs + kDirs * kPerDir);
  EXPECT_GT(pages, 10u);
}

// The node meta names to read a volume file's origin copy for everyone (the copier) is replaced
// once its lease runs out, not only once a caller says it could not reach it.
TEST_F(LeaseTest, AVolumeFilesCopierWhoseLeaseRanOutIsReplaced) {
  fs::create_directories(dir_.Sub("ckpt-up"));
  ASSERT_EQ(Ember({"volume", "add", "ckpt", dir_.Sub("ckpt-up")}).exit_code, 0);
  auto& c = meta_->client();
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(
        c.RegisterNode(MakeNode(absl::StrCat("n", i), absl::StrCat("127.0.0.", i + 1, ":7001")))
            .ok());
  }
  // n2 heartbeats throughout; n3 until it has been named the copier.
  std::atomic<bool> stop{false}, n3_beats{true};
  std::thread beat([&] {
    while (!stop) {
      (void)c.Heartbeat("n2", rpc::NodeStats());
      if (n3_beats) (void)c.Heartbeat("n3", rpc::NodeStats());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  absl::Cleanup join = [&] {
    stop = true;
    beat.join();
  };
  auto file = CommitFile(1, "rank0.pt");
  ASSERT_TRUE(file.ok()) << file.status();
  auto copier = [&](const std::string& node) -> std::string {
    rpc::VolumeOpRequest r;
    r.set_volume("ckpt");
    r.mutable_copying()->set_ino(file->inode().ino());
    r.mutable_copying()->set_file_id(file->inode().writing_file_id());
    r.mutable_copying()->set_node(node);
    auto got = c.VolumeOp(r);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() && got->inode().copiers_size() > 0 ? got->inode().copiers(0) : "";
  };
  EXPECT_EQ(copier("n3"), "n3");
  EXPECT_EQ(copier("n2"), "n3");  // alive: n2 copies n3's copy
  n3_beats = false;
  EXPECT_TRUE(WaitFor(
      [&] {
        auto nodes = c.ListNodes();
        if (!nodes.ok()) return false;
        for (const auto& n : *nodes) {
          if (n.id() == "n3") return n.state() == rpc::Node::DEAD;
        }
        return false;
      },
      std::chrono::seconds(5)));
  EXPECT_EQ(copier("n2"), "n2");  // n3's lease ran out: n2 reads the origin
  EXPECT_EQ(copier("n2"), "n2");
}

TEST_F(MetaIntegrationTest, VolumesAreManagedFromTheCliAndTheirTreeSurvivesKill9) {
  fs::create_directories(dir_.Sub("ckpt-up"));
  json v = EmberJson({"volume", "add", "ckpt", dir_.Sub("ckpt-up"), "--replicas", "2"});
  EXPECT_EQ(v["replicas"], 2);
  auto bad = Ember({"volume", "add", "other", dir_.Sub("not-there")});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("not a directory"), std::string::npos) << bad.err;
  auto taken = Ember({"dataset", "add", "ckpt", dir_.Sub("origin")});
  EXPECT_NE(taken.exit_code, 0);
  EXPECT_NE(taken.err.find("volume"), std::string::npos) << taken.err;

  // A namespace change over gRPC; a file system's refusal arrives as its errno.
  rpc::VolumeOpRequest mk;
  mk.set_volume("ckpt");
  mk.mutable_mkdir()->set_parent(1);
  mk.mutable_mkdir()->set_name("run7");
  auto made = meta_->client().VolumeOp(mk);
  ASSERT_TRUE(made.ok()) << made.status();
  auto again = meta_->client().VolumeOp(mk);
  EXPECT_EQ(CarriedErrno(again.status()), EEXIST) << again.status();
  auto file = CommitFile(made->inode().ino(), "rank0.pt");
  ASSERT_TRUE(file.ok()) << file.status();

  meta_->Kill(SIGKILL);
  meta_->Restart();
  json st = EmberJson({"volume", "status", "ckpt"});
  ASSERT_EQ(st["files"].size(), 1u) << st.dump();
  EXPECT_EQ(st["files"][0]["path"], "run7/rank0.pt");
  EXPECT_EQ(st["files"][0]["state"], "local");  // one holder of two replicas
  EXPECT_EQ(st["bytes_unpersisted"], 5);
  rpc::GetChecksumsRequest sums;
  *sums.add_blocks() = Addr(v["id"].get<uint32_t>(), 1, file->inode().writing_file_id(), 0);
  auto got = meta_->client().GetChecksums(sums);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->present(0));
  EXPECT_EQ(got->checksums(0), 42u);

  EXPECT_EQ(Ember({"volume", "rm", "ckpt"}).exit_code, 0);
  EXPECT_TRUE(EmberJson({"volume", "ls"}).empty());
}

}  // namespace
}  // namespace ember
