// restore_floor: the least work a restore on a fresh node does, with no Ember in it, so the
// checkpoint restore case (bench_ckpt.sh) has a ceiling for the same work beside raw TCP and disk
// reads. Not a test.
//
//   restore_floor OUTDIR FILE...
//   restore_floor --touch MIB     touches MIB of new memory and frees it (see TouchFreeMemory)
//   restore_floor --zerocopy FILE sends FILE over loopback and receives it with
//                                 TCP_ZEROCOPY_RECEIVE: prints the share of bytes the kernel
//                                 mapped instead of copying (could a receiver skip its copy?)
//
// One stream per FILE, all at once, as a restore's readers are. A sender thread per stream
// sendfile()s its FILE over loopback TCP (the FILE's page cache dropped first with
// POSIX_FADV_DONTNEED: a peer reading its copy from disk). Four passes, each from a dropped page
// cache, print MiB/s of all streams together (the median of three runs of each, interleaved; on
// stderr each run, and the CPU-seconds per GiB the pass took, senders and receivers together):
//   tcp    the receiver recv()s into one reused 4 MiB buffer (peer_bench's raw TCP, cold source);
//   stream + each 4 MiB block checked (XXH3-64, as Ember does) and copied into a reader's own
//          buffer (what a restore that keeps no copy does: Ember's VolumeStream hands each
//          checked block to the reader through the FUSE reply, one copy);
//   store  the tcp pass + each block checked and pwrite()n to OUTDIR (the
//          node's copy in the page cache, written back by the kernel);
//   read   + a reader pread()s each block back from OUTDIR into its own buffer (what a reader of
//          a passthrough-opened copy costs).
#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "transport/socket_util.h"

using namespace ember;
using namespace ember::transport;

namespace {

// Touches `bytes` of new memory and gives it back: this VM's host takes back guest pages left
// untouched for a while, and the first write into such a page (page cache or heap) then costs
// 3-4x; every pass (and the Ember case it is compared with) starts with recently touched pages
// free for what it allocates.
void TouchFreeMemory(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  std::memset(p, 1, bytes);
  munmap(p, bytes);
}

constexpr size_t kBlock = 4u << 20;

enum class Pass { kTcp, kStream, kStore, kRead };

std::atomic<uint64_t> g_sums{0};  // the checksums go somewhere: not optimized away

// Streams every FILE at once through PASS; returns MiB/s of all, or < 0 on an error.
double Run(const std::string& outdir, const std::vector<std::string>& files, Pass pass) {
  std::vector<int> fds;
  std::vector<uint64_t> sizes;
  for (const auto& f : files) {
    int fd = open(f.c_str(), O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      std::perror(f.c_str());
      return -1;
    }
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    fds.push_back(fd);
    sizes.push_back(static_cast<uint64_t>(st.st_size));
  }
  int port = 0;
  auto lfd = ListenTcp("127.0.0.1:0", &port);
  if (!lfd.ok()) return -1;
  std::atomic<int> failed{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (size_t i = 0; i < files.size(); ++i) {
    threads.emplace_back([&, i] {
      int c = accept(*lfd, nullptr, nullptr);
      if (c < 0 || !SendFileFull(c, fds[i], 0, sizes[i]).ok()) failed++;
      if (c >= 0) close(c);
    });
    threads.emplace_back([&, i] {
      auto c = ConnectTcp(absl::StrCat("127.0.0.1:", port), std::chrono::seconds(1),
                          std::chrono::seconds(30));
      if (!c.ok()) {
        failed++;
        return;
      }
      const std::string out = absl::StrCat(outdir, "/floor", i);
      const bool store = pass == Pass::kStore || pass == Pass::kRead;
      int ofd = !store ? -1 : open(out.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
      std::vector<char> buf(kBlock), rbuf(store && pass != Pass::kRead ? 0 : kBlock);
      for (uint64_t off = 0; off < sizes[i]; off += kBlock) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(kBlock, sizes[i] - off));
        if (!ReadFull(*c, buf.data(), len).ok()) {
          failed++;
          break;
        }
        if (pass == Pass::kTcp) continue;
        g_sums ^= BlockChecksum(buf.data(), len);
        if (pass == Pass::kStream) {
          std::memcpy(rbuf.data(), buf.data(), len);
          g_sums ^= static_cast<uint64_t>(rbuf[len / 2]);
          continue;
        }
        if (pwrite(ofd, buf.data(), len, static_cast<off_t>(off)) != static_cast<ssize_t>(len) ||
            (pass == Pass::kRead &&
             pread(ofd, rbuf.data(), len, static_cast<off_t>(off)) != static_cast<ssize_t>(len))) {
          failed++;
          break;
        }
      }
      close(*c);
      if (ofd >= 0) close(ofd);
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(*lfd);
  for (int fd : fds) close(fd);
  for (size_t i = 0; i < files.size(); ++i) unlink(absl::StrCat(outdir, "/floor", i).c_str());
  if (failed > 0) return -1;
  uint64_t total = 0;
  for (uint64_t n : sizes) total += n;
  return static_cast<double>(total) / 1048576.0 / secs;
}

// Sends FILE (from the page cache) over loopback TCP and receives it through a mapped window with
// TCP_ZEROCOPY_RECEIVE, what the kernel cannot map read the usual way. Prints bytes mapped and
// copied; returns: false on an error.
bool ZeroCopyProbe(const std::string& file) {
  int fd = open(file.c_str(), O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    std::perror(file.c_str());
    return false;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  int port = 0;
  auto lfd = ListenTcp("127.0.0.1:0", &port);
  if (!lfd.ok()) return false;
  std::thread sender([&] {
    int c = accept(*lfd, nullptr, nullptr);
    if (c >= 0) {
      (void)SendFileFull(c, fd, 0, size);
      close(c);
    }
  });
  auto c = ConnectTcp(absl::StrCat("127.0.0.1:", port), std::chrono::seconds(1),
                      std::chrono::seconds(30));
  bool ok = c.ok();
  uint64_t mapped = 0, copied = 0;
  void* window = ok ? mmap(nullptr, kBlock, PROT_READ, MAP_SHARED, *c, 0) : MAP_FAILED;
  if (ok && window == MAP_FAILED) {
    std::perror("mmap of the socket");
    ok = false;
  }
  std::vector<char> buf(kBlock);
  while (ok && mapped + copied < size) {
    tcp_zerocopy_receive z{};
    z.address = reinterpret_cast<uint64_t>(window);
    z.length = kBlock;
    socklen_t zlen = sizeof(z);
    if (getsockopt(*c, IPPROTO_TCP, TCP_ZEROCOPY_RECEIVE, &z, &zlen) != 0) {
      std::perror("TCP_ZEROCOPY_RECEIVE");
      ok = false;
      break;
    }
    mapped += z.length;
    const size_t skip = z.recv_skip_hint > 0 ? z.recv_skip_hint : (z.length == 0 ? 4096 : 0);
    if (skip == 0) continue;
    ssize_t n = recv(*c, buf.data(), std::min<size_t>(skip, kBlock), 0);
    if (n <= 0) break;
    copied += static_cast<uint64_t>(n);
  }
  sender.join();
  if (window != MAP_FAILED) munmap(window, kBlock);
  if (c.ok()) close(*c);
  close(*lfd);
  close(fd);
  std::printf("zerocopy: %llu bytes mapped, %llu copied (%.1f%% mapped)\n",
              static_cast<unsigned long long>(mapped), static_cast<unsigned long long>(copied),
              size > 0 ? 100.0 * static_cast<double>(mapped) / static_cast<double>(size) : 0.0);
  return ok && mapped + copied == size;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--touch") {
    TouchFreeMemory(std::strtoull(argv[2], nullptr, 10) << 20);
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--zerocopy") return ZeroCopyProbe(argv[2]) ? 0 : 1;
  if (argc < 3) {
    std::fprintf(stderr, "usage: restore_floor OUTDIR FILE... | --touch MIB | --zerocopy FILE\n");
    return 2;
  }
  uint64_t total = 0;
  for (int i = 2; i < argc; ++i) {
    struct stat st;
    if (stat(argv[i], &st) == 0) total += static_cast<uint64_t>(st.st_size);
  }
  std::vector<std::string> files(argv + 2, argv + argc);
  const char* names[] = {"tcp", "stream", "store", "read"};
  // Each pass three times, the passes interleaved (this VM's disk and CPU move run to run);
  // prints each pass's median.
  std::vector<double> got[4];
  double cpu[4] = {0, 0, 0, 0};  // CPU-seconds of this process (senders and receivers)
  auto cpu_now = [] {
    rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  };
  for (int round = 0; round < 3; ++round) {
    for (Pass p : {Pass::kTcp, Pass::kStream, Pass::kStore, Pass::kRead}) {
      sync();  // the last pass's copies written back: each pass starts from a quiet disk
      TouchFreeMemory(2 * total + (256u << 20));  // the sender's page cache and the copies
      const double c0 = cpu_now();
      double mibs = Run(argv[1], files, p);
      cpu[static_cast<int>(p)] += cpu_now() - c0;
      if (mibs < 0) {
        std::fprintf(stderr, "restore_floor: pass %s failed\n", names[static_cast<int>(p)]);
        return 1;
      }
      got[static_cast<int>(p)].push_back(mibs);
    }
  }
  for (int p = 0; p < 4; ++p) {
    std::sort(got[p].begin(), got[p].end());
    std::printf("%s %.0f\n", names[p], got[p][1]);
    std::fprintf(stderr, "%s %.0f %.0f %.0f MiB/s, %.2f CPU-s per GiB\n", names[p], got[p][0],
                 got[p][1], got[p][2], cpu[p] / 3 / (static_cast<double>(total) / (1 << 30)));
  }
  return 0;
}
