// peer_bench: peer fill goodput of the Ember TCP transport against a raw TCP stream of the same
// bytes over the same loopback, in one run (make bench). Not a test.
//
//   peer_bench FILE RUNS [STREAMS]
//
// FILE (warm in the page cache) is served as 4 MiB blocks by a real BlockServer; the client
// fetches every block in order into one buffer, as a node's fill does. The baseline sends the
// whole file with sendfile over a plain socket and receives it into a buffer of the same size.
// Runs are interleaved; prints medians, the ratio and the latency of one 4 MiB block fetch.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "transport/block_transport.h"
#include "transport/socket_util.h"

using namespace ember;
using namespace ember::transport;

namespace {

constexpr uint32_t kBlock = 4u << 20;

class FileSource : public BlockSource {
 public:
  FileSource(int fd, uint64_t size) : fd_(fd), size_(size) {}
  std::optional<Block> Get(const BlockAddr& a) override {
    uint64_t off = a.index * kBlock;
    if (off >= size_) return std::nullopt;
    uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(kBlock, size_ - off));
    return Block{nullptr, fd_, off, len, 0, nullptr};
  }

 private:
  int fd_;
  uint64_t size_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: peer_bench FILE RUNS [STREAMS]\n");
    return 2;
  }
  const int streams = argc == 4 ? std::atoi(argv[3]) : 1;
  int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    std::perror(argv[1]);
    return 1;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const int runs = std::atoi(argv[2]);
  // Both sides read FILE from the page cache: load it first (untimed), or the first Ember run
  // pays the disk (it runs first) and the spread says more about the disk than the transport.
  {
    std::vector<char> warm(kBlock);
    for (uint64_t off = 0; off < size;) {
      ssize_t n = pread(fd, warm.data(), warm.size(), static_cast<off_t>(off));
      if (n <= 0) break;
      off += static_cast<uint64_t>(n);
    }
  }

  FileSource source(fd, size);
  TransportOptions options;
  options.token = "bench";
  auto server = StartBlockServer("127.0.0.1:0", &source, options);
  if (!server.ok()) return 1;
  std::string peer = absl::StrCat("127.0.0.1:", (*server)->port());
  auto client = NewTcpTransport(options);

  // Raw TCP baseline: a listener that streams the whole file to each connection.
  int raw_port = 0;
  auto lfd = ListenTcp("127.0.0.1:0", &raw_port);
  if (!lfd.ok()) return 1;
  std::thread raw_server([&] {
    for (int i = 0; i < runs; i++) {
      int c = accept(*lfd, nullptr, nullptr);
      if (c < 0) return;
      (void)SendFileFull(c, fd, 0, size);
      close(c);
    }
  });

  std::vector<char> buf(kBlock);
  std::vector<double> ember_mibs, raw_mibs;
  const uint64_t blocks = (size + kBlock - 1) / kBlock;
  for (int r = 0; r < runs; r++) {
    auto t = std::chrono::steady_clock::now();
    // `streams` fills at once, as a node's reader plus its readahead threads do.
    std::atomic<uint64_t> next{0};
    std::atomic<int> failed{0};
    std::vector<std::thread> fillers;
    for (int k = 0; k < streams; k++) {
      fillers.emplace_back([&] {
        std::vector<char> mine(kBlock);
        for (uint64_t b; (b = next++) < blocks;) {
          uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(kBlock, size - b * kBlock));
          if (!client->Fetch(peer, {1, 1, 1, b}, 0, len, mine.data(), nullptr).ok()) failed++;
        }
      });
    }
    for (auto& f : fillers) f.join();
    if (failed > 0) {
      std::fprintf(stderr, "%d fetches failed\n", failed.load());
      return 1;
    }
    ember_mibs.push_back(size / 1048576.0 / Since(t));

    t = std::chrono::steady_clock::now();
    auto c = ConnectTcp(absl::StrCat("127.0.0.1:", raw_port), std::chrono::seconds(1),
                        std::chrono::seconds(10));
    if (!c.ok()) return 1;
    uint64_t got = 0;
    while (got < size) {
      ssize_t n = recv(*c, buf.data(), std::min<uint64_t>(buf.size(), size - got), 0);
      if (n <= 0) return 1;
      got += static_cast<uint64_t>(n);
    }
    close(*c);
    raw_mibs.push_back(size / 1048576.0 / Since(t));
  }
  raw_server.join();

  std::vector<double> lat_ms;
  for (int i = 0; i < 50; i++) {
    auto t = std::chrono::steady_clock::now();
    (void)client->Fetch(peer, {1, 1, 1, 0}, 0, kBlock, buf.data(), nullptr);
    lat_ms.push_back(Since(t) * 1000);
  }
  std::sort(lat_ms.begin(), lat_ms.end());
  double em = Median(ember_mibs), rm = Median(raw_mibs);
  std::printf(
      "| peer fill goodput, %.0f MiB in 4 MiB blocks, %d fill stream(s) (MiB/s) | %.0f | "
      "raw TCP, 1 stream: %.0f | %.2f |\n",
      size / 1048576.0, streams, em, rm, em / rm);
  std::printf("\nOne 4 MiB block fetch: median %.2f ms, p95 %.2f ms (50 fetches).\n",
              lat_ms[lat_ms.size() / 2], lat_ms[lat_ms.size() * 95 / 100]);
  std::printf("Raw: ember=[");
  for (double v : ember_mibs) std::printf("%.0f,", v);
  std::printf("] raw=[");
  for (double v : raw_mibs) std::printf("%.0f,", v);
  std::printf("]\n");
  (*server)->Stop();
  close(*lfd);
  return 0;
}
