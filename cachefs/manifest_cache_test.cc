#include "cachefs/manifest_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cachefs/cache/index_record.h"
#include "tests/testing/testing.h"

namespace ember::cachefs {
namespace {

rpc::FileEntry Entry(uint64_t id, uint64_t parent, const std::string& name,
                     rpc::FileEntry::Type type, uint64_t size = 0) {
  rpc::FileEntry e;
  e.set_file_id(id);
  e.set_parent_id(parent);
  e.set_name(name);
  e.set_type(type);
  e.set_size(size);
  e.set_mode(0644);
  e.set_mtime_ns(123456789);
  return e;
}

DatasetView SampleView() {
  DatasetView v;
  v.name = "imgs";
  v.dataset_id = 3;
  v.version = 2;
  v.origin = "/data/imgs";
  v.block_size = 4 << 20;
  EXPECT_TRUE(v.Append(Entry(1, 0, "", rpc::FileEntry::DIR)));
  EXPECT_TRUE(v.Append(Entry(2, 1, "a.jpg", rpc::FileEntry::FILE, 1000)));
  EXPECT_TRUE(v.Append(Entry(3, 1, "sub", rpc::FileEntry::DIR)));
  EXPECT_TRUE(v.Append(Entry(4, 3, "b.jpg", rpc::FileEntry::FILE, 9 << 20)));
  v.Finish();
  return v;
}

TEST(ManifestCacheTest, AppendRefusesEntriesOutOfShape) {
  DatasetView v = SampleView();
  EXPECT_FALSE(v.Append(Entry(6, 1, "skip", rpc::FileEntry::FILE)));  // not the next id
  EXPECT_FALSE(v.Append(Entry(5, 2, "under-a-file", rpc::FileEntry::FILE)));
  EXPECT_FALSE(v.Append(Entry(5, 9, "later-parent", rpc::FileEntry::FILE)));
  EXPECT_FALSE(v.Append(Entry(5, 1, "..", rpc::FileEntry::FILE)));
  EXPECT_FALSE(v.Append(Entry(5, 1, "a/b", rpc::FileEntry::FILE)));
  EXPECT_FALSE(v.Append(Entry(5, 1, "", rpc::FileEntry::FILE)));
  EXPECT_FALSE(v.Append(Entry(5, 0, "second-root", rpc::FileEntry::DIR)));
  EXPECT_EQ(v.size(), 4u);
  EXPECT_TRUE(v.Append(Entry(5, 3, "c.jpg", rpc::FileEntry::FILE)));
  EXPECT_EQ(v.PathOf(5), "sub/c.jpg");
  v.Finish();
  auto sub = v.Get(3);
  ASSERT_TRUE(sub.has_value());
  EXPECT_EQ(std::vector<uint32_t>(sub->children.begin(), sub->children.end()),
            (std::vector<uint32_t>{4, 5}));
  auto root = v.Get(1);
  EXPECT_EQ(std::vector<uint32_t>(root->children.begin(), root->children.end()),
            (std::vector<uint32_t>{2, 3}));
  EXPECT_TRUE(v.Get(2)->children.empty());
  EXPECT_FALSE(v.Get(6).has_value());
}

TEST(ManifestCacheTest, RoundTripAndDamageIsDetected) {
  DatasetView v = SampleView();
  std::string bytes = EncodeManifest(v);
  auto back = DecodeManifest(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(EncodeManifest(**back), bytes);
  EXPECT_EQ((*back)->PathOf(4), "sub/b.jpg");
  EXPECT_EQ((*back)->origin, "/data/imgs");
  for (size_t i = 0; i < bytes.size(); i += 7) {
    std::string bad = bytes;
    bad[i] ^= 0x20;
    EXPECT_EQ(DecodeManifest(bad).status().code(), absl::StatusCode::kDataLoss) << i;
  }
  EXPECT_FALSE(DecodeManifest(bytes.substr(0, bytes.size() - 1)).ok());
  EXPECT_FALSE(DecodeManifest("").ok());

  std::vector<rpc::Dataset> list(2);
  list[0].set_name("a");
  list[1].set_name("b");
  auto l = DecodeDatasetList(EncodeDatasetList(list));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 2u);
  EXPECT_EQ((*l)[1].name(), "b");
  EXPECT_FALSE(DecodeDatasetList(EncodeManifest(v)).ok());  // the other kind of file
}

TEST(ManifestCacheTest, SavedCopiesLoadAndDamagedOnesAreDropped) {
  testing::TempDir dir;
  ManifestCache cache(dir.Sub("manifests"));
  EXPECT_EQ(cache.LoadManifest(3, 2).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(cache.SaveManifest(SampleView()).ok());
  auto v = cache.LoadManifest(3, 2);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)->size(), 4u);
  // A copy stored under another version's name is refused.
  std::filesystem::copy_file(dir.Sub("manifests/3-2.manifest"), dir.Sub("manifests/3-9.manifest"));
  EXPECT_EQ(cache.LoadManifest(3, 9).status().code(), absl::StatusCode::kDataLoss);
  // Damage: refused once, then gone.
  {
    std::fstream f(dir.Sub("manifests/3-2.manifest"),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  EXPECT_EQ(cache.LoadManifest(3, 2).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(cache.LoadManifest(3, 2).status().code(), absl::StatusCode::kNotFound);
  std::vector<rpc::Dataset> list(1);
  list[0].set_name("imgs");
  ASSERT_TRUE(cache.SaveDatasets(list).ok());
  auto l = cache.LoadDatasets();
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->at(0).name(), "imgs");
}

TEST(IndexRecordTest, RoundTripAndBadRecordsAreRefused) {
  IndexRecord r{BlockAddr{1, 2, 3, 4}, 0xabcdef, 4ull * (4 << 20), 4 << 20, 1700000000000};
  std::string k = EncodeIndexKey(r.addr), v = EncodeIndexValue(r);
  ASSERT_EQ(k.size(), 24u);
  ASSERT_EQ(v.size(), 32u);
  auto d = DecodeIndexRecord(k, v);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->addr, r.addr);
  EXPECT_EQ(d->checksum, r.checksum);
  EXPECT_EQ(d->offset, r.offset);
  EXPECT_EQ(d->length, r.length);
  EXPECT_EQ(d->pinned_until_ms, r.pinned_until_ms);
  EXPECT_EQ(d->segment, 0u);
  EXPECT_TRUE(DecodeIndexRecord(k, v.substr(0, 20)).has_value());  // older records
  EXPECT_TRUE(DecodeIndexRecord(k, v.substr(0, 28)).has_value());
  EXPECT_FALSE(DecodeIndexRecord(k, v.substr(0, 27)).has_value());
  EXPECT_FALSE(DecodeIndexRecord(k.substr(1), v).has_value());
  auto bad = [&](IndexRecord x) {
    return DecodeIndexRecord(EncodeIndexKey(x.addr), EncodeIndexValue(x));
  };
  IndexRecord x = r;
  x.length = 0;
  EXPECT_FALSE(bad(x));
  x = r;
  x.length = (64 << 20) + 1;
  EXPECT_FALSE(bad(x));
  x = r;
  x.offset = ~0ull - 10;  // would overflow offset + length
  EXPECT_FALSE(bad(x));
  x = r;
  x.offset = 0;  // block 4 cannot sit at 0
  EXPECT_FALSE(bad(x));
  x = r;
  x.addr.file_id = 0;
  EXPECT_FALSE(bad(x));
  // A small file's block in a segment: anywhere in it, but only as its file's one block.
  IndexRecord s{BlockAddr{1, 2, 3, 0}, 0x1234, 12345, 2500, 0, 7};
  auto ds = DecodeIndexRecord(EncodeIndexKey(s.addr), EncodeIndexValue(s));
  ASSERT_TRUE(ds.has_value());
  EXPECT_EQ(ds->segment, 7u);
  EXPECT_EQ(ds->offset, 12345u);
  s.addr.index = 1;
  EXPECT_FALSE(bad(s));
}

}  // namespace
}  // namespace ember::cachefs
