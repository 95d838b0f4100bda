#include "meta/catalog.h"

#include <gtest/gtest.h>

#include "meta/store_fixture_test.h"

namespace ember::meta {
namespace {

using CatalogTest = StoreFixture;

rpc::BlockAddr Addr(uint32_t ds, uint32_t v, uint64_t file, uint64_t index) {
  rpc::BlockAddr b;
  b.set_dataset_id(ds);
  b.set_version(v);
  b.set_file_id(file);
  b.set_index(index);
  return b;
}

TEST_F(CatalogTest, AddScansTheOriginAndKnowsEachVersionsGeometry) {
  DatasetCatalog catalog(store_.get());
  ASSERT_TRUE(catalog.Load().ok());
  const rpc::Dataset ds = AddDataset(&catalog, "imgs");
  ASSERT_EQ(ds.latest_version(), 1u);
  EXPECT_EQ(ds.versions(0).files(), 3u);
  EXPECT_EQ(ds.versions(0).bytes(), 10u + (3u << 20) + 1);
  EXPECT_EQ(catalog.List().size(), 1u);
  EXPECT_EQ(catalog.Get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog.ResolveVersion("imgs", 2).status().code(), absl::StatusCode::kNotFound);

  // Sizes by file id: root 1, a 2, b 3, b/c 4, b/d 5.
  auto sizes = catalog.Sizes(ds.id(), 1);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  ASSERT_EQ((*sizes)->size(), 6u);
  EXPECT_EQ((**sizes)[2], 10u);
  EXPECT_EQ((**sizes)[4], (3u << 20) + 1);
  EXPECT_EQ((**sizes)[3], 0u);  // a directory

  // Bounds: 5 file ids, ceil(bytes / 1 MiB) = 4 blocks.
  EXPECT_TRUE(catalog.CheckBlock(Addr(ds.id(), 1, 4, 3)).ok());
  EXPECT_EQ(catalog.CheckBlock(Addr(ds.id(), 1, 4, 4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog.CheckBlock(Addr(ds.id(), 1, 6, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog.CheckBlock(Addr(ds.id(), 1, 0, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog.CheckBlock(Addr(ds.id(), 2, 1, 0)).code(), absl::StatusCode::kNotFound);

  // Paths select files; unknown and escaping paths are refused.
  auto all = catalog.SelectPaths(ds, 1, {});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->files, 3u);
  auto sub = catalog.SelectPaths(ds, 1, {"/b/"});
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(sub->files, 2u);
  EXPECT_EQ(sub->bytes, (3u << 20) + 1);
  EXPECT_EQ(catalog.SelectPaths(ds, 1, {"zz"}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog.SelectPaths(ds, 1, {"b/../a"}).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Manifest pages.
  rpc::ListManifestRequest req;
  req.set_name("imgs");
  req.set_max_entries(2);
  rpc::ListManifestResponse page;
  ASSERT_TRUE(catalog.ListManifest(req, &page).ok());
  ASSERT_EQ(page.entries_size(), 2);
  EXPECT_EQ(page.next_after_file_id(), 2u);

  // Another catalog on the reopened store sees the same.
  Open();
  DatasetCatalog again(store_.get());
  ASSERT_TRUE(again.Load().ok());
  auto got = again.Get("imgs");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->id(), ds.id());
  EXPECT_TRUE(again.CheckBlock(Addr(ds.id(), 1, 4, 3)).ok());
}

TEST_F(CatalogTest, RefreshMakesAVersionOnlyWhenSomethingChanged) {
  DatasetCatalog catalog(store_.get());
  const rpc::Dataset ds = AddDataset(&catalog, "imgs");
  auto same = catalog.Refresh("imgs", [](const rpc::DatasetProgress&) {});
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->changed());
  EXPECT_EQ(same->dataset().latest_version(), 1u);
  ember::testing::WriteFile(dir_.Sub("imgs/e"), "new");
  auto changed = catalog.Refresh("imgs", [](const rpc::DatasetProgress&) {});
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(changed->changed());
  EXPECT_EQ(changed->added(), 1u);
  EXPECT_EQ(catalog.Get("imgs")->latest_version(), 2u);

  // The latest version cannot be removed alone; an older one can, then the whole dataset.
  rpc::RemoveDatasetRequest rm;
  rm.set_name("imgs");
  rm.set_version(2);
  EXPECT_EQ(catalog.Remove(rm).status().code(), absl::StatusCode::kFailedPrecondition);
  rm.set_version(1);
  ASSERT_TRUE(catalog.Remove(rm).ok());
  EXPECT_EQ(catalog.ResolveVersion("imgs", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog.CheckBlock(Addr(ds.id(), 1, 2, 0)).code(), absl::StatusCode::kNotFound);
  rm.set_version(0);
  auto id = catalog.Remove(rm);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, ds.id());
  EXPECT_TRUE(catalog.List().empty());
}

TEST_F(CatalogTest, AStoreThatRefusesWritesChangesNothing) {
  {
    DatasetCatalog catalog(store_.get());
    AddDataset(&catalog, "kept");
  }
  Open(/*full=*/true);
  DatasetCatalog catalog(store_.get());
  ASSERT_TRUE(catalog.Load().ok());  // reading needs no room
  rpc::AddDatasetRequest req;
  req.set_name("more");
  req.set_origin(MakeOrigin("more"));
  auto added = catalog.Add(req, [](const rpc::DatasetProgress&) {});
  EXPECT_EQ(added.status().code(), absl::StatusCode::kResourceExhausted) << added.status();
  EXPECT_NE(added.status().message().find("reserve"), std::string::npos);
  rpc::RemoveDatasetRequest rm;
  rm.set_name("kept");
  EXPECT_EQ(catalog.Remove(rm).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(catalog.List().size(), 1u);
  EXPECT_TRUE(catalog.Get("kept").ok());
  EXPECT_FALSE(catalog.Get("more").ok());
  // What a restart finds is what callers were told.
  Open();
  DatasetCatalog after(store_.get());
  ASSERT_TRUE(after.Load().ok());
  ASSERT_EQ(after.List().size(), 1u);
  EXPECT_EQ(after.List()[0].name(), "kept");
}

}  // namespace
}  // namespace ember::meta
