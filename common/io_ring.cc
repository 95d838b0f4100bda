#include "common/io_ring.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace ember {

IoRing::~IoRing() { Close(); }

void IoRing::Close() {
  if (sqes_ != nullptr) munmap(sqes_, sqes_size_);
  if (cq_ptr_ != nullptr && cq_ptr_ != sq_ptr_) munmap(cq_ptr_, cq_size_);
  if (sq_ptr_ != nullptr) munmap(sq_ptr_, sq_size_);
  if (fd_ >= 0) close(fd_);
  sqes_ = cq_ptr_ = sq_ptr_ = nullptr;
  fd_ = -1;
  sq_entries_ = 0;
}

bool IoRing::Init(unsigned entries, unsigned flags, unsigned cq_entries) {
  Close();  // a second try after a failed one starts clean
  io_uring_params p;
  std::memset(&p, 0, sizeof(p));
  p.flags = flags | (cq_entries > 0 ? IORING_SETUP_CQSIZE : 0);
  p.cq_entries = cq_entries;
  fd_ = static_cast<int>(syscall(__NR_io_uring_setup, entries, &p));
  if (fd_ < 0) return false;
  sqe_size_ = (flags & IORING_SETUP_SQE128) != 0 ? 2 * sizeof(io_uring_sqe) : sizeof(io_uring_sqe);
  sq_size_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  cq_size_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
  const bool single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
  if (single) sq_size_ = cq_size_ = std::max(sq_size_, cq_size_);
  auto map = [&](size_t len, off_t what) -> void* {
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, what);
    return m == MAP_FAILED ? nullptr : m;
  };
  sq_ptr_ = map(sq_size_, IORING_OFF_SQ_RING);
  if (sq_ptr_ == nullptr) return false;
  cq_ptr_ = single ? sq_ptr_ : map(cq_size_, IORING_OFF_CQ_RING);
  if (cq_ptr_ == nullptr) return false;
  sqes_size_ = p.sq_entries * sqe_size_;
  sqes_ = map(sqes_size_, IORING_OFF_SQES);
  if (sqes_ == nullptr) return false;
  auto* sq = static_cast<char*>(sq_ptr_);
  auto* cq = static_cast<char*>(cq_ptr_);
  sq_head_ = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
  sq_tail_ = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
  sq_mask_ = *reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
  sq_array_ = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
  cq_head_ = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
  cq_tail_ = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
  cq_mask_ = *reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
  cqes_ = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
  sq_entries_ = p.sq_entries;
  return true;
}

io_uring_sqe* IoRing::Next() {
  const unsigned idx = *sq_tail_ & sq_mask_;
  auto* sqe = reinterpret_cast<io_uring_sqe*>(static_cast<char*>(sqes_) + idx * sqe_size_);
  std::memset(sqe, 0, sqe_size_);
  sq_array_[idx] = idx;
  return sqe;
}

bool IoRing::Supports(uint8_t opcode) const {
  if (fd_ < 0) return false;
  constexpr unsigned kOps = 256;
  std::vector<char> buf(sizeof(io_uring_probe) + kOps * sizeof(io_uring_probe_op), 0);
  auto* probe = reinterpret_cast<io_uring_probe*>(buf.data());
  if (syscall(__NR_io_uring_register, fd_, IORING_REGISTER_PROBE, probe, kOps) < 0) return false;
  return opcode <= probe->last_op && (probe->ops[opcode].flags & IO_URING_OP_SUPPORTED) != 0;
}

int IoRing::Enter(unsigned wait) {
  const long r = syscall(__NR_io_uring_enter, fd_, Pending(), wait,
                         wait > 0 ? IORING_ENTER_GETEVENTS : 0, nullptr, 0);
  return r < 0 ? -errno : static_cast<int>(r);
}

int IoRing::Wait(unsigned n) {
  const long r = syscall(__NR_io_uring_enter, fd_, 0, n, IORING_ENTER_GETEVENTS, nullptr, 0);
  return r < 0 ? -errno : 0;
}

}  // namespace ember
