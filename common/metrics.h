// Prometheus metrics: counters, gauges and histograms in a process-wide registry, rendered in
// the Prometheus text format (version 0.0.4) for `/metrics`.
//
// Hot paths keep a pointer to their metric and pay one relaxed atomic add per event. Values that
// already live elsewhere (cache size, queue length) are read at scrape time through callbacks.
// Names follow Prometheus conventions: `ember_<what>_<unit>`, `_total` for counters, base units
// (seconds, bytes). Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ember::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// Latency histogram with fixed buckets from 50 µs to 60 s (seconds, cumulative on render).
class Histogram {
 public:
  static constexpr std::array<double, 16> kBounds = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,   0.1,     0.25,   0.5,   1,      5,     60};
  void Observe(double seconds);
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }

 private:
  friend class Registry;
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};  // last: +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

// Observes the time from construction to destruction into a histogram.
class Timer {
 public:
  explicit Timer(Histogram* h) : h_(h), start_(std::chrono::steady_clock::now()) {}
  ~Timer() {
    if (h_ != nullptr) {
      h_->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }

 private:
  Histogram* h_;
  std::chrono::steady_clock::time_point start_;
};

class Registry {
 public:
  // The same name + labels returns the same metric. Metrics live as long as the registry.
  Counter* GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          const Labels& labels = {});
  // A gauge (or counter, with type "counter") read when scraped; `id` replaces an earlier
  // callback with the same id (an agent restarted in-process).
  void SetCallback(const std::string& name, const std::string& help, const std::string& type,
                   const Labels& labels, std::function<double()> fn);
  // A family whose series are only known at scrape time (one per running job, per node...).
  using Samples = std::vector<std::pair<Labels, double>>;
  void SetCollector(const std::string& name, const std::string& help, const std::string& type,
                    std::function<Samples()> fn);
  // Drops callbacks and collectors of families whose name starts with the prefix.
  void RemoveCallbacks(const std::string& name_prefix);

  std::string Render();

 private:
  struct Family {
    std::string help, type;
    std::map<std::string, std::unique_ptr<Counter>> counters;  // by rendered label set
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
    std::map<std::string, std::function<double()>> callbacks;
    std::function<Samples()> collector;
  };
  Family& FamilyOf(const std::string& name, const std::string& help, const std::string& type);
  std::mutex mu_;
  std::map<std::string, Family> families_;
};

// The registry /metrics serves.
Registry& Global();

// `{k="v",...}` with values escaped; "" for no labels.
std::string RenderLabels(const Labels& labels);

}  // namespace ember::metrics
