// `ember bench au`: how many accelerators a directory (an Ember mount, or anything else) keeps
// busy, measured as MLPerf Storage does: emulated accelerators each take batches from their own
// data loader (reader threads, a seeded shuffle per epoch, batches prefetched two deep) and spend
// the workload's compute time on each; accelerator utilization (AU) = compute time / wall time.
// A run passes when AU holds the workload's threshold.
//
// The workloads (MLPerf Storage's training workloads; per-batch compute times are its published
// ones for H100 and A100):
//   unet3d     one sample per file, ~140 MB (mean 146,600,628 B, stdev 68,341,808), batch 7,
//              0.323 s (H100) / 0.636 s (A100), 4 readers, AU >= 90%
//   resnet50   1,251 records of 114,660 B per file (~143 MB), batch 400, 0.224 s / 0.435 s,
//              8 readers, AU >= 90%
//   cosmoflow  one sample per file, ~2.8 MB (2,828,486 B, stdev 71,311), batch 1,
//              0.00350 s / 0.00551 s, 4 readers, AU >= 70%
// unet3d and cosmoflow read whole files; resnet50 reads records (pread of one record each).
//
// Thread-safe by construction: a Run owns its threads; readers must be safe to call from many.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::tools::au {

struct Workload {
  std::string name;
  uint32_t samples_per_file = 1;
  uint64_t sample_bytes = 0;        // mean
  uint64_t sample_bytes_stdev = 0;  // spread of file sizes (one sample per file)
  uint32_t batch = 1;               // samples per batch
  std::chrono::microseconds compute_h100{0}, compute_a100{0};  // per batch
  uint32_t readers = 4;                                        // reader threads per accelerator
  double threshold = 0.9;                                      // AU a run must hold
};

// Returns: the workload; InvalidArgument naming the known ones.
absl::StatusOr<Workload> FindWorkload(const std::string& name);
// "h100" or "a100". Returns: the per-batch compute time; InvalidArgument.
absl::StatusOr<std::chrono::microseconds> ComputeTime(const Workload& w,
                                                      const std::string& accelerator);

// Writes the workload's files under dir/train (file sizes drawn with the workload's spread,
// seeded), about `bytes` in all (at least one file). `progress(done_bytes, total_bytes)` is
// called as files are written. Returns: the files' total bytes; errors naming the file.
absl::StatusOr<uint64_t> Generate(const Workload& w, const std::string& dir, uint64_t bytes,
                                  uint64_t seed,
                                  const std::function<void(uint64_t, uint64_t)>& progress = {});

// One sample's bytes: [offset, offset + length) of a file. The real one preads the file; tests
// pass one of known speed.
using ReadFn =
    std::function<absl::Status(const std::string& path, uint64_t offset, uint64_t length)>;
// pread of the range (whole file when length is 0), O_RDONLY each time as a loader does.
absl::Status ReadFile(const std::string& path, uint64_t offset, uint64_t length);

// What a run reads: the files of dir/train in name order (or given outright).
struct Sample {
  std::string path;
  uint64_t offset = 0, length = 0;  // length 0: the whole file
  uint64_t bytes = 0;               // what it counts as read
};
absl::StatusOr<std::vector<Sample>> ListSamples(const Workload& w, const std::string& dir);

struct RunOptions {
  uint32_t accelerators = 1;
  uint32_t epochs = 1;
  uint32_t readers = 0;  // per accelerator; 0: the workload's
  std::chrono::microseconds compute{0};
  uint32_t batch = 0;  // 0: the workload's
  uint64_t seed = 1;
  // After each epoch: its figures (for progress).
  std::function<void(uint32_t epoch, double au, double seconds)> on_epoch;
};
struct EpochResult {
  double au = 0;      // mean over accelerators
  double min_au = 0;  // the least busy accelerator's
  double seconds = 0;
  uint64_t samples = 0, bytes = 0;
};
struct RunResult {
  std::vector<EpochResult> epochs;
  double au = 0;  // compute time / wall time over all epochs, mean over accelerators
  double samples_per_second = 0, bytes_per_second = 0;
};
// Returns: the figures; the first read error (the run stops).
absl::StatusOr<RunResult> Run(const std::vector<Sample>& samples, const RunOptions& options,
                              const ReadFn& read);

// The most accelerators whose AU holds `threshold` (0 if even one does not), trying counts by
// doubling and then bisecting; `tried(n, au)` is told of each run.
absl::StatusOr<uint32_t> FindMax(const std::vector<Sample>& samples, RunOptions options,
                                 double threshold, const ReadFn& read,
                                 const std::function<void(uint32_t, double)>& tried = {});

}  // namespace ember::tools::au
