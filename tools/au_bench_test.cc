#include "tools/au_bench.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <thread>

namespace ember::tools::au {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/ember-au-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<Sample> Samples(size_t n) {
  std::vector<Sample> out;
  for (size_t i = 0; i < n; i++) out.push_back({"f" + std::to_string(i), 0, 0, 1000});
  return out;
}

TEST(AuBenchTest, WorkloadsAndAcceleratorsAreKnownByNameOnly) {
  auto w = FindWorkload("unet3d");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->batch, 7u);
  EXPECT_EQ(*ComputeTime(*w, "h100"), std::chrono::microseconds(323'000));
  EXPECT_EQ(*ComputeTime(*w, "a100"), std::chrono::microseconds(636'000));
  EXPECT_EQ(FindWorkload("resnet50")->samples_per_file, 1251u);
  EXPECT_DOUBLE_EQ(FindWorkload("cosmoflow")->threshold, 0.70);
  auto bad = FindWorkload("bert");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unet3d, resnet50, cosmoflow"), std::string::npos);
  EXPECT_FALSE(ComputeTime(*w, "tpu").ok());
}

TEST(AuBenchTest, GeneratedFilesHaveTheWorkloadsSizesAndAreReadAsItsSamples) {
  TempDir dir;
  // One sample a file, sizes spread around the mean.
  Workload w = *FindWorkload("cosmoflow");
  auto total = Generate(w, dir.path + "/cosmo", 20 * w.sample_bytes, 7);
  ASSERT_TRUE(total.ok()) << total.status();
  auto samples = ListSamples(w, dir.path + "/cosmo");
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 20u);
  uint64_t sum = 0;
  bool differ = false;
  for (const Sample& s : *samples) {
    EXPECT_EQ(s.bytes, fs::file_size(s.path));
    EXPECT_GT(s.bytes, w.sample_bytes / 2);
    EXPECT_LT(s.bytes, w.sample_bytes * 2);
    differ |= s.bytes != (*samples)[0].bytes;
    sum += s.bytes;
    EXPECT_TRUE(ReadFile(s.path, s.offset, s.length).ok());
  }
  EXPECT_TRUE(differ);
  EXPECT_EQ(sum, *total);
  // Records in files (resnet50's shape, scaled down): every record of every file.
  Workload r{"records", 10, 1000, 0, 4, std::chrono::microseconds(1), {}, 2, 0.9};
  ASSERT_TRUE(Generate(r, dir.path + "/rec", 30'000, 7).ok());
  samples = ListSamples(r, dir.path + "/rec");
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 30u);
  EXPECT_EQ((*samples)[9].offset, 9000u);
  EXPECT_EQ((*samples)[9].length, 1000u);
  EXPECT_TRUE(ReadFile((*samples)[9].path, 9000, 1000).ok());
  EXPECT_EQ(ReadFile((*samples)[9].path, 9500, 1000).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ListSamples(r, dir.path + "/none").status().code(), absl::StatusCode::kNotFound);
}

TEST(AuBenchTest, AuIsComputeOverWallTimeForAReaderOfKnownSpeed) {
  RunOptions o;
  o.batch = 1;
  o.readers = 1;
  o.compute = milliseconds(20);
  // Reads take no time: the accelerator is never kept waiting.
  auto fast = au::Run(Samples(30), o,
                      [](const std::string&, uint64_t, uint64_t) { return absl::OkStatus(); });
  ASSERT_TRUE(fast.ok());
  EXPECT_GT(fast->au, 0.9);
  EXPECT_EQ(fast->epochs[0].samples, 30u);
  EXPECT_EQ(fast->epochs[0].bytes, 30'000u);
  // One reader taking 40 ms a sample for 20 ms of compute: busy about half the time.
  auto slow = au::Run(Samples(30), o, [](const std::string&, uint64_t, uint64_t) {
    std::this_thread::sleep_for(milliseconds(40));
    return absl::OkStatus();
  });
  ASSERT_TRUE(slow.ok());
  EXPECT_GT(slow->au, 0.35);
  EXPECT_LT(slow->au, 0.6);
  // Four such readers keep up again (two batches ahead each).
  o.readers = 4;
  auto four = au::Run(Samples(40), o, [](const std::string&, uint64_t, uint64_t) {
    std::this_thread::sleep_for(milliseconds(40));
    return absl::OkStatus();
  });
  ASSERT_TRUE(four.ok());
  EXPECT_GT(four->au, 0.8);
  // A read error ends the run with it.
  auto failed = au::Run(Samples(5), o, [](const std::string&, uint64_t, uint64_t) {
    return absl::UnavailableError("disk gone");
  });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  o.batch = 0;
  EXPECT_EQ(au::Run(Samples(5), o, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AuBenchTest, FindMaxFindsHowManyAcceleratorsASharedReaderFeeds) {
  // Storage that serves one sample per 10 ms in all, whoever asks; each accelerator computes
  // 42 ms per one-sample batch: 4.2 accelerators' worth. 4 hold AU >= 90%, 5 get ~84%.
  std::mutex mu;
  auto next_free = std::chrono::steady_clock::now();
  ReadFn shared = [&](const std::string&, uint64_t, uint64_t) {
    std::chrono::steady_clock::time_point done;
    {
      std::lock_guard lock(mu);
      next_free = std::max(next_free, std::chrono::steady_clock::now()) + milliseconds(10);
      done = next_free;
    }
    std::this_thread::sleep_until(done);
    return absl::OkStatus();
  };
  RunOptions o;
  o.batch = 1;
  o.readers = 2;
  o.compute = milliseconds(42);
  std::vector<std::pair<uint32_t, double>> runs;
  auto most = FindMax(Samples(80), o, 0.9, shared, [&](uint32_t n, double a) {
    runs.push_back({n, a});
  });
  ASSERT_TRUE(most.ok());
  std::string tried;
  for (auto [n, a] : runs) tried += std::to_string(n) + ":" + std::to_string(a) + " ";
  EXPECT_EQ(*most, 4u) << tried;
  // Doubling to the first failure (8), then bisecting (6, 5).
  ASSERT_GE(runs.size(), 4u) << tried;
  EXPECT_EQ(runs[0].first, 1u);
  EXPECT_EQ(runs[3].first, 8u);
}

}  // namespace
}  // namespace ember::tools::au
