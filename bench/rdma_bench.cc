// rdma_bench: the RDMA transport's own cost per block, on the fake device, beside TCP on
// loopback (issue #25). Not a test. Usage: rdma_bench FILE [ROUNDS] [--json]
//
// FILE (warm in the page cache; 256 MiB is plenty) is served as blocks by a real block server on
// 127.0.0.2 and fetched by a real client on 127.0.0.1, every block ROUNDS times, with 1 and with 4
// concurrent fetchers, at 4 MiB and at 64 KiB per fetch:
//   tcp          the TCP transport (sendfile on the server, receive + hash on the client);
//   rdma (fake)  the RDMA transport on the fake device: the same TCP control channel, sessions,
//                registered buffer pools and completion handling; the fake's "NIC" is a memcpy
//                done on the server's thread;
//   copies alone the bytes work the RDMA path does on this CPU with no transport at all: the
//                server's pread into its buffer, the fake NIC's copy, the client's copy + hash.
// The RDMA transport's own cost per block is (rdma - copies alone); on a real NIC the middle
// copy is the NIC's and costs no CPU.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ids.h"
#include "transport/block_transport.h"
#include "transport/rdma/fake_verbs.h"
#include "transport/rdma/rdma.h"
#include "transport/tcp_transport.h"

using namespace ember;
using namespace ember::transport;

namespace {

class FileSource : public BlockSource {
 public:
  FileSource(int fd, uint32_t block) : fd_(fd), block_(block) {}
  std::optional<Block> Get(const BlockAddr& a) override {
    Block b;
    b.fd = fd_;
    b.offset = a.index * block_;
    b.length = block_;
    b.checksum = 0;
    return b;
  }

 private:
  int fd_;
  uint32_t block_;
};

struct Result {
  double mib_s = 0;
  double us_per_block = 0;
};

// Fetches every block `rounds` times over `streams` threads. Returns throughput and the mean
// wall time per block per stream.
Result Run(BlockTransport& t, const std::string& peer, uint64_t blocks, uint32_t block, int rounds,
           int streams) {
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  const uint64_t total = blocks * rounds;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; s++) {
    threads.emplace_back([&] {
      std::vector<char> buf(block);
      for (uint64_t i; (i = next++) < total;) {
        FetchInfo info;
        if (!t.Fetch(peer, {1, 1, 1, i % blocks}, 0, block, buf.data(), &info).ok()) failed = true;
      }
    });
  }
  for (auto& th : threads) th.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (failed) std::fprintf(stderr, "rdma_bench: a fetch failed\n");
  Result r;
  r.mib_s = total * static_cast<double>(block) / (1 << 20) / secs;
  r.us_per_block = secs * 1e6 * streams / total;
  return r;
}

// The copies the fake RDMA path makes per block, with no transport.
Result Copies(int fd, uint64_t blocks, uint32_t block, int rounds) {
  std::vector<char> a(block), b(block), c(block);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t sink = 0;
  for (int r = 0; r < rounds; r++) {
    for (uint64_t i = 0; i < blocks; i++) {
      if (pread(fd, a.data(), block, static_cast<off_t>(i * block)) != block) return {};
      std::memcpy(b.data(), a.data(), block);  // the NIC
      BlockChecksummer sum;
      for (uint32_t d = 0; d < block; d += BlockChecksummer::kPiece) {
        uint32_t n = std::min<uint32_t>(BlockChecksummer::kPiece, block - d);
        std::memcpy(c.data() + d, b.data() + d, n);
        sum.Update(c.data() + d, n);
      }
      sink += sum.Digest();
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sink == 42) std::puts("");
  Result res;
  res.mib_s = blocks * rounds * static_cast<double>(block) / (1 << 20) / secs;
  res.us_per_block = secs * 1e6 / (blocks * rounds);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: rdma_bench FILE [ROUNDS] [--json]\n");
    return 2;
  }
  const std::string file = argv[1];
  int rounds = 3;
  bool json = false;
  for (int i = 2; i < argc; i++) {
    if (std::string(argv[i]) == "--json") {
      json = true;
    } else {
      rounds = std::atoi(argv[i]);
    }
  }
  int fd = open(file.c_str(), O_RDONLY);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) {
    std::perror(file.c_str());
    return 1;
  }
  TransportOptions o;
  o.token = "bench";
  o.io_timeout = std::chrono::seconds(10);

  std::vector<std::string> rows;
  for (uint32_t block : {4u << 20, 64u << 10}) {
    const uint64_t blocks = std::min<uint64_t>(st.st_size / block, block >= (1 << 20) ? 64 : 4096);
    FileSource source(fd, block);
    // TCP.
    auto tcp_server = StartTcpBlockServer("127.0.0.2:0", &source, o, nullptr);
    // RDMA on the fake device.
    auto fabric = FakeFabric::Create(/*routed=*/false);
    fabric->SetCheckSources(false);
    FakeHostConfig sc;
    sc.device = "srv0";
    sc.gids = MlxStyleGidTable("127.0.0.2");
    sc.latency = std::chrono::microseconds(0);
    FakeHostConfig cc = sc;
    cc.device = "cli0";
    cc.gids = MlxStyleGidTable("127.0.0.1");
    std::string why;
    auto server_hub = NewRdmaHub(fabric->AddHost(sc), o, &why);
    auto client_hub = NewRdmaHub(fabric->AddHost(cc), o, &why);
    auto rdma_server = StartTcpBlockServer("127.0.0.2:0", &source, o, NewRdmaResponder(server_hub));
    if (!tcp_server.ok() || !rdma_server.ok() || !server_hub || !client_hub) {
      std::fprintf(stderr, "rdma_bench: setup failed: %s\n", why.c_str());
      return 1;
    }
    auto tcp = NewTcpTransport(o);
    auto rdma = NewRdmaTransport(client_hub, o);
    const std::string tcp_peer = absl::StrCat("127.0.0.2:", (*tcp_server)->port());
    const std::string rdma_peer = absl::StrCat("127.0.0.2:", (*rdma_server)->port());
    Run(*tcp, tcp_peer, blocks, block, 1, 1);  // warm: connections, sessions, buffers
    Run(*rdma, rdma_peer, blocks, block, 1, 4);
    for (int streams : {1, 4}) {
      Result t, r;
      // Interleaved, best of `rounds` single passes each.
      for (int i = 0; i < rounds; i++) {
        Result a = Run(*tcp, tcp_peer, blocks, block, 1, streams);
        Result b = Run(*rdma, rdma_peer, blocks, block, 1, streams);
        if (a.mib_s > t.mib_s) t = a;
        if (b.mib_s > r.mib_s) r = b;
      }
      Result c = Copies(fd, blocks, block, 1);
      for (int i = 1; i < rounds; i++) {
        Result x = Copies(fd, blocks, block, 1);
        if (x.mib_s > c.mib_s) c = x;
      }
      const std::string size = block >= (1 << 20) ? absl::StrCat(block >> 20, " MiB")
                                                  : absl::StrCat(block >> 10, " KiB");
      if (json) {
        rows.push_back(absl::StrCat(
            "{\"block\":", block, ",\"streams\":", streams, ",\"tcp_mib_s\":", t.mib_s,
            ",\"tcp_us_per_block\":", t.us_per_block, ",\"rdma_fake_mib_s\":", r.mib_s,
            ",\"rdma_fake_us_per_block\":", r.us_per_block,
            ",\"copies_us_per_block\":", c.us_per_block, ",\"rdma_own_us_per_block\":",
            streams == 1 ? absl::StrCat(r.us_per_block - c.us_per_block) : "null", "}"));
      } else {
        // Per-block costs only mean something with one fetcher (more share the cores).
        rows.push_back(
            streams == 1
                ? absl::StrFormat(
                      "| %s | %d | %.0f MiB/s, %.0f us | %.0f MiB/s, %.0f us | %.0f us | %.0f us |",
                      size, streams, t.mib_s, t.us_per_block, r.mib_s, r.us_per_block,
                      c.us_per_block, r.us_per_block - c.us_per_block)
                : absl::StrFormat("| %s | %d | %.0f MiB/s | %.0f MiB/s | | |", size, streams,
                                  t.mib_s, r.mib_s));
      }
    }
    auto hs = GetRdmaHubStats(*client_hub);
    std::fprintf(
        stderr, "rdma_bench: %u-byte blocks: %lu sessions, %lu registrations, %lu TCP fallbacks\n",
        block, static_cast<unsigned long>(hs.sessions_opened),
        static_cast<unsigned long>(hs.registrations), static_cast<unsigned long>(hs.tcp_fallbacks));
  }
  if (json) {
    std::printf("[");
    for (size_t i = 0; i < rows.size(); i++) std::printf("%s%s", i ? "," : "", rows[i].c_str());
    std::printf("]\n");
  } else {
    std::printf(
        "| block | fetchers | TCP (loopback) | RDMA transport, fake device | copies alone | RDMA's "
        "own cost per block |\n");
    std::printf("| --- | --- | --- | --- | --- | --- |\n");
    for (const auto& r : rows) std::printf("%s\n", r.c_str());
  }
  close(fd);
  return 0;
}
