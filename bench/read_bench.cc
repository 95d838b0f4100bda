// read_bench: times read patterns over files, for bench/bench.sh. Not a test.
//
//   read_bench seq FILE drop|keep              1 MiB sequential reads of FILE; prints MiB/s
//   read_bench small LIST WORKERS SEED drop|keep
//                                              open-read-close every path in LIST (one per line)
//                                              in random order with WORKERS threads; prints files/s
//   read_bench drop PATH...                    drops the page cache of files (dirs recursively)
//   read_bench gen FILE SIZE SEED              writes SIZE pseudo-random bytes to FILE
//   read_bench tree DIR DIRS FILES SIZE        writes DIRS folders of FILES files of SIZE bytes
//   read_bench stat LIST                       stat()s every path in LIST; prints files/s
//   read_bench store LIST WORKERS SEED DIR files|mib
//                                              a cache fill without FUSE: reads every file of
//                                              LIST (shuffled by SEED unless 0) in 4 MiB chunks
//                                              and stores each chunk as a new file in DIR with
//                                              O_DIRECT behind a 64 MiB queue; prints files/s or
//                                              MiB/s. The ceiling for a cache whose origin and
//                                              cache share one disk
//   read_bench stall LIST SECONDS WORKERS      reads whole files of LIST (page cache dropped
//                                              first) for SECONDS; prints reads, failed reads
//                                              and the longest read in ms
//
// With `drop`, the page cache of the files is dropped first (not timed), so a FUSE mount's
// daemon is measured rather than the kernel's cache of the mount; `keep` measures warm files.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

void Drop(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int Gen(const std::string& file, uint64_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> buf(1 << 17);
  FILE* f = std::fopen(file.c_str(), "wb");
  if (f == nullptr) {
    std::perror(file.c_str());
    return 1;
  }
  while (size > 0) {
    for (auto& v : buf) v = rng();
    size_t n = std::min<uint64_t>(size, buf.size() * 8);
    std::fwrite(buf.data(), 1, n, f);
    size -= n;
  }
  std::fclose(f);
  return 0;
}

// The non-empty lines of a file: one path each.
std::vector<std::string> ReadList(const std::string& list) {
  std::vector<std::string> paths;
  std::ifstream in(list);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) paths.push_back(line);
  }
  return paths;
}

int Seq(const std::string& file, bool drop) {
  if (drop) Drop(file);
  std::vector<char> buf(1 << 20);
  int fd = open(file.c_str(), O_RDONLY);
  if (fd < 0) {
    std::perror(file.c_str());
    return 1;
  }
  auto start = std::chrono::steady_clock::now();
  uint64_t total = 0;
  ssize_t n;
  while ((n = read(fd, buf.data(), buf.size())) > 0) total += static_cast<uint64_t>(n);
  double s = Seconds(start);
  close(fd);
  if (n < 0) {
    std::perror("read");
    return 1;
  }
  std::printf("%.1f\n", total / 1048576.0 / s);
  return 0;
}

int Small(const std::string& list, int workers, unsigned seed, bool drop) {
  std::vector<std::string> paths = ReadList(list);
  if (drop) {
    for (const auto& p : paths) Drop(p);
  }
  std::shuffle(paths.begin(), paths.end(), std::mt19937(seed));
  std::atomic<size_t> next{0};
  std::atomic<int> errors{0};
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; w++) {
    threads.emplace_back([&] {
      std::vector<char> buf(256 << 10);
      for (size_t i; (i = next++) < paths.size();) {
        int fd = open(paths[i].c_str(), O_RDONLY);
        if (fd < 0) {
          errors++;
          continue;
        }
        while (read(fd, buf.data(), buf.size()) > 0) {
        }
        close(fd);
      }
    });
  }
  for (auto& t : threads) t.join();
  double s = Seconds(start);
  if (errors > 0) {
    std::fprintf(stderr, "%d files could not be opened\n", errors.load());
    return 1;
  }
  std::printf("%.0f\n", paths.size() / s);
  return 0;
}

// Reads every file of LIST in 4 MiB chunks with WORKERS reader threads; WORKERS writer threads
// store each chunk as a new file in DIR with O_DIRECT, behind a queue of at most 64 MiB (as the
// agent's write-behind queue), so reads and writes overlap.
int Store(const std::string& list, int workers, unsigned seed, const std::string& dir, bool mib) {
  constexpr size_t kChunk = 4 << 20;
  constexpr size_t kQueued = 16;  // chunks: 64 MiB
  std::vector<std::string> paths = ReadList(list);
  if (seed != 0) std::shuffle(paths.begin(), paths.end(), std::mt19937(seed));
  std::filesystem::create_directories(dir);
  struct Chunk {
    char* buf;
    size_t len;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char*> free_bufs;
  std::deque<Chunk> queue;
  int readers_left = workers;
  for (size_t i = 0; i < kQueued + static_cast<size_t>(workers) * 2; i++) {
    void* mem = nullptr;
    if (posix_memalign(&mem, 4096, kChunk) != 0) return 1;
    free_bufs.push_back(static_cast<char*>(mem));
  }
  std::vector<char*> all_bufs = free_bufs;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0}, chunks{0};
  std::atomic<int> errors{0};
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; w++) {
    threads.emplace_back([&] {  // reader
      for (size_t i; (i = next++) < paths.size();) {
        int fd = open(paths[i].c_str(), O_RDONLY);
        if (fd < 0) {
          errors++;
          continue;
        }
        for (off_t off = 0;; off += static_cast<off_t>(kChunk)) {
          char* buf;
          {
            std::unique_lock lock(mu);
            cv.wait(lock, [&] { return !free_bufs.empty() && queue.size() < kQueued; });
            buf = free_bufs.back();
            free_bufs.pop_back();
          }
          ssize_t n = pread(fd, buf, kChunk, off);
          std::lock_guard lock(mu);
          if (n <= 0) {
            if (n < 0) errors++;
            free_bufs.push_back(buf);
            cv.notify_all();
            break;
          }
          queue.push_back(Chunk{buf, static_cast<size_t>(n)});
          cv.notify_all();
        }
        close(fd);
      }
      std::lock_guard lock(mu);
      readers_left--;
      cv.notify_all();
    });
  }
  for (int w = 0; w < workers; w++) {
    threads.emplace_back([&] {  // writer
      for (;;) {
        Chunk c;
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return !queue.empty() || readers_left == 0; });
          if (queue.empty()) return;
          c = queue.front();
          queue.pop_front();
        }
        std::string out = dir + "/" + std::to_string(chunks++);
        int wfd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
        if (wfd < 0 && errno == EINVAL) wfd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        size_t aligned = (c.len + 4095) & ~size_t{4095};
        if (wfd < 0 || pwrite(wfd, c.buf, aligned, 0) != static_cast<ssize_t>(aligned) ||
            ftruncate(wfd, static_cast<off_t>(c.len)) != 0) {
          errors++;
        }
        if (wfd >= 0) close(wfd);
        bytes += c.len;
        std::lock_guard lock(mu);
        free_bufs.push_back(c.buf);
        cv.notify_all();
      }
    });
  }
  for (auto& t : threads) t.join();
  double s = Seconds(start);
  for (char* b : all_bufs) std::free(b);
  if (errors > 0) {
    std::fprintf(stderr, "store: %d reads or writes failed\n", errors.load());
    return 1;
  }
  if (mib) {
    std::printf("%.1f\n", bytes / 1048576.0 / s);
  } else {
    std::printf("%.0f\n", paths.size() / s);
  }
  return 0;
}

int Tree(const std::string& dir, int dirs, int files, uint64_t size) {
  for (int d = 0; d < dirs; d++) {
    char name[32];
    std::snprintf(name, sizeof(name), "/d%04d", d);
    std::string sub = dir + name;
    std::filesystem::create_directories(sub);
    for (int f = 0; f < files; f++) {
      std::snprintf(name, sizeof(name), "/f%05d.jpg", f);
      if (Gen(sub + name, size, static_cast<uint64_t>(d) * 100000 + f + 1) != 0) return 1;
    }
  }
  return 0;
}

int Stat(const std::string& list) {
  std::vector<std::string> paths = ReadList(list);
  auto start = std::chrono::steady_clock::now();
  for (const auto& p : paths) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0) {
      std::perror(p.c_str());
      return 1;
    }
  }
  std::printf("%.0f\n", paths.size() / Seconds(start));
  return 0;
}

int Stall(const std::string& list, double seconds, int workers) {
  std::vector<std::string> paths = ReadList(list);
  if (paths.empty()) return 1;
  std::atomic<uint64_t> reads{0}, failed{0}, max_us{0};
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; w++) {
    threads.emplace_back([&, w] {
      std::vector<char> buf(256 << 10);
      for (size_t i = static_cast<size_t>(w); std::chrono::steady_clock::now() < end; i++) {
        const std::string& p = paths[i % paths.size()];
        auto t0 = std::chrono::steady_clock::now();
        int fd = open(p.c_str(), O_RDONLY);
        bool ok = fd >= 0;
        if (ok) {
          posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
          ssize_t n;
          while ((n = read(fd, buf.data(), buf.size())) > 0) {
          }
          ok = n == 0;
          close(fd);
        }
        uint64_t us = static_cast<uint64_t>(Seconds(t0) * 1e6);
        uint64_t prev = max_us.load();
        while (us > prev && !max_us.compare_exchange_weak(prev, us)) {
        }
        reads++;
        if (!ok) failed++;
      }
    });
  }
  for (auto& t : threads) t.join();
  std::printf("%llu %llu %.1f\n", static_cast<unsigned long long>(reads.load()),
              static_cast<unsigned long long>(failed.load()), max_us.load() / 1000.0);
  return failed > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "seq" && argc == 4) return Seq(argv[2], std::string(argv[3]) == "drop");
  if (mode == "small" && argc == 6) {
    return Small(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::string(argv[5]) == "drop");
  }
  if (mode == "gen" && argc == 5) {
    return Gen(argv[2], std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10));
  }
  if (mode == "tree" && argc == 6) {
    return Tree(argv[2], std::atoi(argv[3]), std::atoi(argv[4]),
                std::strtoull(argv[5], nullptr, 10));
  }
  if (mode == "store" && argc == 7) {
    return Store(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), argv[5],
                 std::string(argv[6]) == "mib");
  }
  if (mode == "stat" && argc == 3) return Stat(argv[2]);
  if (mode == "stall" && argc == 5) return Stall(argv[2], std::atof(argv[3]), std::atoi(argv[4]));
  if (mode == "drop" && argc >= 3) {
    for (int i = 2; i < argc; i++) {
      if (std::filesystem::is_directory(argv[i])) {
        for (auto& e : std::filesystem::recursive_directory_iterator(argv[i])) {
          if (e.is_regular_file()) Drop(e.path());
        }
      } else {
        Drop(argv[i]);
      }
    }
    return 0;
  }
  std::fprintf(stderr,
               "usage: read_bench seq FILE drop|keep | small LIST WORKERS SEED drop|keep | "
               "drop PATH... | gen FILE SIZE SEED | tree DIR DIRS FILES SIZE | stat LIST | "
               "store LIST WORKERS SEED DIR files|mib | stall LIST SECONDS WORKERS\n");
  return 2;
}
