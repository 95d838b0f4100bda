#include "meta/volumes.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <map>

#include "common/status.h"
#include "meta/store_fixture_test.h"

namespace ember::meta {
namespace {

class VolumesTest : public StoreFixture {
 protected:
  void SetUp() override {
    StoreFixture::SetUp();
    Reload();
  }
  // A new catalog over the store (as after a restart of meta).
  void Reload() {
    volumes_.reset();
    datasets_ = std::make_unique<DatasetCatalog>(store_.get());
    ASSERT_TRUE(datasets_->Load().ok());
    volumes_ =
        std::make_unique<VolumeCatalog>(store_.get(), datasets_.get(), [this] { return now_; });
    ASSERT_TRUE(volumes_->Load().ok());
  }
  rpc::Volume AddVolume(const std::string& name, uint32_t replicas) {
    rpc::AddVolumeRequest req;
    req.set_name(name);
    req.set_origin(dir_.Sub("up-" + name));
    ember::testing::RunShell("mkdir -p " + req.origin());
    req.set_replicas(replicas);
    req.set_block_size(1 << 20);
    auto v = volumes_->Add(req);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : rpc::Volume();
  }
  // Runs one operation on volume "ckpt"; `err` is 0 or the errno it answered.
  rpc::VolumeOpReply Op(const rpc::VolumeOpRequest& req, int* err = nullptr) {
    rpc::VolumeOpRequest r = req;
    if (r.volume().empty()) r.set_volume("ckpt");
    auto reply = volumes_->Apply(r);
    if (err != nullptr) *err = reply.ok() ? 0 : CarriedErrno(reply.status());
    if (err == nullptr) EXPECT_TRUE(reply.ok()) << reply.status();
    if (err != nullptr && !reply.ok()) EXPECT_NE(*err, 0) << reply.status();
    return reply.ok() ? *reply : rpc::VolumeOpReply();
  }
  int Errno(const rpc::VolumeOpRequest& req) {
    int err = 0;
    Op(req, &err);
    return err;
  }
  static rpc::VolumeOpRequest Mkdir(uint64_t parent, const std::string& name) {
    rpc::VolumeOpRequest r;
    r.mutable_mkdir()->set_parent(parent);
    r.mutable_mkdir()->set_name(name);
    r.mutable_mkdir()->set_mode(0755);
    return r;
  }
  static rpc::VolumeOpRequest Create(uint64_t parent, const std::string& name,
                                     const std::string& node, bool exclusive = false) {
    rpc::VolumeOpRequest r;
    r.mutable_create()->set_parent(parent);
    r.mutable_create()->set_name(name);
    r.mutable_create()->set_mode(0644);
    r.mutable_create()->set_node(node);
    r.mutable_create()->set_exclusive(exclusive);
    return r;
  }
  static rpc::VolumeOpRequest Lookup(uint64_t parent, const std::string& name) {
    rpc::VolumeOpRequest r;
    r.mutable_lookup()->set_parent(parent);
    r.mutable_lookup()->set_name(name);
    return r;
  }
  static rpc::VolumeOpRequest Commit(const rpc::VolumeInode& n, const std::string& node,
                                     uint64_t size, std::vector<std::string> holders,
                                     bool keep = false) {
    rpc::VolumeOpRequest r;
    auto* c = r.mutable_commit();
    c->set_ino(n.ino());
    c->set_node(node);
    c->set_file_id(n.writing_file_id());
    c->set_size(size);
    for (uint64_t i = 0; i < (size + (1 << 20) - 1) >> 20; ++i) c->add_checksums(0xabc0 + i);
    for (auto& h : holders) c->add_holders(h);
    c->set_keep_lease(keep);
    return r;
  }
  static rpc::VolumeOpRequest Rename(uint64_t p, const std::string& n, uint64_t np,
                                     const std::string& nn, bool noreplace = false) {
    rpc::VolumeOpRequest r;
    auto* m = r.mutable_rename();
    m->set_parent(p);
    m->set_name(n);
    m->set_new_parent(np);
    m->set_new_name(nn);
    m->set_noreplace(noreplace);
    return r;
  }
  static rpc::VolumeOpRequest Remove(uint64_t p, const std::string& n, bool dir) {
    rpc::VolumeOpRequest r;
    auto* m = dir ? r.mutable_rmdir() : r.mutable_unlink();
    m->set_parent(p);
    m->set_name(n);
    return r;
  }
  std::vector<std::string> Names(uint64_t dir) {
    rpc::VolumeOpRequest r;
    r.mutable_readdir()->set_ino(dir);
    std::vector<std::string> out;
    const rpc::VolumeOpReply reply = Op(r);
    for (const auto& e : reply.entries()) out.push_back(e.name());
    return out;
  }

  int64_t now_ = 1'000'000;
  std::unique_ptr<DatasetCatalog> datasets_;
  std::unique_ptr<VolumeCatalog> volumes_;
};

TEST_F(VolumesTest, AddRefusesBadOriginsAndTakenNamesAndSurvivesARestart) {
  rpc::AddVolumeRequest req;
  req.set_name("ckpt");
  req.set_origin("relative/dir");
  EXPECT_EQ(volumes_->Add(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_origin(dir_.Sub("missing"));
  EXPECT_EQ(volumes_->Add(req).status().code(), absl::StatusCode::kInvalidArgument);
  ember::testing::WriteFile(dir_.Sub("a-file"), "x");
  req.set_origin(dir_.Sub("a-file"));
  EXPECT_EQ(volumes_->Add(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_origin(dir_.path());
  req.set_replicas(9);
  EXPECT_EQ(volumes_->Add(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_replicas(2);
  req.set_name("bad/name");
  EXPECT_FALSE(volumes_->Add(req).ok());

  AddDataset(datasets_.get(), "imgs");
  req.set_name("imgs");
  EXPECT_EQ(volumes_->Add(req).status().code(), absl::StatusCode::kAlreadyExists);

  const rpc::Volume v = AddVolume("ckpt", 2);
  EXPECT_EQ(v.replicas(), 2u);
  EXPECT_NE(v.id(), datasets_->Get("imgs")->id());  // block addresses never collide
  req.set_name("ckpt");
  EXPECT_EQ(volumes_->Add(req).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(volumes_->Has("ckpt"));

  Op(Mkdir(kVolumeRootIno, "run7"));
  Reload();
  ASSERT_EQ(volumes_->List().size(), 1u);
  EXPECT_EQ(volumes_->Get("ckpt")->id(), v.id());
  const auto dir = Op(Lookup(kVolumeRootIno, "run7")).inode();
  // Numbers continue after a restart: a new inode is not an old one's.
  const auto other = Op(Mkdir(kVolumeRootIno, "run8")).inode();
  EXPECT_GT(other.ino(), dir.ino());
  EXPECT_EQ(volumes_->Apply(rpc::VolumeOpRequest()).status().code(),
            absl::StatusCode::kNotFound);  // no volume named ""
}

TEST_F(VolumesTest, NamespaceChangesAnswerWithTheErrnoAFileSystemWould) {
  AddVolume("ckpt", 1);
  const auto run = Op(Mkdir(kVolumeRootIno, "run")).inode();
  EXPECT_TRUE(S_ISDIR(run.mode()));
  EXPECT_EQ(Errno(Mkdir(kVolumeRootIno, "run")), EEXIST);
  EXPECT_EQ(Errno(Mkdir(kVolumeRootIno, "..")), EINVAL);
  EXPECT_EQ(Errno(Mkdir(kVolumeRootIno, "a/b")), EINVAL);
  EXPECT_EQ(Errno(Mkdir(kVolumeRootIno, std::string(256, 'x'))), ENAMETOOLONG);
  EXPECT_EQ(Errno(Mkdir(999, "x")), ENOENT);
  EXPECT_EQ(Errno(Lookup(run.ino(), "nothing")), ENOENT);

  const auto f = Op(Create(run.ino(), "rank0.pt", "n1")).inode();
  EXPECT_TRUE(S_ISREG(f.mode()));
  EXPECT_EQ(Errno(Create(run.ino(), "rank0.pt", "n1", /*exclusive=*/true)), EEXIST);
  EXPECT_EQ(Errno(Mkdir(f.ino(), "x")), ENOTDIR);
  EXPECT_EQ(Errno(Lookup(f.ino(), "x")), ENOTDIR);
  EXPECT_EQ(Errno(Create(kVolumeRootIno, "run", "n1")), EISDIR);
  EXPECT_EQ(Errno(Remove(kVolumeRootIno, "run", /*dir=*/false)), EISDIR);
  EXPECT_EQ(Errno(Remove(run.ino(), "rank0.pt", /*dir=*/true)), ENOTDIR);
  EXPECT_EQ(Errno(Remove(kVolumeRootIno, "run", /*dir=*/true)), ENOTEMPTY);

  // Listings page in name order.
  for (const char* n : {"b", "a", "c"}) Op(Mkdir(run.ino(), n));
  EXPECT_EQ(Names(run.ino()), (std::vector<std::string>{"a", "b", "c", "rank0.pt"}));
  rpc::VolumeOpRequest page;
  page.mutable_readdir()->set_ino(run.ino());
  page.mutable_readdir()->set_max_entries(2);
  auto first = Op(page);
  ASSERT_EQ(first.entries_size(), 2);
  EXPECT_TRUE(first.more());
  page.mutable_readdir()->set_after(first.entries(1).name());
  auto second = Op(page);
  ASSERT_EQ(second.entries_size(), 2);
  EXPECT_EQ(second.entries(0).name(), "c");
  EXPECT_FALSE(second.more());
  EXPECT_EQ(second.inode().children(), 4u);

  Op(Remove(run.ino(), "rank0.pt", false));
  for (const char* n : {"a", "b", "c"}) Op(Remove(run.ino(), n, true));
  EXPECT_EQ(Errno(Lookup(run.ino(), "a")), ENOENT);
  Op(Remove(kVolumeRootIno, "run", true));
  EXPECT_TRUE(Names(kVolumeRootIno).empty());
  rpc::VolumeOpRequest get;
  get.mutable_getattr()->set_ino(f.ino());
  EXPECT_EQ(Errno(get), ENOENT);
}

TEST_F(VolumesTest, OneWriterPerFileUntilItsLeaseRunsOut) {
  AddVolume("ckpt", 1);
  const auto f = Op(Create(kVolumeRootIno, "w", "n1")).inode();
  EXPECT_EQ(f.writer(), "n1");
  ASSERT_NE(f.writing_file_id(), 0u);
  rpc::VolumeOpRequest open2;
  open2.mutable_open_write()->set_ino(f.ino());
  open2.mutable_open_write()->set_node("n2");
  EXPECT_EQ(Errno(open2), EBUSY);
  EXPECT_EQ(Errno(Create(kVolumeRootIno, "w", "n2")), EBUSY);  // O_CREAT of a leased file

  // n1 renews (same contents id); after its lease runs out, n2 takes the file with a new id and
  // n1's commit fails rather than overwrite n2's.
  rpc::VolumeOpRequest renew = open2;
  renew.mutable_open_write()->set_node("n1");
  now_ += VolumeCatalog::kLeaseMs - 1;
  EXPECT_EQ(Op(renew).inode().writing_file_id(), f.writing_file_id());
  now_ += VolumeCatalog::kLeaseMs - 1;
  EXPECT_EQ(Errno(open2), EBUSY);
  now_ += 2;
  const auto taken = Op(open2).inode();
  EXPECT_EQ(taken.writer(), "n2");
  EXPECT_NE(taken.writing_file_id(), f.writing_file_id());
  EXPECT_EQ(Errno(Commit(f, "n1", 10, {"n1"})), EIO);
  EXPECT_EQ(Errno(Commit(taken, "n2", 10, {"n2"})), 0);

  // Release by a node that is not the writer changes nothing.
  const auto again = Op(open2).inode();
  rpc::VolumeOpRequest rel;
  rel.mutable_release()->set_ino(f.ino());
  rel.mutable_release()->set_node("n1");
  EXPECT_EQ(Op(rel).inode().writer(), "n2");
  rel.mutable_release()->set_node("n2");
  EXPECT_EQ(Op(rel).inode().writer(), "");
  EXPECT_NE(again.writing_file_id(), 0u);
}

TEST_F(VolumesTest, ACommitRecordsChecksumsAndReplacesTheContentsWhole) {
  const rpc::Volume v = AddVolume("ckpt", 2);
  const auto f = Op(Create(kVolumeRootIno, "s.pt", "n1")).inode();
  EXPECT_EQ(Errno(Commit(f, "n1", (2 << 20) + 1, {})), EINVAL);  // no holder
  auto wrong_count = Commit(f, "n1", 5 << 20, {"n1"});
  wrong_count.mutable_commit()->mutable_checksums()->RemoveLast();
  EXPECT_EQ(Errno(wrong_count), EINVAL);
  auto wrong_id = Commit(f, "n1", 10, {"n1"});
  wrong_id.mutable_commit()->set_file_id(f.writing_file_id() + 100);
  EXPECT_EQ(Errno(wrong_id), EINVAL);

  // fsync: one holder of two replicas is LOCAL; the lease stays with a new contents id.
  const auto synced = Op(Commit(f, "n1", (2 << 20) + 1, {"n1"}, /*keep=*/true)).inode();
  EXPECT_EQ(synced.state(), rpc::VolumeInode::LOCAL);
  EXPECT_EQ(synced.file_id(), f.writing_file_id());
  EXPECT_EQ(synced.generation(), 1u);
  EXPECT_EQ(synced.writer(), "n1");
  EXPECT_NE(synced.writing_file_id(), synced.file_id());
  for (uint64_t i = 0; i < 3; ++i) {
    auto sum = store_->GetChecksum(BlockAddr{v.id(), kVolumeDataVersion, synced.file_id(), i});
    ASSERT_TRUE(sum.ok() && sum->has_value());
    EXPECT_EQ(**sum, 0xabc0 + i);
  }
  EXPECT_FALSE(
      store_->GetChecksum(BlockAddr{v.id(), kVolumeDataVersion, synced.file_id(), 3})->has_value());

  // close: on both replicas now; the first contents become garbage.
  const auto closed = Op(Commit(synced, "n1", 100, {"n1", "n2"})).inode();
  EXPECT_EQ(closed.state(), rpc::VolumeInode::REPLICATED);
  EXPECT_EQ(closed.size(), 100u);
  EXPECT_EQ(closed.generation(), 2u);
  EXPECT_EQ(closed.writer(), "");
  EXPECT_EQ(closed.holders_size(), 2);
  int garbage = 0;
  ASSERT_TRUE(store_
                  ->ScanVolumeKeys("d/", "",
                                   [&](const std::string& k, const std::string&) {
                                     garbage += k.size() == 2 + 4 + 1 + 8 && k[6] == 'g';
                                     return true;
                                   })
                  .ok());
  EXPECT_EQ(garbage, 0);  // never uploaded: nothing in the origin to delete

  auto st = volumes_->Status("ckpt");
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->files_size(), 1);
  EXPECT_EQ(st->files(0).name(), "s.pt");
  EXPECT_EQ(st->bytes_unpersisted(), 100u);

  // An upload of an older contents id does not mark the new one persisted.
  rpc::VolumeOpRequest up;
  up.mutable_persisted()->set_ino(f.ino());
  up.mutable_persisted()->set_file_id(synced.file_id());
  EXPECT_EQ(Op(up).inode().state(), rpc::VolumeInode::REPLICATED);
  up.mutable_persisted()->set_file_id(closed.file_id());
  up.mutable_persisted()->set_path("old/s.pt");
  EXPECT_EQ(Op(up).inode().state(), rpc::VolumeInode::PERSISTED);
  // A rename carried to the origin records the new path.
  up.mutable_persisted()->set_path("s.pt");
  EXPECT_EQ(Op(up).inode().persisted_path(), "s.pt");
  EXPECT_EQ(volumes_->Status("ckpt")->bytes_unpersisted(), 0u);
}

TEST_F(VolumesTest, OneNodeAtATimeCopiesContentsFromTheOriginForRestores) {
  AddVolume("ckpt", 1);
  const auto f = Op(Create(kVolumeRootIno, "s.pt", "n1")).inode();
  const auto committed = Op(Commit(f, "n1", 3 << 20, {"n1"})).inode();
  auto copying = [&](const std::string& node, uint64_t file_id,
                     std::vector<std::string> unreachable = {}) {
    rpc::VolumeOpRequest r;
    r.mutable_copying()->set_ino(f.ino());
    r.mutable_copying()->set_file_id(file_id);
    r.mutable_copying()->set_node(node);
    for (auto& u : unreachable) r.mutable_copying()->add_unreachable(u);
    const auto n = Op(r).inode();
    return std::vector<std::string>(n.copiers().begin(), n.copiers().end());
  };
  using V = std::vector<std::string>;
  // The first asking reads the origin; the next ones copy from it.
  EXPECT_EQ(copying("n2", committed.file_id()), V{"n2"});
  EXPECT_EQ(copying("n3", committed.file_id()), V{"n2"});
  // Kept across a restart of meta.
  Reload();
  EXPECT_EQ(copying("n4", committed.file_id()), V{"n2"});
  // A copier another node could not copy from is replaced by that node; its own second ask
  // (its copy failed) makes it read the origin again.
  EXPECT_EQ(copying("n3", committed.file_id(), {"n2"}), V{"n3"});
  EXPECT_EQ(copying("n3", committed.file_id()), V{"n3"});
  EXPECT_EQ(copying("n2", committed.file_id()), V{"n3"});
  // An ask about contents the file no longer has changes nothing (the reply shows the change).
  EXPECT_EQ(copying("n5", committed.file_id() + 7), V{"n3"});
  // A commit's new contents have no copier yet.
  rpc::VolumeOpRequest reopen;
  reopen.mutable_open_write()->set_ino(f.ino());
  reopen.mutable_open_write()->set_node("n1");
  const auto next = Op(Commit(Op(reopen).inode(), "n1", 10, {"n1"})).inode();
  EXPECT_EQ(next.copiers_size(), 0);
  EXPECT_EQ(copying("n3", next.file_id()), V{"n3"});
}

TEST_F(VolumesTest, OriginCopiesOfRemovedOrReplacedContentsAreListedUntilDeletedThere) {
  AddVolume("ckpt", 1);
  auto persist = [&](const rpc::VolumeInode& n, const std::string& path, const std::string& copy) {
    rpc::VolumeOpRequest up;
    up.mutable_persisted()->set_ino(n.ino());
    up.mutable_persisted()->set_file_id(n.file_id());
    up.mutable_persisted()->set_path(path);
    up.mutable_persisted()->set_origin_copy(copy);
    up.mutable_persisted()->set_size(n.size());
    up.mutable_persisted()->set_node("n2");
    int err = 0;
    return Op(up, &err).inode();
  };
  auto discarded = [&] {
    std::map<std::string, rpc::VolumeInode> out;
    const absl::StatusOr<rpc::VolumeStatusResponse> st = volumes_->Status("ckpt");
    EXPECT_TRUE(st.ok()) << st.status();
    if (st.ok()) {
      for (const auto& g : st->discarded()) out[g.persisted_path()] = g;
    }
    return out;
  };
  auto save = [&](const std::string& name, uint64_t size) {
    const auto f = Op(Create(kVolumeRootIno, name, "n1")).inode();
    return Op(Commit(f, "n1", size, {"n1"})).inode();
  };
  const auto a = save("a.pt", 10), b = save("b.pt", 20), c = save("c.pt", 30);
  EXPECT_EQ(persist(a, "a.pt", "101:7").origin_copy(), "101:7");
  persist(b, "b.pt", "102:7");
  persist(c, "c.pt", "103:7");
  const auto never = save("never.pt", 5);  // not uploaded: nothing to delete when removed
  EXPECT_TRUE(discarded().empty());

  Op(Remove(kVolumeRootIno, "a.pt", false));
  Op(Remove(kVolumeRootIno, "never.pt", false));
  Op(Rename(kVolumeRootIno, "c.pt", kVolumeRootIno, "b.pt"));  // b's contents replaced
  auto open = Op([&] {
                rpc::VolumeOpRequest r;
                r.mutable_open_write()->set_ino(c.ino());
                r.mutable_open_write()->set_node("n1");
                return r;
              }())
                  .inode();
  const auto c2 = Op(Commit(open, "n1", 40, {"n1"})).inode();  // c's contents replaced
  auto d = discarded();
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d["a.pt"].file_id(), a.file_id());
  EXPECT_EQ(d["a.pt"].size(), 10u);
  EXPECT_EQ(d["a.pt"].origin_copy(), "101:7");
  EXPECT_EQ(d["b.pt"].file_id(), b.file_id());
  EXPECT_EQ(d["c.pt"].origin_copy(), "103:7");
  EXPECT_EQ(c2.persisted_path(), "");

  // An upload that ends after its file was removed, or after it was replaced: what it put in
  // the origin is listed too, the file's record is not touched.
  EXPECT_EQ(persist(never, "never.pt", "104:7").ino(), 0u);
  rpc::VolumeInode stale = c2;
  stale.set_file_id(c.file_id());
  EXPECT_EQ(persist(stale, "b.pt.old", "105:7").state(), rpc::VolumeInode::REPLICATED);
  d = discarded();
  EXPECT_EQ(d.size(), 4u);
  EXPECT_EQ(d["never.pt"].origin_copy(), "104:7");
  EXPECT_EQ(d["never.pt"].holders_size(), 1);  // the node that uploaded it deletes it
  if (d["never.pt"].holders_size() == 1) EXPECT_EQ(d["never.pt"].holders(0), "n2");
  EXPECT_EQ(d["b.pt.old"].file_id(), c.file_id());  // the copy moved: one record per contents
  EXPECT_EQ(d.count("c.pt"), 0u);

  // A late upload of older contents to where the file's own copy is: the file is uploaded
  // again (its copy may be gone under the late one).
  const auto e1 = save("e.pt", 10);
  rpc::VolumeOpRequest reopen;
  reopen.mutable_open_write()->set_ino(e1.ino());
  reopen.mutable_open_write()->set_node("n1");
  const auto e2 = Op(Commit(Op(reopen).inode(), "n1", 11, {"n1"})).inode();
  EXPECT_EQ(persist(e2, "e.pt", "e2").state(), rpc::VolumeInode::PERSISTED);
  rpc::VolumeInode late = e2;
  late.set_file_id(e1.file_id());
  const auto demoted = persist(late, "e.pt", "e1");
  EXPECT_EQ(demoted.state(), rpc::VolumeInode::REPLICATED);
  EXPECT_EQ(demoted.persisted_path(), "");
  EXPECT_EQ(demoted.file_id(), e2.file_id());
  EXPECT_EQ(discarded()["e.pt"].origin_copy(), "e1");
  rpc::VolumeOpRequest forget;
  forget.mutable_origin_deleted()->set_file_id(e1.file_id());
  Op(forget);

  // An empty file (no contents id) is uploaded too, and its removal is carried.
  const auto empty = save("empty.flag", 0);
  EXPECT_EQ(empty.file_id(), 0u);
  EXPECT_EQ(persist(empty, "empty.flag", "z").state(), rpc::VolumeInode::PERSISTED);
  Op(Remove(kVolumeRootIno, "empty.flag", false));
  EXPECT_EQ(discarded()["empty.flag"].origin_copy(), "z");
  forget.mutable_origin_deleted()->set_file_id(discarded()["empty.flag"].file_id());
  Op(forget);
  EXPECT_EQ(discarded().count("empty.flag"), 0u);

  // Deleted there: forgotten, also across a restart.
  rpc::VolumeOpRequest del;
  del.mutable_origin_deleted()->set_file_id(a.file_id());
  Op(del);
  Reload();
  d = discarded();
  EXPECT_EQ(d.size(), 3u);
  EXPECT_EQ(d.count("a.pt"), 0u);
}

TEST_F(VolumesTest, ARenameOfADirectoryMovesItsWholeTreeAtOnce) {
  AddVolume("ckpt", 1);
  const auto run = Op(Mkdir(kVolumeRootIno, "run7")).inode();
  const auto tmp = Op(Mkdir(run.ino(), "step_1000.tmp")).inode();
  const auto shard = Op(Create(tmp.ino(), "rank3.pt", "n1")).inode();
  Op(Commit(shard, "n1", 10, {"n1"}));

  EXPECT_EQ(Errno(Rename(run.ino(), "step_1000.tmp", tmp.ino(), "x")), EINVAL);  // into itself
  EXPECT_EQ(Errno(Rename(kVolumeRootIno, "run7", tmp.ino(), "x")), EINVAL);      // below itself
  EXPECT_EQ(Errno(Rename(run.ino(), "nothing", run.ino(), "x")), ENOENT);

  Op(Rename(run.ino(), "step_1000.tmp", run.ino(), "step_1000"));
  EXPECT_EQ(Errno(Lookup(run.ino(), "step_1000.tmp")), ENOENT);
  const auto moved = Op(Lookup(run.ino(), "step_1000")).inode();
  EXPECT_EQ(moved.ino(), tmp.ino());
  EXPECT_EQ(Op(Lookup(moved.ino(), "rank3.pt")).inode().size(), 10u);

  // The next save replaces the last: rename over an empty directory, not over a full one.
  const auto next = Op(Mkdir(run.ino(), "step_2000.tmp")).inode();
  Op(Create(next.ino(), "rank3.pt", "n1"));
  EXPECT_EQ(Errno(Rename(run.ino(), "step_2000.tmp", run.ino(), "step_1000")), ENOTEMPTY);
  EXPECT_EQ(Errno(Rename(run.ino(), "step_2000.tmp", run.ino(), "step_1000", true)), EEXIST);
  Op(Mkdir(run.ino(), "empty"));
  Op(Rename(run.ino(), "step_2000.tmp", run.ino(), "empty"));
  EXPECT_EQ(Names(run.ino()), (std::vector<std::string>{"empty", "step_1000"}));
  EXPECT_EQ(Op(Lookup(kVolumeRootIno, "run7")).inode().children(), 2u);

  // Files: over a file replaces it (its contents become garbage), not over a directory.
  EXPECT_EQ(Errno(Rename(moved.ino(), "rank3.pt", run.ino(), "empty")), EISDIR);
  EXPECT_EQ(Errno(Rename(run.ino(), "empty", moved.ino(), "rank3.pt")), ENOTDIR);
  Op(Rename(next.ino(), "rank3.pt", moved.ino(), "rank3.pt"));
  const auto replaced = Op(Lookup(moved.ino(), "rank3.pt")).inode();
  EXPECT_NE(replaced.ino(), shard.ino());
  rpc::VolumeOpRequest get;
  get.mutable_getattr()->set_ino(shard.ino());
  EXPECT_EQ(Errno(get), ENOENT);
  EXPECT_EQ(Op(Lookup(run.ino(), "empty")).inode().children(), 0u);
  EXPECT_EQ(Op(Lookup(run.ino(), "step_1000")).inode().children(), 1u);

  // Across directories, and seen the same after a restart.
  Op(Mkdir(kVolumeRootIno, "archive"));
  const auto archive = Op(Lookup(kVolumeRootIno, "archive")).inode();
  Op(Rename(run.ino(), "step_1000", archive.ino(), "run7-step_1000"));
  Reload();
  EXPECT_EQ(Names(run.ino()), (std::vector<std::string>{"empty"}));
  const auto there = Op(Lookup(archive.ino(), "run7-step_1000")).inode();
  EXPECT_EQ(there.parent(), archive.ino());
  EXPECT_EQ(Op(Lookup(there.ino(), "rank3.pt")).inode().ino(), replaced.ino());
  auto st = volumes_->Status("ckpt");
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->files_size(), 1);
  EXPECT_EQ(st->files(0).name(), "archive/run7-step_1000/rank3.pt");
}

TEST_F(VolumesTest, RemovingAVolumeDropsItsTreeAndChecksums) {
  const rpc::Volume v = AddVolume("ckpt", 1);
  const auto f = Op(Create(kVolumeRootIno, "a", "n1")).inode();
  Op(Commit(f, "n1", 10, {"n1"}));
  ASSERT_TRUE(store_->GetChecksum(BlockAddr{v.id(), kVolumeDataVersion, f.writing_file_id(), 0})
                  ->has_value());
  ASSERT_TRUE(volumes_->Remove("ckpt").ok());
  EXPECT_EQ(volumes_->Remove("ckpt").code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(store_->GetChecksum(BlockAddr{v.id(), kVolumeDataVersion, f.writing_file_id(), 0})
                   ->has_value());
  int keys = 0;
  ASSERT_TRUE(store_
                  ->ScanVolumeKeys("", "",
                                   [&](const std::string&, const std::string&) {
                                     ++keys;
                                     return true;
                                   })
                  .ok());
  EXPECT_EQ(keys, 0);
  Reload();
  EXPECT_TRUE(volumes_->List().empty());
}

TEST_F(VolumesTest, AFullDiskRefusesAChangeAndKeepsTheTreeAsItWas) {
  AddVolume("ckpt", 1);
  Op(Mkdir(kVolumeRootIno, "kept"));
  Open(/*full=*/true);
  Reload();
  rpc::VolumeOpRequest r = Mkdir(kVolumeRootIno, "new");
  r.set_volume("ckpt");
  EXPECT_EQ(volumes_->Apply(r).status().code(), absl::StatusCode::kResourceExhausted);
  Open();
  Reload();
  EXPECT_EQ(Names(kVolumeRootIno), (std::vector<std::string>{"kept"}));
  Op(Mkdir(kVolumeRootIno, "new"));  // the counter did not move past a write that failed
}

}  // namespace
}  // namespace ember::meta
