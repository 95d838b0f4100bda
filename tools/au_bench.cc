#include "tools/au_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ember::tools::au {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

const std::vector<Workload>& Workloads() {
  static const std::vector<Workload> kAll = {
      {"unet3d", 1, 146'600'628, 68'341'808, 7, microseconds(323'000), microseconds(636'000), 4,
       0.90},
      {"resnet50", 1251, 114'660, 0, 400, microseconds(224'000), microseconds(435'000), 8, 0.90},
      {"cosmoflow", 1, 2'828'486, 71'311, 1, microseconds(3'500), microseconds(5'510), 4, 0.70},
  };
  return kAll;
}

absl::Status Errno(const std::string& what, const std::string& path, int err) {
  return absl::UnavailableError(absl::StrCat("cannot ", what, " ", path, ": ", strerror(err)));
}

// One accelerator's epoch: its batches read by its reader threads (each batch by one reader,
// PyTorch-style, at most two per reader ahead of the one being computed on) while this thread
// waits for each batch in turn and then spends the compute time on it.
struct Accelerator {
  std::vector<std::vector<const Sample*>> batches;
  std::mutex mu;
  std::condition_variable cv;
  size_t next = 0;      // next batch a reader takes
  size_t consumed = 0;  // batches taken by the accelerator
  std::vector<bool> ready;
  absl::Status error;
  microseconds computed{0};
  Clock::time_point end;
};

}  // namespace

absl::StatusOr<Workload> FindWorkload(const std::string& name) {
  std::string known;
  for (const Workload& w : Workloads()) {
    if (w.name == name) return w;
    absl::StrAppend(&known, known.empty() ? "" : ", ", w.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown workload '", name, "' (known: ", known, ")"));
}

absl::StatusOr<microseconds> ComputeTime(const Workload& w, const std::string& accelerator) {
  if (accelerator == "h100") return w.compute_h100;
  if (accelerator == "a100") return w.compute_a100;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown accelerator '", accelerator, "' (known: h100, a100)"));
}

absl::StatusOr<uint64_t> Generate(const Workload& w, const std::string& dir, uint64_t bytes,
                                  uint64_t seed,
                                  const std::function<void(uint64_t, uint64_t)>& progress) {
  namespace fs = std::filesystem;
  const std::string train = dir + "/train";
  std::error_code ec;
  fs::create_directories(train, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", train, ": ", ec.message()));
  const uint64_t mean_file = w.sample_bytes * w.samples_per_file;
  const uint64_t files = std::max<uint64_t>(1, bytes / mean_file);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> size(static_cast<double>(w.sample_bytes),
                                        static_cast<double>(w.sample_bytes_stdev));
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (uint64_t i = 0; i < files; i++) {
    uint64_t s = mean_file;
    if (w.samples_per_file == 1 && w.sample_bytes_stdev > 0) {
      s = static_cast<uint64_t>(std::clamp(size(rng), static_cast<double>(w.sample_bytes) / 8,
                                           static_cast<double>(w.sample_bytes) * 4));
    }
    sizes.push_back(s);
    total += s;
  }
  // Incompressible bytes, the same buffer for every file (each starts with its own number).
  std::string buf(4 << 20, '\0');
  for (size_t i = 0; i + 8 <= buf.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(buf.data() + i, &v, 8);
  }
  uint64_t done = 0;
  for (uint64_t i = 0; i < files; i++) {
    const std::string path = absl::StrFormat("%s/img_%07d_of_%07d.%s", train, i + 1, files,
                                             w.samples_per_file > 1 ? "tfrecord" : "npz");
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("create", path, errno);
    std::memcpy(buf.data(), &i, sizeof(i));
    uint64_t left = sizes[i];
    while (left > 0) {
      const ssize_t n = write(fd, buf.data(), std::min<uint64_t>(left, buf.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;
        close(fd);
        return Errno("write", path, err);
      }
      left -= static_cast<uint64_t>(n);
      done += static_cast<uint64_t>(n);
    }
    if (close(fd) != 0) return Errno("write", path, errno);
    if (progress) progress(done, total);
  }
  return total;
}

namespace {
// A reader thread's open file: records of one file are read through one open, as a streaming
// record reader (TFRecordDataset) does; whole-file samples open their file once anyway.
struct OpenFile {
  std::string path;
  int fd = -1;
  ~OpenFile() { Close(); }
  void Close() {
    if (fd >= 0) close(fd);
    fd = -1;
    path.clear();
  }
};
}  // namespace

absl::Status ReadFile(const std::string& path, uint64_t offset, uint64_t length) {
  // Not zeroed: a reader thread (216 of them at 27 resnet50 accelerators, new each epoch) would
  // otherwise write 4 MiB it mostly never reads into (records are 112 KB): ~0.9 GB of page
  // faults and memset per epoch, CPU a real loader does not spend.
  constexpr size_t kBuf = 4 << 20;
  thread_local std::unique_ptr<char[]> buf(new char[kBuf]);
  thread_local OpenFile file;
  if (file.path != path) {
    file.Close();
    file.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (file.fd < 0) return Errno("open", path, errno);
    file.path = path;
  }
  uint64_t at = offset;
  for (;;) {
    const uint64_t want = length == 0 ? kBuf : std::min<uint64_t>(kBuf, offset + length - at);
    if (want == 0) break;
    const ssize_t n = pread(file.fd, buf.get(), want, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      file.Close();
      return Errno("read", path, err);
    }
    if (n == 0) {
      if (length == 0) break;
      file.Close();
      return absl::DataLossError(absl::StrCat(path, " ends before byte ", offset + length));
    }
    at += static_cast<uint64_t>(n);
  }
  if (length == 0) file.Close();  // a whole file is read once
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Sample>> ListSamples(const Workload& w, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string train = dir + "/train";
  std::error_code ec;
  std::map<std::string, uint64_t> files;
  for (fs::directory_iterator it(train, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) files[it->path().string()] = it->file_size(ec);
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", train, ": ", ec.message()));
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no files in ", train, " (make them with `ember bench au generate`)"));
  }
  std::vector<Sample> out;
  for (const auto& [path, size] : files) {
    if (w.samples_per_file <= 1) {
      out.push_back({path, 0, 0, size});
      continue;
    }
    for (uint64_t off = 0; off + w.sample_bytes <= size; off += w.sample_bytes) {
      out.push_back({path, off, w.sample_bytes, w.sample_bytes});
    }
  }
  return out;
}

absl::StatusOr<RunResult> Run(const std::vector<Sample>& samples, const RunOptions& o,
                              const ReadFn& read) {
  if (o.accelerators == 0 || o.epochs == 0 || o.batch == 0 || o.readers == 0) {
    return absl::InvalidArgumentError("accelerators, epochs, batch and readers must be >= 1");
  }
  if (samples.empty()) return absl::InvalidArgumentError("no samples to read");
  // Files (and a file's records, in order) are shuffled per epoch; each accelerator takes every
  // n-th.
  std::map<std::string, std::vector<const Sample*>> by_file;
  for (const Sample& s : samples) by_file[s.path].push_back(&s);
  std::vector<const std::vector<const Sample*>*> files;
  for (const auto& [path, list] : by_file) files.push_back(&list);

  RunResult result;
  microseconds computed_all{0};
  double wall_all = 0;
  for (uint32_t epoch = 0; epoch < o.epochs; epoch++) {
    std::mt19937_64 rng(o.seed * 1'000'003 + epoch);
    std::shuffle(files.begin(), files.end(), rng);
    std::vector<const Sample*> order;
    for (const auto* f : files) order.insert(order.end(), f->begin(), f->end());
    std::vector<std::unique_ptr<Accelerator>> accs;
    for (uint32_t a = 0; a < o.accelerators; a++) accs.push_back(std::make_unique<Accelerator>());
    std::vector<std::vector<const Sample*>> shard(o.accelerators);
    for (size_t i = 0; i < order.size(); i++) shard[i % o.accelerators].push_back(order[i]);
    for (uint32_t a = 0; a < o.accelerators; a++) {
      for (size_t i = 0; i < shard[a].size(); i += o.batch) {
        accs[a]->batches.emplace_back(
            shard[a].begin() + static_cast<long>(i),
            shard[a].begin() + static_cast<long>(std::min(shard[a].size(), i + o.batch)));
      }
      accs[a]->ready.assign(accs[a]->batches.size(), false);
    }
    const size_t ahead = static_cast<size_t>(o.readers) * 2;
    const Clock::time_point start = Clock::now();
    std::vector<std::thread> threads;
    for (auto& acc_ptr : accs) {
      Accelerator* acc = acc_ptr.get();
      for (uint32_t r = 0; r < o.readers; r++) {
        threads.emplace_back([acc, ahead, &read] {
          for (;;) {
            size_t b;
            {
              std::unique_lock lock(acc->mu);
              acc->cv.wait(lock, [&] {
                return acc->next >= acc->batches.size() || !acc->error.ok() ||
                       acc->next < acc->consumed + ahead;
              });
              if (acc->next >= acc->batches.size() || !acc->error.ok()) return;
              b = acc->next++;
            }
            absl::Status st;
            for (const Sample* s : acc->batches[b]) {
              st = read(s->path, s->offset, s->length);
              if (!st.ok()) break;
            }
            std::lock_guard lock(acc->mu);
            if (!st.ok() && acc->error.ok()) acc->error = st;
            acc->ready[b] = true;
            acc->cv.notify_all();
          }
        });
      }
      threads.emplace_back([acc, compute = o.compute] {
        for (size_t b = 0; b < acc->batches.size(); b++) {
          {
            std::unique_lock lock(acc->mu);
            acc->cv.wait(lock, [&] { return acc->ready[b] || !acc->error.ok(); });
            if (!acc->error.ok()) break;
            acc->consumed = b + 1;
            acc->cv.notify_all();
          }
          std::this_thread::sleep_for(compute);  // the accelerator's work on the batch
          acc->computed += compute;
        }
        acc->end = Clock::now();
      });
    }
    for (auto& t : threads) t.join();
    EpochResult er;
    er.min_au = 1;
    Clock::time_point last = start;
    for (const auto& acc : accs) {
      if (!acc->error.ok()) return acc->error;
      const double wall = std::chrono::duration<double>(acc->end - start).count();
      const double au =
          wall > 0 ? std::min(1.0, std::chrono::duration<double>(acc->computed).count() / wall) : 1;
      er.au += au / o.accelerators;
      er.min_au = std::min(er.min_au, au);
      last = std::max(last, acc->end);
      computed_all += acc->computed;
      wall_all += wall;
      for (const auto& batch : acc->batches) {
        for (const Sample* s : batch) {
          er.samples++;
          er.bytes += s->bytes;
        }
      }
    }
    er.seconds = std::chrono::duration<double>(last - start).count();
    if (o.on_epoch) o.on_epoch(epoch + 1, er.au, er.seconds);
    result.samples_per_second += static_cast<double>(er.samples);
    result.bytes_per_second += static_cast<double>(er.bytes);
    result.epochs.push_back(er);
  }
  double seconds = 0;
  for (const auto& e : result.epochs) seconds += e.seconds;
  result.au = wall_all > 0
                  ? std::min(1.0, std::chrono::duration<double>(computed_all).count() / wall_all)
                  : 1;
  if (seconds > 0) {
    result.samples_per_second /= seconds;
    result.bytes_per_second /= seconds;
  }
  return result;
}

absl::StatusOr<uint32_t> FindMax(const std::vector<Sample>& samples, RunOptions options,
                                 double threshold, const ReadFn& read,
                                 const std::function<void(uint32_t, double)>& tried) {
  auto passes = [&](uint32_t n) -> absl::StatusOr<bool> {
    options.accelerators = n;
    auto r = Run(samples, options, read);
    if (!r.ok()) return r.status();
    if (tried) tried(n, r->au);
    return r->au >= threshold;
  };
  // No more accelerators than there are batches: one without a batch measures nothing.
  const uint32_t most = static_cast<uint32_t>(
      std::max<size_t>(1, samples.size() / std::max<uint32_t>(1, options.batch)));
  uint32_t lo = 0, hi = 0;  // lo passes (0: none known), hi fails (0: none known)
  for (uint32_t n = 1;; n *= 2) {
    n = std::min(n, most);
    auto ok = passes(n);
    if (!ok.ok()) return ok.status();
    if (!*ok) {
      hi = n;
      break;
    }
    lo = n;
    if (n == most) return n;
  }
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    auto ok = passes(mid);
    if (!ok.ok()) return ok.status();
    (*ok ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace ember::tools::au
