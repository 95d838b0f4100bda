#include "meta/job_service.h"

#include <gtest/gtest.h>

#include "meta/store_fixture_test.h"

namespace ember::meta {
namespace {

class JobServiceTest : public StoreFixture {
 protected:
  struct Units {
    explicit Units(MetaStore* store)
        : catalog(store),
          nodes(store, std::chrono::seconds(10)),
          locations(store),
          prefetches(store, &catalog, &nodes),
          jobs(store, &catalog, &nodes, &locations, &prefetches) {}
    absl::Status Load() {
      for (absl::Status st :
           {catalog.Load(), nodes.Load(), locations.Load(), prefetches.Load(), jobs.Load()}) {
        if (!st.ok()) return st;
      }
      return absl::OkStatus();
    }
    DatasetCatalog catalog;
    NodeRegistry nodes;
    LocationIndex locations;
    PrefetchJobs prefetches;
    JobService jobs;
  };
  void Register(Units* u, const std::string& id, uint32_t gpus) {
    rpc::Node n;
    n.set_id(id);
    n.set_address(id + ":1");
    n.set_gpus(gpus);
    ASSERT_TRUE(u->nodes.Register(n).ok());
  }
  rpc::JobSpec Spec(const std::string& name, uint32_t workers, uint32_t gpus) {
    rpc::JobSpec s;
    s.set_name(name);
    s.set_workers(workers);
    s.set_gpus_per_worker(gpus);
    s.set_dataset("imgs");
    return s;
  }
};

TEST_F(JobServiceTest, PlacesWhereTheDataIsQueuesAndFreesGpus) {
  Units u(store_.get());
  const rpc::Dataset ds = AddDataset(&u.catalog, "imgs");
  Register(&u, "n1", 8);
  Register(&u, "n2", 8);
  // n2 holds the big file: the job goes there.
  ASSERT_TRUE(
      u.locations.Apply("n2", true, {{{ds.id(), 1, 4}, std::string(1, '\x0f')}}, {}, {}).ok());
  auto fr = u.jobs.Fractions("imgs");
  ASSERT_TRUE(fr.has_value());
  EXPECT_GT((*fr)["n2"], 0.99);
  EXPECT_FALSE(u.jobs.Fractions("nope").has_value());

  auto a = u.jobs.Submit(Spec("a", 1, 8));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->state(), rpc::Job::RUNNING);
  ASSERT_EQ(a->workers_size(), 1);
  EXPECT_EQ(a->workers(0).node_id(), "n2");
  EXPECT_EQ(a->workers(0).free_gpus_after(), 0u);
  // n1 takes the next one; a third waits for GPUs.
  EXPECT_EQ(u.jobs.Submit(Spec("b", 1, 8))->workers(0).node_id(), "n1");
  auto c = u.jobs.Submit(Spec("c", 1, 8));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state(), rpc::Job::QUEUED);
  EXPECT_EQ(u.jobs.QueueLength(), 1u);
  // Too big for the cluster: refused at once.
  EXPECT_EQ(u.jobs.Submit(Spec("huge", 3, 8)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Ending one starts the queued job.
  ASSERT_TRUE(u.jobs.End("a", rpc::Job::COMPLETED).ok());
  EXPECT_EQ(u.jobs.Get("c")->state(), rpc::Job::RUNNING);
  EXPECT_EQ(u.jobs.End("a", rpc::Job::CANCELLED).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A restart finds the same jobs, GPUs still taken.
  Units again(store_.get());
  ASSERT_TRUE(again.Load().ok());
  EXPECT_EQ(again.jobs.CountByState()["RUNNING"], 2u);
  auto d = again.jobs.Submit(Spec("d", 1, 8));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->state(), rpc::Job::QUEUED);
}

// Submits and ends retried on another replica after a lost answer (same request id) are
// answered with what the first attempt did, also after a reload (the new leader's).
TEST_F(JobServiceTest, RetriedSubmitsAndEndsAreAnsweredWithTheFirstAttempt) {
  std::string id;
  {
    Units u(store_.get());
    AddDataset(&u.catalog, "imgs");
    Register(&u, "n1", 8);
    auto a = u.jobs.Submit(Spec("a", 1, 8), "sub-1");
    ASSERT_TRUE(a.ok()) << a.status();
    id = a->id();
    auto again = u.jobs.Submit(Spec("a", 1, 8), "sub-1");
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->id(), id);
    EXPECT_EQ(u.jobs.List().jobs_size(), 1);
  }
  Units u(store_.get());
  ASSERT_TRUE(u.Load().ok());
  auto retried = u.jobs.Submit(Spec("a", 1, 8), "sub-1");
  ASSERT_TRUE(retried.ok());
  EXPECT_EQ(retried->id(), id);
  EXPECT_EQ(u.jobs.List().jobs_size(), 1);
  ASSERT_TRUE(u.jobs.End(id, rpc::Job::COMPLETED, "end-1").ok());
  auto ended = u.jobs.End(id, rpc::Job::COMPLETED, "end-1");
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), rpc::Job::COMPLETED);
  // Another call to end it is refused as before.
  EXPECT_EQ(u.jobs.End(id, rpc::Job::CANCELLED, "end-2").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(u.jobs.End(id, rpc::Job::CANCELLED).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobServiceTest, ARefusedSubmitOrEndChangesNothing) {
  {
    Units u(store_.get());
    AddDataset(&u.catalog, "imgs");
    Register(&u, "n1", 8);
    ASSERT_TRUE(u.jobs.Submit(Spec("a", 1, 8)).ok());
  }
  Open(/*full=*/true);
  Units u(store_.get());
  ASSERT_TRUE(u.Load().ok());
  EXPECT_EQ(u.jobs.Submit(Spec("b", 1, 4)).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(u.jobs.End("a", rpc::Job::COMPLETED).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(u.jobs.List().jobs_size(), 1);
  EXPECT_EQ(u.jobs.Get("a")->state(), rpc::Job::RUNNING);
  Open();
  Units after(store_.get());
  ASSERT_TRUE(after.Load().ok());
  ASSERT_EQ(after.jobs.List().jobs_size(), 1);
  EXPECT_EQ(after.jobs.Get("a")->state(), rpc::Job::RUNNING);
}

}  // namespace
}  // namespace ember::meta
