#include "common/batch_read.h"

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
  }
  bool ok() const { return ok_; }
  size_t entries() const { return std::min<size_t>(ring_.entries(), kEntries); }

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
    while (!open.empty()) {
      for (size_t i : open) {
        PreadOp& op = ops[i];
        const auto got = static_cast<size_t>(op.result);
        io_uring_sqe* sqe = ring_.Next();
        sqe->opcode = IORING_OP_READ;
        sqe->fd = op.fd;
        sqe->off = op.offset + got;
        sqe->addr = reinterpret_cast<uint64_t>(op.buf + got);
        sqe->len = static_cast<uint32_t>(op.len - got);
        sqe->user_data = i;
        ring_.Publish();
      }
      if (!Wait(ops, open.size())) return false;
      std::erase_if(open, [&](size_t i) {
        const int64_t r = ops[i].result;
        return r < 0 || static_cast<size_t>(r) >= ops[i].len || last_[i] == 0 ||
               (ops[i].enough > 0 && static_cast<size_t>(r) >= ops[i].enough);
      });
    }
    return true;
  }

 private:
  // Submits what is published and reaps `n` completions into ops: a read's bytes are added to
  // its result (last_ says what this round's read got), an error replaces it.
  bool Wait(std::span<PreadOp> ops, size_t n) {
    last_.assign(ops.size(), -1);
    size_t done = 0, taken = 0;
    while (done < n) {
      // Submit what the kernel has not taken yet, without waiting (a submission cut short must
      // not wait for more completions than are in flight); then wait for every read left.
      const int r = ring_.Enter(ring_.Pending() > 0 ? 0 : static_cast<unsigned>(n - done));
      if (r > 0) taken += static_cast<size_t>(r);
      if (r < 0 && r != -EINTR) {
        // Unusable: every read the kernel took is waited for (it writes into the caller's
        // buffers, which may be freed or reused once we return), then the caller reads every
        // op itself.
        ok_ = false;
        while (done < taken) {
          const int w = ring_.Wait(static_cast<unsigned>(taken - done));
          if (w < 0 && w != -EINTR && w != -EAGAIN) {
            std::fprintf(stderr, "io_uring: cannot wait for reads in flight: %s\n",
                         std::strerror(-w));
            std::abort();  // returning would let the kernel write into memory reused after
          }
          for (const io_uring_cqe* c; (c = ring_.Peek()) != nullptr; ring_.Pop()) done++;
        }
        return false;
      }
      for (const io_uring_cqe* c; (c = ring_.Peek()) != nullptr; ring_.Pop()) {
        if (c->user_data >= ops.size()) continue;
        PreadOp& op = ops[c->user_data];
        last_[c->user_data] = c->res;
        if (c->res == -EINTR || c->res == -EAGAIN) {
          last_[c->user_data] = 1;  // not an end: submitted again
        } else if (c->res < 0) {
          op.result = c->res;
        } else {
          op.result += c->res;
        }
        done++;
      }
    }
    return true;
  }

  IoRing ring_;
  bool ok_ = false;
  std::vector<int64_t> last_;  // per op: what its read of the round got
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

}  // namespace

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
