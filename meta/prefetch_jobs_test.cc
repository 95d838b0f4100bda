#include "meta/prefetch_jobs.h"

#include <gtest/gtest.h>

#include <thread>

#include "meta/store_fixture_test.h"

namespace ember::meta {
namespace {

class PrefetchJobsTest : public StoreFixture {
 protected:
  void Register(NodeRegistry* nodes, const std::string& id, uint64_t capacity) {
    rpc::Node n;
    n.set_id(id);
    n.set_address(id + ":1");
    n.set_capacity_bytes(capacity);
    ASSERT_TRUE(nodes->Register(n).ok());
  }
};

TEST_F(PrefetchJobsTest, StartValidatesSettlesDeadNodesAndPersists) {
  DatasetCatalog catalog(store_.get());
  NodeRegistry nodes(store_.get(), std::chrono::milliseconds(300));
  AddDataset(&catalog, "imgs");
  Register(&nodes, "n1", 1ull << 30);
  Register(&nodes, "n2", 1ull << 30);
  PrefetchJobs jobs(store_.get(), &catalog, &nodes);

  rpc::PrefetchSpec spec;
  spec.set_dataset("nope");
  EXPECT_EQ(jobs.Start(spec).status().code(), absl::StatusCode::kNotFound);
  spec.set_dataset("imgs");
  spec.add_nodes("n3");
  EXPECT_EQ(jobs.Start(spec).status().code(), absl::StatusCode::kNotFound);
  spec.clear_nodes();
  spec.set_mode(rpc::PrefetchSpec::STRIPE);
  spec.set_replicas(3);
  EXPECT_EQ(jobs.Start(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.set_mode(rpc::PrefetchSpec::FULL);
  spec.add_paths("b");
  spec.set_pin_ms(60'000);
  auto job = jobs.Start(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->dataset_files(), 2u);
  EXPECT_EQ(job->spec().nodes_size(), 2);
  EXPECT_EQ(jobs.ForNode("n1").size(), 1u);
  EXPECT_EQ(jobs.ForNode("n9").size(), 0u);

  // n1 finishes; n2 stops heartbeating: once its lease runs out the job ends.
  rpc::PrefetchNodeProgress done;
  done.set_node_id("n1");
  done.set_finished(true);
  ASSERT_TRUE(jobs.Report(job->id(), done).ok());
  EXPECT_EQ(jobs.Get(job->id())->state(), rpc::PrefetchJob::RUNNING);
  for (int i = 0; i < 8; i++) {
    nodes.Heartbeat("n1", rpc::NodeStats());
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
  }
  auto settled = jobs.Get(job->id());
  ASSERT_TRUE(settled.ok());
  EXPECT_EQ(settled->state(), rpc::PrefetchJob::DONE);
  EXPECT_EQ(settled->nodes(1).note(), "node died before finishing");

  // A pin is released; a reload has it released and the job done.
  EXPECT_EQ(*jobs.Unpin("imgs", ""), 1u);
  PrefetchJobs again(store_.get(), &catalog, &nodes);
  ASSERT_TRUE(again.Load().ok());
  auto reloaded = again.Get(job->id());
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(reloaded->state(), rpc::PrefetchJob::DONE);
  EXPECT_EQ(reloaded->pin_until_unix_ms(), 0);
  // New ids never reuse old ones.
  spec.clear_paths();
  auto next = again.Start(spec);
  ASSERT_TRUE(next.ok());
  EXPECT_NE(next->id(), job->id());
}

// A client retries a start on another replica when the first attempt's answer was lost: the
// same request id gets the job the first attempt started, also from a store reloaded (the new
// leader's), and no second job.
TEST_F(PrefetchJobsTest, ARetriedStartGetsTheJobItStartedBefore) {
  DatasetCatalog catalog(store_.get());
  NodeRegistry nodes(store_.get(), std::chrono::seconds(10));
  AddDataset(&catalog, "imgs");
  Register(&nodes, "n1", 1ull << 30);
  rpc::PrefetchSpec spec;
  spec.set_dataset("imgs");
  std::string first_id;
  {
    PrefetchJobs jobs(store_.get(), &catalog, &nodes);
    auto first = jobs.Start(spec, "req-1");
    ASSERT_TRUE(first.ok()) << first.status();
    first_id = first->id();
    auto again = jobs.Start(spec, "req-1");
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->id(), first_id);
    EXPECT_EQ(jobs.List().size(), 1u);
  }
  PrefetchJobs reloaded(store_.get(), &catalog, &nodes);
  ASSERT_TRUE(reloaded.Load().ok());
  auto retried = reloaded.Start(spec, "req-1");
  ASSERT_TRUE(retried.ok());
  EXPECT_EQ(retried->id(), first_id);
  // Another call (another id, or none) is another job.
  auto other = reloaded.Start(spec, "req-2");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->id(), first_id);
  auto plain = reloaded.Start(spec);
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(plain->id(), other->id());
  EXPECT_EQ(reloaded.List().size(), 3u);
}

TEST_F(PrefetchJobsTest, ARefusedCancelLeavesTheJobAsItWas) {
  std::string id;
  {
    DatasetCatalog catalog(store_.get());
    NodeRegistry nodes(store_.get(), std::chrono::seconds(10));
    AddDataset(&catalog, "imgs");
    Register(&nodes, "n1", 1ull << 30);
    PrefetchJobs jobs(store_.get(), &catalog, &nodes);
    rpc::PrefetchSpec spec;
    spec.set_dataset("imgs");
    auto job = jobs.Start(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    id = job->id();
  }
  Open(/*full=*/true);
  DatasetCatalog catalog(store_.get());
  NodeRegistry nodes(store_.get(), std::chrono::seconds(10));
  ASSERT_TRUE(catalog.Load().ok() && nodes.Load().ok());
  PrefetchJobs jobs(store_.get(), &catalog, &nodes);
  ASSERT_TRUE(jobs.Load().ok());
  EXPECT_EQ(jobs.Cancel(id).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(jobs.Get(id)->state(), rpc::PrefetchJob::RUNNING);
  rpc::PrefetchSpec spec;
  spec.set_dataset("imgs");
  EXPECT_EQ(jobs.Start(spec).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(jobs.List().size(), 1u);
}

}  // namespace
}  // namespace ember::meta
