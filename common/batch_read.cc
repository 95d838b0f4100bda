#include "common/batch_read.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/io_ring.h"

namespace ember {
namespace {

constexpr unsigned kEntries = 64;  // reads in flight per submission (a batch is cut in these)

// A thread's ring for reads, and whether it still works.
class ReadRing {
 public:
  ReadRing() {
    // Completions are run when this thread waits for them (it always does), not by interrupts
    // of whatever runs: 6.1+; older kernels take the plain ring.
    ok_ = ring_.Init(kEntries, IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN) ||
          (errno == EINVAL && ring_.Init(kEntries, 0));
    opens_ = ok_ && ring_.Supports(IORING_OP_OPENAT2) && ring_.Supports(IORING_OP_CLOSE);
  }
  bool ok() const { return ok_; }
  size_t entries() const { return std::min<size_t>(ring_.entries(), kEntries); }
  // Whether the ring opens and closes files (IORING_OP_OPENAT2 and IORING_OP_CLOSE, 5.6+).
  bool opens() const { return opens_; }

  // Runs n operations (at most entries()) at once: prepare(i, sqe) fills operation i's entry,
  // done(i, res) gets its result. Returns false if the ring failed (done was called for those
  // the kernel took; the caller does the rest itself, those with no result).
  template <typename Prepare, typename Done>
  bool Run(size_t n, Prepare prepare, Done done) {
    for (size_t i = 0; i < n; i++) {
      io_uring_sqe* sqe = ring_.Next();
      prepare(i, sqe);
      sqe->user_data = i;
      ring_.Publish();
    }
    size_t got = 0, taken = 0;
    while (got < n) {
      const int r = ring_.Enter(ring_.Pending() > 0 ? 0 : static_cast<unsigned>(n - got));
      if (r > 0) taken += static_cast<size_t>(r);
      if (r < 0 && r != -EINTR) {
        ok_ = false;
        // What the kernel took is waited for: a read writes into the caller's buffers, which
        // may be freed or reused once we return; an open it did must be closed by someone.
        while (got < taken) {
          const int w = ring_.Wait(static_cast<unsigned>(taken - got));
          if (w < 0 && w != -EINTR && w != -EAGAIN) {
            std::fprintf(stderr, "io_uring: cannot wait for operations in flight: %s\n",
                         std::strerror(-w));
            std::abort();  // returning would let the kernel write into memory reused after
          }
          for (const io_uring_cqe* c; (c = ring_.Peek()) != nullptr; ring_.Pop()) {
            if (c->user_data < n) done(c->user_data, c->res);
            got++;
          }
        }
        return false;
      }
      for (const io_uring_cqe* c; (c = ring_.Peek()) != nullptr; ring_.Pop()) {
        if (c->user_data < n) done(c->user_data, c->res);
        got++;
      }
    }
    return true;
  }

  // Reads ops (at most entries() of them) at once: each op's result is the bytes read (short
  // only at the end of its file), or -errno. A read cut short (the first pages were in memory,
  // the rest not yet) is submitted again for the rest with the others' rests, never read alone.
  // Returns false if the ring failed (the caller reads every op itself).
  bool Read(std::span<PreadOp> ops) {
    std::vector<size_t> open(ops.size());  // ops not finished
    for (size_t i = 0; i < ops.size(); i++) {
      open[i] = i;
      ops[i].result = 0;
    }
    std::vector<int64_t> last(ops.size());  // per op: what its read of the round got
    while (!open.empty()) {
      std::fill(last.begin(), last.end(), -1);
      const bool ran = Run(
          open.size(),
          [&](size_t j, io_uring_sqe* sqe) {
            PreadOp& op = ops[open[j]];
            const auto got = static_cast<size_t>(op.result);
            sqe->opcode = IORING_OP_READ;
            sqe->fd = op.fd;
            sqe->off = op.offset + got;
            sqe->addr = reinterpret_cast<uint64_t>(op.buf + got);
            sqe->len = static_cast<uint32_t>(op.len - got);
          },
          // A read's bytes are added to its result, an error replaces it.
          [&](size_t j, int res) {
            const size_t i = open[j];
            last[i] = res;
            if (res == -EINTR || res == -EAGAIN) {
              last[i] = 1;  // not an end: submitted again
            } else if (res < 0) {
              ops[i].result = res;
            } else {
              ops[i].result += res;
            }
          });
      // Unusable: every read the kernel took was waited for (it writes into the caller's
      // buffers, which may be freed or reused once we return); the caller reads every op.
      if (!ran) return false;
      std::erase_if(open, [&](size_t i) {
        const int64_t r = ops[i].result;
        return r < 0 || static_cast<size_t>(r) >= ops[i].len || last[i] == 0 ||
               (ops[i].enough > 0 && static_cast<size_t>(r) >= ops[i].enough);
      });
    }
    return true;
  }

 private:
  IoRing ring_;
  bool ok_ = false;
  bool opens_ = false;
};

ReadRing& ThreadRing() {
  thread_local ReadRing ring;
  return ring;
}

// Finishes op from `got` bytes on with preads: until len, EOF or an error.
void FinishByPread(PreadOp& op, size_t got) {
  while (got < op.len && (op.enough == 0 || got < op.enough)) {
    const ssize_t n = pread(op.fd, op.buf + got, op.len - got, static_cast<off_t>(op.offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      op.result = -errno;
      return;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  op.result = static_cast<int64_t>(got);
}

int OpenOne(const OpenOp& op) {
  struct open_how how {};
  how.flags = op.flags;
  how.resolve = op.resolve;
  const int fd = static_cast<int>(syscall(SYS_openat2, op.dirfd, op.path, &how, sizeof(how)));
  return fd >= 0 ? fd : -errno;
}

}  // namespace

void BatchOpen(std::span<OpenOp> ops) {
  ReadRing& ring = ThreadRing();
  std::vector<open_how> hows(std::min(ops.size(), ring.entries()));
  size_t at = 0;
  while (ring.ok() && ring.opens() && at < ops.size()) {
    std::span<OpenOp> chunk = ops.subspan(at, std::min(ring.entries(), ops.size() - at));
    for (OpenOp& op : chunk) op.result = -EINPROGRESS;  // no answer yet
    const bool ran = ring.Run(
        chunk.size(),
        [&](size_t i, io_uring_sqe* sqe) {
          hows[i] = {};
          hows[i].flags = chunk[i].flags;
          hows[i].resolve = chunk[i].resolve;
          sqe->opcode = IORING_OP_OPENAT2;
          sqe->fd = chunk[i].dirfd;
          sqe->addr = reinterpret_cast<uint64_t>(chunk[i].path);
          sqe->len = sizeof(open_how);
          sqe->off = reinterpret_cast<uint64_t>(&hows[i]);
        },
        [&](size_t i, int res) { chunk[i].result = res; });
    // Not opened by the ring: not answered (it failed), cancelled (no io-wq worker could be
    // made for an open that had to wait), interrupted: opened here.
    for (OpenOp& op : chunk) {
      if (op.result == -EINPROGRESS || op.result == -ECANCELED || op.result == -EAGAIN ||
          op.result == -EINTR) {
        op.result = OpenOne(op);
      }
    }
    at += chunk.size();  // answered, one way or the other: never opened twice
    if (!ran) break;
  }
  for (; at < ops.size(); at++) ops[at].result = OpenOne(ops[at]);
}

void BatchClose(std::span<const int> fds) {
  ReadRing& ring = ThreadRing();
  size_t at = 0;
  while (ring.ok() && ring.opens() && at < fds.size()) {
    std::span<const int> chunk = fds.subspan(at, std::min(ring.entries(), fds.size() - at));
    std::vector<int> res(chunk.size(), -EINPROGRESS);
    const bool ran = ring.Run(
        chunk.size(),
        [&](size_t i, io_uring_sqe* sqe) {
          sqe->opcode = IORING_OP_CLOSE;
          sqe->fd = chunk[i];
        },
        [&](size_t i, int r) { res[i] = r; });
    // Not answered (the ring failed) or cancelled before it ran (a file with a flush waits for
    // an io-wq worker, and none could be made): closed here. A close that ran and failed is not
    // retried: the fd is gone either way, and the number may be another thread's file by now.
    for (size_t i = 0; i < chunk.size(); i++) {
      if (res[i] == -EINPROGRESS || res[i] == -ECANCELED) close(chunk[i]);
    }
    at += chunk.size();  // answered, one way or the other: never closed twice
    if (!ran) break;
  }
  for (; at < fds.size(); at++) close(fds[at]);
}

bool BatchPreadUsesUring() { return ThreadRing().ok(); }

void BatchPread(std::span<PreadOp> ops) {
  ReadRing& ring = ThreadRing();
  size_t at = 0;
  while (ring.ok() && at < ops.size()) {
    std::span<PreadOp> chunk = ops.subspan(at, std::min(ring.entries(), ops.size() - at));
    if (!ring.Read(chunk)) break;
    // A kernel whose io_uring has no IORING_OP_READ (before 5.6) refuses each read: read those.
    for (PreadOp& op : chunk) {
      if (op.result == -EINVAL || op.result == -EOPNOTSUPP) FinishByPread(op, 0);
    }
    at += chunk.size();
  }
  for (; at < ops.size(); at++) FinishByPread(ops[at], 0);
}

}  // namespace ember
