#include "meta/location_index.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "meta/store_fixture_test.h"

namespace ember::meta {
namespace {

using LocationIndexTest = StoreFixture;

NodeView TwoNodes(NodeRegistry* nodes) {
  for (const char* id : {"n1", "n2"}) {
    rpc::Node n;
    n.set_id(id);
    n.set_address(std::string(id) + ":1");
    (*n.mutable_labels())["rack"] = "r1";
    EXPECT_TRUE(nodes->Register(n).ok());
  }
  return nodes->View();
}

std::vector<uint64_t> Sizes() {  // file 1: 10 bytes (1 block), file 2: 3 MiB + 1 (4 blocks)
  return {0, 10, (3u << 20) + 1};
}

TEST_F(LocationIndexTest, ReportsLocateAndResidentBytesAgree) {
  NodeRegistry nodes(store_.get(), std::chrono::seconds(10));
  NodeView view = TwoNodes(&nodes);
  LocationIndex index(store_.get());
  const uint64_t g0 = index.generation();
  // n1: a full report with file 2 wholly resident; n2: file 2's last block, incrementally.
  ASSERT_TRUE(index.Apply("n1", true, {{{7, 1, 2}, std::string(1, '\x0f')}}, {}, {}).ok());
  ASSERT_TRUE(
      index.Apply("n2", false, {}, {BlockAddr{7, 1, 2, 3}, BlockAddr{7, 1, 1, 0}}, {}).ok());
  EXPECT_GT(index.generation(), g0);

  rpc::LocateResponse resp;
  index.Locate({BlockAddr{7, 1, 2, 3}, BlockAddr{7, 1, 2, 0}, BlockAddr{7, 2, 1, 0}}, "n2", view,
               &resp);
  ASSERT_EQ(resp.holders_size(), 3);
  EXPECT_EQ(resp.holders(0).node_ids_size(), 2);
  ASSERT_EQ(resp.holders(1).node_ids_size(), 1);
  EXPECT_EQ(resp.holders(1).node_ids(0), "n1");
  EXPECT_EQ(resp.holders(1).addresses(0), "n1:1");
  EXPECT_EQ(resp.holders(1).racks(0), "r1");
  EXPECT_TRUE(resp.holders(2).dataset_unheld());  // nobody holds anything of version 2
  // The same answer with a node table: each holder named once, the blocks pointing at them.
  rpc::LocateResponse table;
  index.Locate({BlockAddr{7, 1, 2, 3}, BlockAddr{7, 1, 2, 0}, BlockAddr{7, 2, 1, 0}}, "n2", view,
               &table, /*node_table=*/true);
  ASSERT_EQ(table.holders_size(), 3);
  ASSERT_EQ(table.nodes_size(), 2);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(table.holders(i).node_ids_size(), 0) << i;
    std::vector<std::string> listed(resp.holders(i).node_ids().begin(),
                                    resp.holders(i).node_ids().end()),
        named;
    for (uint32_t ref : table.holders(i).node_refs()) {
      ASSERT_LT(ref, 2u);
      const rpc::HolderNode& n = table.nodes(static_cast<int>(ref));
      EXPECT_EQ(n.address(), n.node_id() + ":1");
      EXPECT_EQ(n.rack(), "r1");
      named.push_back(n.node_id());
    }
    EXPECT_EQ(named, listed) << i;
    EXPECT_EQ(table.holders(i).dataset_unheld(), resp.holders(i).dataset_unheld()) << i;
  }

  LocationIndex::Residency r = index.Resident(7, 1, Sizes(), 1 << 20, view);
  EXPECT_EQ(r.total_bytes, 10u + (3u << 20) + 1);
  EXPECT_EQ(r.total_blocks, 5u);
  EXPECT_EQ(r.by_node["n1"].bytes, (3u << 20) + 1);
  EXPECT_EQ(r.by_node["n1"].blocks, 4u);
  EXPECT_EQ(r.by_node["n2"].bytes, 1u + 10u);  // the 1-byte last block and file 1
  EXPECT_EQ(r.anywhere_bytes, r.total_bytes);
  ASSERT_EQ(r.replicas_histogram.size(), 3u);
  EXPECT_EQ(r.replicas_histogram[0], 0u);
  EXPECT_EQ(r.replicas_histogram[1], 4u);
  EXPECT_EQ(r.replicas_histogram[2], 1u);

  // Removing a bit, then a full report that drops everything.
  ASSERT_TRUE(index.Apply("n1", false, {}, {}, {BlockAddr{7, 1, 2, 0}}).ok());
  EXPECT_EQ(index.Resident(7, 1, Sizes(), 1 << 20, view).by_node["n1"].blocks, 3u);
  ASSERT_TRUE(index.Apply("n2", true, {}, {}, {}).ok());
  EXPECT_EQ(index.Resident(7, 1, Sizes(), 1 << 20, view).by_node.count("n2"), 0u);

  // The persisted bitmaps come back.
  LocationIndex again(store_.get());
  ASSERT_TRUE(again.Load().ok());
  EXPECT_EQ(again.Resident(7, 1, Sizes(), 1 << 20, view).by_node["n1"].blocks, 3u);
  again.Drop(7, 0);
  EXPECT_TRUE(again.Resident(7, 1, Sizes(), 1 << 20, view).by_node.empty());
}

// Bitmaps past 64 blocks (kept apart), more holders than fit in an entry, and the per-node
// version counts behind `dataset_unheld`, through changes, a reload and a drop.
TEST_F(LocationIndexTest, LongBitmapsManyHoldersAndUnheldVersions) {
  NodeRegistry nodes(store_.get(), std::chrono::seconds(10));
  for (const char* id : {"n1", "n2", "n3", "n4"}) {
    rpc::Node n;
    n.set_id(id);
    n.set_address(std::string(id) + ":1");
    ASSERT_TRUE(nodes.Register(n).ok());
  }
  NodeView view = nodes.View();
  LocationIndex index(store_.get());
  // File 1 of 7/1: 200 blocks. n1 holds blocks 0 and 150; n2..n4 hold block 0 only.
  std::string long_bitmap(19, '\0');
  long_bitmap[0] = 1;
  long_bitmap[150 / 8] = static_cast<char>(1 << (150 % 8));
  ASSERT_TRUE(index.Apply("n1", true, {{{7, 1, 1}, long_bitmap}}, {}, {}).ok());
  for (const char* id : {"n2", "n3", "n4"}) {
    ASSERT_TRUE(index.Apply(id, false, {}, {BlockAddr{7, 1, 1, 0}}, {}).ok());
  }
  // n2 also holds version 2.
  ASSERT_TRUE(index.Apply("n2", false, {}, {BlockAddr{7, 2, 5, 0}}, {}).ok());
  auto holders = [&](LocationIndex& ix, BlockAddr a, const std::string& self) {
    rpc::LocateResponse resp;
    ix.Locate({a}, self, view, &resp);
    std::vector<std::string> ids(resp.holders(0).node_ids().begin(),
                                 resp.holders(0).node_ids().end());
    std::sort(ids.begin(), ids.end());
    return std::make_pair(ids, resp.holders(0).dataset_unheld());
  };
  using Ids = std::vector<std::string>;
  EXPECT_EQ(holders(index, {7, 1, 1, 0}, "x").first, (Ids{"n1", "n2", "n3", "n4"}));
  EXPECT_EQ(holders(index, {7, 1, 1, 150}, "x").first, (Ids{"n1"}));
  EXPECT_EQ(holders(index, {7, 1, 1, 149}, "x").first, Ids{});
  // n1's long bitmap shrinks to a short one (block 150 removed), then grows again.
  ASSERT_TRUE(index.Apply("n1", false, {}, {}, {BlockAddr{7, 1, 1, 150}}).ok());
  EXPECT_EQ(holders(index, {7, 1, 1, 150}, "x").first, Ids{});
  ASSERT_TRUE(index.Apply("n1", false, {}, {BlockAddr{7, 1, 1, 199}}, {}).ok());
  EXPECT_EQ(holders(index, {7, 1, 1, 199}, "x").first, (Ids{"n1"}));
  std::vector<uint64_t> sizes = {0, 200u << 20};
  EXPECT_EQ(index.Resident(7, 1, sizes, 1 << 20, view).by_node["n1"].blocks, 2u);
  // The persisted bitmaps come back the same.
  LocationIndex again(store_.get());
  ASSERT_TRUE(again.Load().ok());
  EXPECT_EQ(holders(again, {7, 1, 1, 199}, "x").first, (Ids{"n1"}));
  EXPECT_EQ(holders(again, {7, 1, 1, 0}, "x").first, (Ids{"n1", "n2", "n3", "n4"}));
  // Version 2: held by n2 only; once n2's full report drops it, nobody else holds any of it.
  EXPECT_FALSE(holders(again, {7, 2, 9, 0}, "n1").second);
  EXPECT_TRUE(holders(again, {7, 2, 9, 0}, "n2").second);
  ASSERT_TRUE(again.Apply("n2", true, {{{7, 1, 1}, std::string(1, '\x01')}}, {}, {}).ok());
  EXPECT_TRUE(holders(again, {7, 2, 9, 0}, "n1").second);
  EXPECT_EQ(holders(again, {7, 1, 1, 0}, "x").first, (Ids{"n1", "n2", "n3", "n4"}));
  // Dropping version 1 leaves nothing of it; a later report of it starts afresh.
  again.Drop(7, 1);
  EXPECT_EQ(holders(again, {7, 1, 1, 0}, "x").first, Ids{});
  EXPECT_TRUE(holders(again, {7, 1, 1, 0}, "n1").second);
  ASSERT_TRUE(again.Apply("n3", false, {}, {BlockAddr{7, 1, 1, 70}}, {}).ok());
  EXPECT_EQ(holders(again, {7, 1, 1, 70}, "x").first, (Ids{"n3"}));
  EXPECT_EQ(holders(again, {7, 1, 1, 0}, "x").first, Ids{});
}

TEST_F(LocationIndexTest, ARefusedReportChangesNothing) {
  NodeRegistry nodes(store_.get(), std::chrono::seconds(10));
  NodeView view = TwoNodes(&nodes);
  {
    LocationIndex index(store_.get());
    ASSERT_TRUE(index.Apply("n1", true, {{{7, 1, 2}, std::string(1, '\x01')}}, {}, {}).ok());
  }
  Open(/*full=*/true);
  LocationIndex index(store_.get());
  ASSERT_TRUE(index.Load().ok());
  const uint64_t g = index.generation();
  EXPECT_EQ(index.Apply("n1", true, {}, {BlockAddr{7, 1, 2, 1}}, {}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(index.generation(), g);
  rpc::LocateResponse resp;
  index.Locate({BlockAddr{7, 1, 2, 0}, BlockAddr{7, 1, 2, 1}}, "n2", view, &resp);
  EXPECT_EQ(resp.holders(0).node_ids_size(), 1);  // still there
  EXPECT_EQ(resp.holders(1).node_ids_size(), 0);  // never added
}

}  // namespace
}  // namespace ember::meta
