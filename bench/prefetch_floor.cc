// prefetch_floor: the least work a swarm prefetch of a dataset to NODES nodes does, with no Ember
// in it, so the prefetch case of bench_small.sh has a ceiling for the same work beside the
// O_DIRECT appenders (which only write). Not a test.
//
//   prefetch_floor LIST NODES OUTDIR
//
// Node k (threads of this process, its sockets on 127.0.0.(2+k)) reads the files i % NODES == k
// of LIST (opened, sized, read and closed 32 at a time as Ember does, each origin file read once,
// from wherever it is now), packs them
// end to end into 2 MiB buffers, appends each buffer to its own file OUTDIR/floor.k with
// O_DIRECT and sends it over loopback TCP to every other node, which appends what it receives
// the same way. Nothing is checked, indexed, located or recorded; one reader thread per node.
// Prints the seconds until every node's writes have returned (the appenders' measure: O_DIRECT,
// no sync), then, on stderr, the CPU-seconds the process took.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/batch_read.h"

namespace {

constexpr size_t kBuf = 2u << 20;
constexpr size_t kBatch = 32;  // origin files read at once (Ember's ReadPath::kSmallBatch)
constexpr size_t kAlign = 4096;

struct Free {
  void operator()(char* p) const { std::free(p); }
};
using Buf = std::unique_ptr<char, Free>;

Buf NewBuf() {
  void* p = nullptr;
  if (posix_memalign(&p, kAlign, kBuf) != 0) std::abort();
  return Buf(static_cast<char*>(p));
}

void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

// One node's disk: buffers appended in turn with O_DIRECT, at most 8 queued.
class Appender {
 public:
  explicit Appender(const std::string& path) {
    fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd_ < 0) Die(path.c_str());
    thread_ = std::thread([this] { Run(); });
  }
  ~Appender() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ending_ = true;
    }
    cv_.notify_all();
    thread_.join();
    close(fd_);
  }
  void Put(Buf b, size_t len) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return q_.size() < 8; });
    q_.push_back({std::move(b), len});
    cv_.notify_all();
  }

 private:
  void Run() {
    uint64_t at = 0;
    while (true) {
      std::pair<Buf, size_t> w;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return ending_ || !q_.empty(); });
        if (q_.empty()) return;
        w = std::move(q_.front());
        q_.pop_front();
      }
      cv_.notify_all();
      const size_t len = (w.second + kAlign - 1) / kAlign * kAlign;
      std::memset(w.first.get() + w.second, 0, len - w.second);
      if (pwrite(fd_, w.first.get(), len, static_cast<off_t>(at)) != static_cast<ssize_t>(len)) {
        Die("pwrite");
      }
      at += len;
    }
  }
  int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Buf, size_t>> q_;
  bool ending_ = false;
  std::thread thread_;
};

bool SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t k = recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

sockaddr_in Addr(int node, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(0x7f000002u + static_cast<uint32_t>(node));
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: prefetch_floor LIST NODES OUTDIR\n");
    return 2;
  }
  std::vector<std::string> paths;
  {
    std::ifstream in(argv[1]);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) paths.push_back(line);
    }
  }
  const int n = std::atoi(argv[2]);
  const std::string dir = argv[3];
  if (n < 1 || n > 16) return 2;
  // Every node listens (on a port the kernel picks); node k connects to every other: out[k][j]
  // sends k -> j, in[j][k] receives it.
  std::vector<int> listeners(n);
  std::vector<uint16_t> ports(n);
  for (int k = 0; k < n; k++) {
    listeners[k] = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Addr(k, 0);
    if (bind(listeners[k], reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) Die("bind");
    if (listen(listeners[k], 16) != 0) Die("listen");
    socklen_t len = sizeof(a);
    if (getsockname(listeners[k], reinterpret_cast<sockaddr*>(&a), &len) != 0) Die("getsockname");
    ports[k] = ntohs(a.sin_port);
  }
  std::vector<std::vector<int>> out(n, std::vector<int>(n, -1)), in(n, std::vector<int>(n, -1));
  for (int k = 0; k < n; k++) {
    for (int j = 0; j < n; j++) {
      if (j == k) continue;
      int s = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a = Addr(j, ports[j]);
      if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) Die("connect");
      out[k][j] = s;
      in[j][k] = accept(listeners[j], nullptr, nullptr);
      if (in[j][k] < 0) Die("accept");
      uint32_t from = static_cast<uint32_t>(k);  // which sender this is, checked below
      if (!SendAll(s, reinterpret_cast<char*>(&from), 4)) Die("send");
      uint32_t got = 0;
      if (!RecvAll(in[j][k], reinterpret_cast<char*>(&got), 4) || got != from) Die("recv");
    }
  }

  const auto start = std::chrono::steady_clock::now();
  {
    std::vector<std::unique_ptr<Appender>> disks;
    for (int k = 0; k < n; k++) {
      disks.push_back(std::make_unique<Appender>(dir + "/floor." + std::to_string(k)));
    }
    std::vector<std::thread> threads;
    for (int k = 0; k < n; k++) {
      for (int j = 0; j < n; j++) {
        if (j == k) continue;
        threads.emplace_back([&, k, j] {  // node j receiving from k
          while (true) {
            uint32_t len = 0;
            if (!RecvAll(in[j][k], reinterpret_cast<char*>(&len), 4)) Die("recv");
            if (len == 0) return;
            Buf b = NewBuf();
            if (len > kBuf || !RecvAll(in[j][k], b.get(), len)) Die("recv");
            disks[j]->Put(std::move(b), len);
          }
        });
      }
      threads.emplace_back([&, k] {  // node k reading its share of the origin
        Buf b = NewBuf();
        size_t used = 0;
        auto flush = [&] {
          const uint32_t len = static_cast<uint32_t>(used);
          for (int j = 0; j < n; j++) {
            if (j == k) continue;
            if (!SendAll(out[k][j], reinterpret_cast<const char*>(&len), 4) ||
                !SendAll(out[k][j], b.get(), used)) {
              Die("send");
            }
          }
          disks[k]->Put(std::move(b), used);
          b = NewBuf();
          used = 0;
        };
        // kBatch files at a time, as Ember's origin reads them: opened in one submission, each
        // sized (fstat), read in one submission, closed in one (common/batch_read.h). A file
        // larger than what is left of the buffer is read once the buffer has gone out.
        std::vector<size_t> mine;
        for (size_t i = static_cast<size_t>(k); i < paths.size(); i += static_cast<size_t>(n)) {
          mine.push_back(i);
        }
        std::vector<ember::PreadOp> reads;
        auto read_pending = [&] {
          ember::BatchPread(reads);
          for (const ember::PreadOp& r : reads) {
            if (r.result != static_cast<int64_t>(r.len)) Die("read");
          }
          reads.clear();
        };
        for (size_t at = 0; at < mine.size(); at += kBatch) {
          const size_t count = std::min(kBatch, mine.size() - at);
          std::vector<ember::OpenOp> opens(count);
          for (size_t j = 0; j < count; j++) {
            opens[j] = {.path = paths[mine[at + j]].c_str(), .flags = O_RDONLY | O_CLOEXEC};
          }
          ember::BatchOpen(opens);
          std::vector<int> fds;
          for (size_t j = 0; j < count; j++) {
            const int fd = opens[j].result;
            if (fd < 0) Die(paths[mine[at + j]].c_str());
            fds.push_back(fd);
            struct stat st;
            if (fstat(fd, &st) != 0) Die("fstat");
            size_t size = static_cast<size_t>(st.st_size), off = 0;
            while (size > 0) {
              if (used == kBuf) {
                read_pending();
                flush();
              }
              const size_t len = std::min(size, kBuf - used);
              reads.push_back({.fd = fd, .offset = off, .len = len, .buf = b.get() + used});
              used += len;
              off += len;
              size -= len;
            }
          }
          read_pending();
          ember::BatchClose(fds);
        }
        if (used > 0) flush();
        const uint32_t zero = 0;
        for (int j = 0; j < n; j++) {
          if (j != k && !SendAll(out[k][j], reinterpret_cast<const char*>(&zero), 4)) Die("send");
        }
      });
    }
    for (auto& t : threads) t.join();
  }  // the appenders drain their queues
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("%.2f\n", secs);
  std::fprintf(
      stderr, "prefetch_floor: %zu files to %d nodes in %.2f s, %.1f CPU-s\n", paths.size(), n,
      secs,
      ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
  for (int k = 0; k < n; k++) unlink((dir + "/floor." + std::to_string(k)).c_str());
  return 0;
}
