// Helpers for meta's unit tests (tests only): a store in a temp dir that can be reopened, with
// or without room to write, and a small POSIX origin to add as a dataset.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "meta/catalog.h"
#include "meta/store.h"
#include "tests/testing/testing.h"

namespace ember::meta {

class StoreFixture : public ::testing::Test {
 protected:
  // Opens (or reopens) the store; `full`: as if the disk had no room (every write is refused).
  void Open(bool full = false) {
    store_.reset();
    MetaStore::Options o;
    if (full) o.reserve_bytes = std::numeric_limits<uint64_t>::max();
    auto s = MetaStore::Open(dir_.Sub("db"), o);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  void SetUp() override { Open(); }

  // A tree under `name`: files a (10 bytes), b/c (3 MiB + 1), b/d (0), 3 entries + root + b.
  std::string MakeOrigin(const std::string& name) {
    std::string root = dir_.Sub(name);
    ember::testing::RunShell("mkdir -p " + root + "/b");
    ember::testing::WriteFile(root + "/a", std::string(10, 'a'));
    ember::testing::WriteRandomFile(root + "/b/c", (3u << 20) + 1, 7);
    ember::testing::WriteFile(root + "/b/d", "");
    return root;
  }
  // Adds `name` from MakeOrigin(name) with 1 MiB blocks.
  rpc::Dataset AddDataset(DatasetCatalog* catalog, const std::string& name) {
    rpc::AddDatasetRequest req;
    req.set_name(name);
    req.set_origin(MakeOrigin(name));
    req.set_block_size(1 << 20);
    auto done = catalog->Add(req, [](const rpc::DatasetProgress&) {});
    EXPECT_TRUE(done.ok()) << done.status();
    return done.ok() ? done->dataset() : rpc::Dataset();
  }

  ember::testing::TempDir dir_;
  std::unique_ptr<MetaStore> store_;
};

}  // namespace ember::meta
