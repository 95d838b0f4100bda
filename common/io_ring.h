// IoRing: a minimal io_uring of raw syscalls (no liburing), for one submitting thread: the ring
// under FUSE over io_uring (cachefs/fuse/fuse_uring.cc) and batched reads (common/batch_read.h).
// Not thread-safe: the thread that set it up submits and reaps.
#pragma once

#include <linux/io_uring.h>

#include <cstddef>
#include <cstdint>

namespace ember {

class IoRing {
 public:
  IoRing() = default;
  ~IoRing();
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;

  // Sets up `entries` submission slots with io_uring_setup flags `flags` (IORING_SETUP_SQE128:
  // 128-byte entries) and, when cq_entries > 0, that many completion slots (IORING_SETUP_CQSIZE).
  // Returns: false with errno set (ENOSYS, EPERM when io_uring is disabled, EINVAL for flags
  // this kernel does not know).
  bool Init(unsigned entries, unsigned flags, unsigned cq_entries = 0);
  unsigned entries() const { return sq_entries_; }

  // The next submission entry, zeroed; Publish() queues it for the next Enter().
  io_uring_sqe* Next();
  void Publish() { __atomic_store_n(sq_tail_, *sq_tail_ + 1, __ATOMIC_RELEASE); }
  // Entries published that the kernel has not taken yet.
  unsigned Pending() const { return *sq_tail_ - __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE); }
  // Submits what is queued and waits for `wait` completions (0: submits only).
  // Returns: the entries taken, or -errno.
  int Enter(unsigned wait);
  // Waits for `n` completions, submitting nothing. Returns: 0, or -errno.
  int Wait(unsigned n);
  // Whether this kernel's io_uring knows `opcode` (IORING_REGISTER_PROBE, 5.6+; false where the
  // probe itself is unknown, as the opcodes it would report are then too).
  bool Supports(uint8_t opcode) const;
  // The next completion, if there is one; Pop() consumes it.
  const io_uring_cqe* Peek() const {
    const unsigned head = *cq_head_;
    if (head == __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE)) return nullptr;
    return &cqes_[head & cq_mask_];
  }
  void Pop() { __atomic_store_n(cq_head_, *cq_head_ + 1, __ATOMIC_RELEASE); }

 private:
  void Close();

  int fd_ = -1;
  size_t sqe_size_ = sizeof(io_uring_sqe);
  unsigned sq_entries_ = 0;
  void* sq_ptr_ = nullptr;
  void* cq_ptr_ = nullptr;
  void* sqes_ = nullptr;
  size_t sq_size_ = 0, cq_size_ = 0, sqes_size_ = 0;
  unsigned *sq_head_ = nullptr, *sq_tail_ = nullptr, *sq_array_ = nullptr;
  unsigned *cq_head_ = nullptr, *cq_tail_ = nullptr;
  unsigned sq_mask_ = 0, cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
};

}  // namespace ember
