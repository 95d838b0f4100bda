#include "meta/store.h"

#include <gtest/gtest.h>

#include <tuple>

#include "tests/testing/testing.h"

namespace ember::meta {
namespace {

using ember::testing::TempDir;

rpc::FileEntry Entry(uint64_t id, const std::string& name) {
  rpc::FileEntry e;
  e.set_file_id(id);
  e.set_parent_id(id == 1 ? 0 : 1);
  e.set_name(name);
  e.set_type(rpc::FileEntry::FILE);
  e.set_size(id * 10);
  return e;
}

rpc::Dataset MakeDataset(uint32_t id, const std::string& name, std::vector<uint32_t> versions) {
  rpc::Dataset ds;
  ds.set_name(name);
  ds.set_id(id);
  ds.set_origin("/data/" + name);
  ds.set_block_size(4 << 20);
  for (uint32_t v : versions) ds.add_versions()->set_version(v);
  ds.set_latest_version(versions.back());
  return ds;
}

TEST(MetaStoreTest, RoundTripsAcrossReopen) {
  TempDir d;
  {
    auto store = MetaStore::Open(d.Sub("db"));
    ASSERT_TRUE(store.ok()) << store.status();
    auto& s = **store;
    EXPECT_EQ(*s.AllocateDatasetId(), 1u);
    EXPECT_EQ(*s.AllocateDatasetId(), 2u);
    ASSERT_TRUE(s.PutDataset(MakeDataset(1, "imgs", {1})).ok());
    MetaStore::ManifestWriter w(&s, 1, 1);
    for (uint64_t i = 1; i <= 10'000; i++)
      ASSERT_TRUE(w.Add(Entry(i, "f" + std::to_string(i))).ok());
    ASSERT_TRUE(w.Finish().ok());
    ASSERT_TRUE(s.PutChecksums({{BlockAddr{1, 1, 5, 0}, 0xabcdef}}).ok());
    rpc::Node n;
    n.set_id("n1");
    n.set_address("127.0.0.2:7000");
    (*n.mutable_labels())["rack"] = "r1";
    ASSERT_TRUE(s.PutNode(n).ok());
    ASSERT_TRUE(s.PutLocations({{{1, 1, 5}, "n1", std::string("\x05", 1)}}).ok());
  }
  auto store = MetaStore::Open(d.Sub("db"));
  ASSERT_TRUE(store.ok()) << store.status();
  auto& s = **store;
  EXPECT_EQ(*s.AllocateDatasetId(), 3u);  // never reused
  auto ds = s.GetDataset("imgs");
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->origin(), "/data/imgs");
  EXPECT_EQ(s.GetDataset("nope").status().code(), absl::StatusCode::kNotFound);
  auto page = s.ReadManifest(1, 1, 0, 100);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 100u);
  EXPECT_EQ(page->front().file_id(), 1u);
  page = s.ReadManifest(1, 1, 9'990, 100);
  ASSERT_EQ(page->size(), 10u);
  EXPECT_EQ(page->back().name(), "f10000");
  EXPECT_EQ(**s.GetChecksum(BlockAddr{1, 1, 5, 0}), 0xabcdefu);
  EXPECT_FALSE(s.GetChecksum(BlockAddr{1, 1, 5, 1})->has_value());
  auto nodes = s.ListNodes();
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ(nodes->front().labels().at("rack"), "r1");
  int locs = 0;
  ASSERT_TRUE(s.ForEachLocation([&](const MetaStore::FileKey& k, const std::string& node,
                                    const std::string& bitmap) {
                 locs++;
                 EXPECT_EQ(k.file_id, 5u);
                 EXPECT_EQ(node, "n1");
                 EXPECT_EQ(bitmap, std::string("\x05", 1));
               }).ok());
  EXPECT_EQ(locs, 1);
}

// A checksum or location given twice in one batch keeps its last value, whatever order the
// batch's keys came in (a batch sorted by key would have to keep it so).
TEST(MetaStoreTest, ABatchKeepsTheLastValueOfAKeyGivenTwice) {
  TempDir d;
  {
    auto store = MetaStore::Open(d.Sub("db"));
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<std::pair<BlockAddr, uint64_t>> sums;
    std::vector<MetaStore::LocationWrite> locs;
    for (int round = 0; round < 2; round++) {
      for (uint64_t i = 0; i < 300; i++) {
        const uint64_t file = 1 + (i * 7919) % 300;  // shuffled
        sums.push_back({BlockAddr{1, 1, file, 0}, round == 0 ? file + 1000 : file});
        locs.push_back({{1, 1, file}, "n1", std::string(1, round == 0 ? '\x01' : '\x03')});
      }
    }
    ASSERT_TRUE((*store)->PutChecksums(sums).ok());
    ASSERT_TRUE((*store)->PutLocations(locs).ok());
  }
  auto store = MetaStore::Open(d.Sub("db"));  // read from the store, not its recent checksums
  ASSERT_TRUE(store.ok()) << store.status();
  for (uint64_t file = 1; file <= 300; file++) {
    EXPECT_EQ(**(*store)->GetChecksum(BlockAddr{1, 1, file, 0}), file);
  }
  int seen = 0;
  ASSERT_TRUE((*store)
                  ->ForEachLocation([&](const MetaStore::FileKey& k, const std::string& node,
                                        const std::string& bitmap) {
                    seen++;
                    EXPECT_EQ(bitmap, std::string(1, '\x03')) << "file " << k.file_id;
                  })
                  .ok());
  EXPECT_EQ(seen, 300);
}

TEST(MetaStoreTest, DeleteDatasetRemovesEverything) {
  TempDir d;
  auto store = MetaStore::Open(d.Sub("db"));
  auto& s = **store;
  for (uint32_t id : {1u, 2u}) {
    ASSERT_TRUE(s.PutDataset(MakeDataset(id, "ds" + std::to_string(id), {1})).ok());
    MetaStore::ManifestWriter w(&s, id, 1);
    ASSERT_TRUE(w.Add(Entry(1, "")).ok());
    ASSERT_TRUE(w.Finish().ok());
    ASSERT_TRUE(s.PutChecksums({{BlockAddr{id, 1, 1, 0}, 7}}).ok());
  }
  ASSERT_TRUE(s.DeleteDataset(MakeDataset(1, "ds1", {1})).ok());
  EXPECT_FALSE(s.GetDataset("ds1").ok());
  EXPECT_TRUE(s.ReadManifest(1, 1, 0, 10)->empty());
  EXPECT_FALSE(s.GetChecksum(BlockAddr{1, 1, 1, 0})->has_value());
  // The other dataset is untouched.
  EXPECT_EQ(s.ReadManifest(2, 1, 0, 10)->size(), 1u);
  EXPECT_TRUE(s.GetChecksum(BlockAddr{2, 1, 1, 0})->has_value());
  // A version's data goes the same way (checksums just recorded are kept in memory too).
  ASSERT_TRUE(s.DeleteVersionData(2, 1).ok());
  EXPECT_FALSE(s.GetChecksum(BlockAddr{2, 1, 1, 0})->has_value());
}

TEST(MetaStoreTest, OrphanManifestsDroppedOnOpen) {
  TempDir d;
  {
    auto store = MetaStore::Open(d.Sub("db"));
    auto& s = **store;
    ASSERT_TRUE(s.PutDataset(MakeDataset(1, "kept", {1})).ok());
    for (auto [ds, ver] : {std::pair{1u, 1u}, {1u, 2u}, {9u, 1u}}) {
      MetaStore::ManifestWriter w(&s, ds, ver);
      ASSERT_TRUE(w.Add(Entry(1, "")).ok());
      ASSERT_TRUE(w.Finish().ok());
    }
  }
  auto store = MetaStore::Open(d.Sub("db"));
  auto& s = **store;
  EXPECT_EQ(s.ReadManifest(1, 1, 0, 10)->size(), 1u);  // a listed version stays
  EXPECT_TRUE(s.ReadManifest(1, 2, 0, 10)->empty());   // a scan that never finished goes
  EXPECT_TRUE(s.ReadManifest(9, 1, 0, 10)->empty());
}

// A leader's store ships each commit, numbered, before writing it; a standby's store applies
// only batches that follow on from its position, and holds what the leader wrote.
TEST(MetaStoreTest, ReplicatedBatchesFollowOnOrAreRefused) {
  TempDir d;
  auto leader = MetaStore::Open(d.Sub("leader"));
  auto standby = MetaStore::Open(d.Sub("standby"));
  ASSERT_TRUE(leader.ok() && standby.ok());
  struct ToStandby : MetaStore::Shipper {
    MetaStore* standby;
    bool refuse = false;
    std::vector<std::tuple<MetaStore::Position, MetaStore::Position, std::string>> shipped;
    absl::Status Ship(const MetaStore::Position& prev, const MetaStore::Position& at,
                      const std::string& batch, bool sync) override {
      if (refuse) return absl::UnavailableError("standby gone");
      shipped.emplace_back(prev, at, batch);
      return standby->ApplyReplicated(prev, at, batch, sync);
    }
    void Broken(const std::string&) override { broken = true; }
    bool broken = false;
  } ship;
  ship.standby = standby->get();
  ASSERT_TRUE((*leader)->Lead(3, &ship).ok());
  ASSERT_TRUE((*leader)->PutDataset(MakeDataset(1, "a", {1})).ok());
  ASSERT_TRUE((*leader)->PutChecksums({{BlockAddr{1, 1, 1, 0}, 42}}).ok());
  EXPECT_EQ((*leader)->position(), (MetaStore::Position{3, 2}));
  EXPECT_EQ((*standby)->position(), (MetaStore::Position{3, 2}));
  EXPECT_EQ((*standby)->GetDataset("a")->id(), 1u);
  EXPECT_EQ(**(*standby)->GetChecksum(BlockAddr{1, 1, 1, 0}), 42u);
  // A batch again, or one that skips ahead, is refused and changes nothing.
  auto [prev, at, batch] = ship.shipped[1];
  EXPECT_TRUE(absl::IsFailedPrecondition((*standby)->ApplyReplicated(prev, at, batch, false)));
  EXPECT_TRUE(
      absl::IsFailedPrecondition((*standby)->ApplyReplicated({3, 3}, {3, 4}, batch, false)));
  EXPECT_EQ((*standby)->position(), (MetaStore::Position{3, 2}));
  // A write the standbys did not take is not written here either.
  ship.refuse = true;
  EXPECT_FALSE((*leader)->PutDataset(MakeDataset(2, "b", {1})).ok());
  EXPECT_TRUE(absl::IsNotFound((*leader)->GetDataset("b").status()));
  EXPECT_EQ((*leader)->position(), (MetaStore::Position{3, 2}));
  // The position survives a restart (it is written with each batch).
  standby->reset();
  auto reopened = MetaStore::Open(d.Sub("standby"));
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->position(), (MetaStore::Position{3, 2}));
  // A term that is not after the store's is refused.
  EXPECT_TRUE(absl::IsFailedPrecondition((*leader)->Lead(3, &ship)));
  // A leader takes no batches.
  EXPECT_TRUE(absl::IsFailedPrecondition((*leader)->ApplyReplicated({3, 2}, {3, 3}, batch, false)));
}

}  // namespace
}  // namespace ember::meta
