#include "meta/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace ember::meta {
namespace {

std::vector<SchedNode> Cluster(int switches, int per_switch, uint32_t gpus) {
  std::vector<SchedNode> nodes;
  for (int s = 0; s < switches; s++) {
    for (int i = 0; i < per_switch; i++) {
      nodes.push_back({"s" + std::to_string(s) + "n" + std::to_string(i), "s" + std::to_string(s),
                       "r" + std::to_string(s / 2), gpus, 0, true});
    }
  }
  return nodes;
}

TEST(PlaceGangTest, LocalityWinsThenTopologyThenFit) {
  auto nodes = Cluster(3, 4, 8);
  std::map<std::string, double> warm = {{"s2n0", 1.0}, {"s2n1", 1.0}, {"s1n3", 0.5}};
  auto loc = [&](const SchedNode& n) { return warm.count(n.id) ? warm[n.id] : 0.0; };
  auto p = PlaceGang({2, 8, Topology::kNone}, nodes, loc);
  ASSERT_FALSE(p.empty());
  std::set<std::string> chosen(p[0].nodes.begin(), p[0].nodes.end());
  EXPECT_EQ(chosen, (std::set<std::string>{"s2n0", "s2n1"}));
  EXPECT_DOUBLE_EQ(p[0].score.locality, 1.0);
  EXPECT_EQ(p[0].score.switches, 1);
  EXPECT_GE(p.size(), 2u);  // runners-up explain the choice
  // Without data anywhere, the gang packs under one switch.
  auto cold = PlaceGang({4, 8, Topology::kNone}, nodes, [](const SchedNode&) { return 0.0; });
  ASSERT_FALSE(cold.empty());
  EXPECT_EQ(cold[0].score.switches, 1);
  // Best fit: two 4-GPU workers go on one node rather than spreading.
  auto fit = PlaceGang({2, 4, Topology::kNone}, nodes, [](const SchedNode&) { return 0.0; });
  EXPECT_EQ(fit[0].nodes[0], fit[0].nodes[1]);
}

TEST(PlaceGangTest, AllOrNothingAndTopologyConstraints) {
  auto nodes = Cluster(2, 2, 8);
  nodes[0].used = 8;  // s0n0 full
  // 4 workers of 8 GPUs: only 3 nodes have room.
  EXPECT_TRUE(
      PlaceGang({4, 8, Topology::kNone}, nodes, [](const SchedNode&) { return 0.0; }).empty());
  // same-switch: switch s0 has one free node, s1 two.
  auto p = PlaceGang({2, 8, Topology::kSameSwitch}, nodes, [](const SchedNode&) { return 0.0; });
  ASSERT_FALSE(p.empty());
  for (const auto& n : p[0].nodes) EXPECT_EQ(n.substr(0, 2), "s1");
  EXPECT_TRUE(PlaceGang({3, 8, Topology::kSameSwitch}, nodes, [](const SchedNode&) {
                return 0.0;
              }).empty());
  // Dead nodes are never chosen.
  nodes[2].alive = false;
  nodes[3].alive = false;
  EXPECT_TRUE(
      PlaceGang({1, 8, Topology::kNone}, nodes, [](const SchedNode&) { return 0.0; }).size() == 1);
  EXPECT_TRUE(
      PlaceGang({2, 8, Topology::kNone}, nodes, [](const SchedNode&) { return 0.0; }).empty());
}

TEST(PlaceOneTest, PrefersSameSwitchThenLocality) {
  auto nodes = Cluster(2, 3, 8);
  nodes[0].alive = false;  // s0n0 died
  std::map<std::string, double> warm = {{"s1n0", 1.0}, {"s0n2", 0.2}};
  auto loc = [&](const SchedNode& n) { return warm.count(n.id) ? warm[n.id] : 0.0; };
  EXPECT_EQ(*PlaceOne(8, nodes, loc, &nodes[0]), "s0n2");
  EXPECT_EQ(*PlaceOne(8, nodes, loc, nullptr), "s1n0");
  for (auto& n : nodes) n.used = n.gpus;
  EXPECT_FALSE(PlaceOne(8, nodes, loc, nullptr));
}

// Random clusters and job streams: never oversubscribed, gangs all or nothing, nobody starves.
TEST(SchedulerPropertyTest, RandomStreams) {
  std::mt19937 rng(7);
  for (int round = 0; round < 30; round++) {
    auto nodes = Cluster(1 + rng() % 4, 1 + rng() % 6, 1 + rng() % 8);
    uint32_t max_gpus = nodes[0].gpus;
    struct J {
      GangRequest req;
      int duration;
      int started = -1;
      std::vector<std::string> on;
    };
    std::map<std::string, J> jobs;
    JobQueue queue(4);
    int total = 40;
    for (int i = 0; i < total; i++) {
      J j;
      j.req.workers = 1 + rng() % std::min<size_t>(6, nodes.size());
      j.req.gpus_per_worker = 1 + rng() % max_gpus;
      j.req.topology = static_cast<Topology>(rng() % 2);
      j.duration = 1 + rng() % 5;
      // Meta refuses a gang that cannot fit even an empty cluster; so does this stream.
      if (PlaceGang(
              j.req, nodes, [](const SchedNode&) { return 0.0; }, 0)
              .empty())
        continue;
      std::string id = "j" + std::to_string(i);
      jobs[id] = j;
      queue.Push(id);
    }
    std::map<std::string, double> warm;
    for (const auto& n : nodes) warm[n.id] = (rng() % 100) / 100.0;
    auto loc = [&](const SchedNode& n) { return warm[n.id]; };
    int step = 0;
    for (; step < 2000 && !queue.jobs().empty(); step++) {
      // Finish jobs whose time is up.
      for (auto& [id, j] : jobs) {
        if (j.started >= 0 && !j.on.empty() && step - j.started >= j.duration) {
          for (const auto& n : j.on) {
            for (auto& sn : nodes) {
              if (sn.id == n) sn.used -= j.req.gpus_per_worker;
            }
          }
          j.on.clear();
        }
      }
      queue.Schedule([&](const std::string& id) {
        J& j = jobs[id];
        auto p = PlaceGang(j.req, nodes, loc, 0);
        if (p.empty()) return false;
        EXPECT_EQ(p[0].nodes.size(), j.req.workers);  // the whole gang
        for (const auto& n : p[0].nodes) {
          for (auto& sn : nodes) {
            if (sn.id == n) sn.used += j.req.gpus_per_worker;
          }
        }
        j.on = p[0].nodes;
        j.started = step;
        return true;
      });
      for (const auto& n : nodes) ASSERT_LE(n.used, n.gpus) << "oversubscribed " << n.id;
    }
    // Nobody starved: every job was placed in bounded time.
    EXPECT_TRUE(queue.jobs().empty())
        << "round " << round << ": " << queue.jobs().size() << " jobs never started";
    for (const auto& [id, j] : jobs) EXPECT_GE(j.started, 0) << id;
  }
}

}  // namespace
}  // namespace ember::meta
