#include "meta/node_registry.h"

#include <gtest/gtest.h>

#include <thread>

#include "meta/store_fixture_test.h"

namespace ember::meta {
namespace {

using NodeRegistryTest = StoreFixture;

rpc::Node MakeNode(const std::string& id, const std::string& rack) {
  rpc::Node n;
  n.set_id(id);
  n.set_address(id + ":7371");
  (*n.mutable_labels())["rack"] = rack;
  (*n.mutable_labels())["switch"] = "s-" + rack;
  n.set_gpus(8);
  return n;
}

TEST_F(NodeRegistryTest, LeasesDecideLivenessAndViewsAreVersionedByMembership) {
  NodeRegistry nodes(store_.get(), std::chrono::milliseconds(300));
  EXPECT_EQ(nodes.Register(rpc::Node()).status().code(), absl::StatusCode::kInvalidArgument);
  auto r = nodes.Register(MakeNode("b", "r2"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->lease_ms(), 300u);
  EXPECT_EQ(r->heartbeat_interval_ms(), 100u);
  ASSERT_TRUE(nodes.Register(MakeNode("a", "r1")).ok());
  EXPECT_FALSE(nodes.Heartbeat("nobody", rpc::NodeStats()));

  NodeView v1 = nodes.View();
  ASSERT_EQ(v1.members->nodes.size(), 2u);
  EXPECT_EQ(v1.members->nodes[0].id, "a");  // slots in id order
  EXPECT_EQ(v1.Find("b")->rack, "r2");
  EXPECT_EQ(v1.Find("b")->sw, "s-r2");
  EXPECT_TRUE(v1.Alive("a") && v1.Alive("b"));
  EXPECT_FALSE(v1.Alive("c"));

  // Heartbeats keep "a" alive; "b" falls silent past its lease. Membership is unchanged.
  for (int i = 0; i < 8; i++) {
    rpc::NodeStats st;
    st.set_hits(i);
    EXPECT_TRUE(nodes.Heartbeat("a", st));
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
  }
  NodeView v2 = nodes.View();
  EXPECT_EQ(v2.members->version, v1.members->version);
  EXPECT_TRUE(v2.Alive("a"));
  EXPECT_FALSE(v2.Alive("b"));
  for (const rpc::Node& n : nodes.List()) {
    EXPECT_EQ(n.state(), n.id() == "a" ? rpc::Node::ALIVE : rpc::Node::DEAD) << n.id();
    if (n.id() == "a") EXPECT_EQ(n.stats().hits(), 7u);
  }
  ASSERT_TRUE(nodes.Register(MakeNode("c", "r1")).ok());
  EXPECT_GT(nodes.View().members->version, v2.members->version);

  // After a restart every known node gets one lease to check in.
  NodeRegistry again(store_.get(), std::chrono::milliseconds(300));
  ASSERT_TRUE(again.Load().ok());
  NodeView v3 = again.View();
  EXPECT_EQ(v3.members->nodes.size(), 3u);
  EXPECT_TRUE(v3.Alive("b"));
}

TEST_F(NodeRegistryTest, ARefusedRegistrationIsNotARegistration) {
  Open(/*full=*/true);
  NodeRegistry nodes(store_.get(), std::chrono::seconds(10));
  EXPECT_EQ(nodes.Register(MakeNode("a", "r1")).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(nodes.Known("a"));
  EXPECT_TRUE(nodes.View().members->nodes.empty());
}

}  // namespace
}  // namespace ember::meta
