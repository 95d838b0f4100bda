#include "cachefs/fuse/fuse_uring.h"

#include <linux/fuse.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ember::cachefs {
namespace {

// The kernel's FUSE-over-io_uring ABI (include/uapi/linux/fuse.h, 7.42); bookworm's header is
// older.
struct UringEntInOut {
  uint64_t flags;
  uint64_t commit_id;
  uint32_t payload_sz;
  uint32_t padding;
  uint64_t reserved;
};
struct UringReqHeader {
  char in_out[128];  // fuse_in_header in, fuse_out_header out
  char op_in[128];   // the opcode's own argument struct (the request's first argument)
  UringEntInOut ent;
};
struct UringCmdReq {
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};
constexpr uint32_t kCmdRegister = 1;
constexpr uint32_t kCmdCommitAndFetch = 2;
constexpr size_t kSqeSize = 128;  // IORING_SETUP_SQE128: the command area holds UringCmdReq
static_assert(sizeof(UringCmdReq) <= kSqeSize - offsetof(io_uring_sqe, cmd));

// Size of the first argument of the requests the server parses (it arrives in op_in; the rest,
// such as a LOOKUP's name, in the payload).
size_t OpArgSize(uint32_t opcode) {
  switch (opcode) {
    case FUSE_GETATTR:
      return sizeof(fuse_getattr_in);
    case FUSE_OPEN:
    case FUSE_OPENDIR:
      return sizeof(fuse_open_in);
    case FUSE_READ:
    case FUSE_READDIR:
    case FUSE_READDIRPLUS:
      return sizeof(fuse_read_in);
    case FUSE_RELEASE:
    case FUSE_RELEASEDIR:
      return sizeof(fuse_release_in);
    case FUSE_ACCESS:
      return sizeof(fuse_access_in);
    // Volumes' changes: the op header here, names and written bytes in the payload.
    case FUSE_CREATE:
      return sizeof(fuse_create_in);
    case FUSE_MKDIR:
      return sizeof(fuse_mkdir_in);
    case FUSE_RENAME:
      return sizeof(fuse_rename_in);
    case FUSE_RENAME2:
      return sizeof(fuse_rename2_in);
    case FUSE_WRITE:
      return sizeof(fuse_write_in);
    case FUSE_FLUSH:
      return sizeof(fuse_flush_in);
    case FUSE_FSYNC:
      return sizeof(fuse_fsync_in);
    case FUSE_SETATTR:
      return sizeof(fuse_setattr_in);
    case FUSE_GETXATTR:
      return sizeof(fuse_getxattr_in);
    default:
      // None (LOOKUP, UNLINK, RMDIR, READLINK, STATFS), or not parsed (answered EROFS/ENOSYS).
      return 0;
  }
}

// A minimal io_uring (no liburing): one submitter, the thread that owns it.
class Ring {
 public:
  ~Ring() {
    if (sqes_ != MAP_FAILED) munmap(sqes_, sqes_size_);
    if (cq_ptr_ != MAP_FAILED && cq_ptr_ != sq_ptr_) munmap(cq_ptr_, cq_size_);
    if (sq_ptr_ != MAP_FAILED) munmap(sq_ptr_, sq_size_);
    if (fd_ >= 0) close(fd_);
  }
  bool Init(unsigned entries) {
    io_uring_params p;
    std::memset(&p, 0, sizeof(p));
    p.flags = IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE;
    p.cq_entries = entries * 2;
    fd_ = static_cast<int>(syscall(__NR_io_uring_setup, entries, &p));
    if (fd_ < 0) return false;
    sq_size_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    cq_size_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single) sq_size_ = cq_size_ = std::max(sq_size_, cq_size_);
    sq_ptr_ = mmap(nullptr, sq_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                   IORING_OFF_SQ_RING);
    if (sq_ptr_ == MAP_FAILED) return false;
    cq_ptr_ = single ? sq_ptr_
                     : mmap(nullptr, cq_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                            fd_, IORING_OFF_CQ_RING);
    if (cq_ptr_ == MAP_FAILED) return false;
    sqes_size_ = p.sq_entries * kSqeSize;
    sqes_ = mmap(nullptr, sqes_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                 IORING_OFF_SQES);
    if (sqes_ == MAP_FAILED) return false;
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
    return true;
  }
  // The next SQE, zeroed; Publish() queues it for the next Enter().
  io_uring_sqe* Next() {
    unsigned idx = *sq_tail_ & sq_mask_;
    auto* sqe = reinterpret_cast<io_uring_sqe*>(static_cast<char*>(sqes_) + idx * kSqeSize);
    std::memset(sqe, 0, kSqeSize);
    sq_array_[idx] = idx;
    return sqe;
  }
  void Publish() { __atomic_store_n(sq_tail_, *sq_tail_ + 1, __ATOMIC_RELEASE); }
  // Submits what is queued and waits for `wait` completions. -errno on failure.
  int Enter(unsigned wait) {
    unsigned pending = *sq_tail_ - __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
    long r = syscall(__NR_io_uring_enter, fd_, pending, wait, wait ? IORING_ENTER_GETEVENTS : 0,
                     nullptr, 0);
    return r < 0 ? -errno : static_cast<int>(r);
  }
  // The next completion's result, if there is one; Pop() consumes it.
  bool Peek(int* res) {
    unsigned head = *cq_head_;
    if (head == __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE)) return false;
    *res = cqes_[head & cq_mask_].res;
    return true;
  }
  bool Pop(int* res) {
    if (!Peek(res)) return false;
    __atomic_store_n(cq_head_, *cq_head_ + 1, __ATOMIC_RELEASE);
    return true;
  }

 private:
  int fd_ = -1;
  void* sq_ptr_ = MAP_FAILED;
  void* cq_ptr_ = MAP_FAILED;
  void* sqes_ = MAP_FAILED;
  size_t sq_size_ = 0, cq_size_ = 0, sqes_size_ = 0;
  unsigned *sq_head_ = nullptr, *sq_tail_ = nullptr, *sq_array_ = nullptr;
  unsigned *cq_head_ = nullptr, *cq_tail_ = nullptr;
  unsigned sq_mask_ = 0, cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
};

}  // namespace

// One ring entry: its buffers, its io_uring and the thread (pinned to the entry's CPU) serving it.
class FuseUring::Entry {
 public:
  Entry(int fuse_fd, uint16_t qid, size_t payload_size)
      : fuse_fd_(fuse_fd), qid_(qid), payload_size_(payload_size) {}
  ~Entry() {
    free(header_);
    free(payload_);
  }

  // Sets up and registers the entry. Runs on the entry's thread (its io_uring's submitter).
  absl::Status Register() {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(qid_, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      spdlog::debug("fuse: pinning the ring thread of CPU {}: {}", qid_, strerror(errno));
    }
    void* h = nullptr;
    void* p = nullptr;
    if (posix_memalign(&h, 4096, 4096) != 0 || posix_memalign(&p, 4096, payload_size_) != 0) {
      free(h);
      return absl::ResourceExhaustedError("no memory for a ring entry");
    }
    header_ = static_cast<UringReqHeader*>(h);
    payload_ = static_cast<char*>(p);
    std::memset(header_, 0, sizeof(*header_));
    if (!ring_.Init(4))
      return absl::InternalError(absl::StrCat("io_uring_setup: ", strerror(errno)));
    iov_[0] = {header_, sizeof(*header_)};
    iov_[1] = {payload_, payload_size_};
    Command(kCmdRegister, 0);
    int r = ring_.Enter(0);
    if (r < 0) return absl::InternalError(absl::StrCat("io_uring_enter: ", strerror(-r)));
    // Refused at once, or pending until a request comes. A request may already be there (the
    // kernel holds requests until every CPU has an entry, then hands them out): Serve() takes
    // it, so only look.
    int res = 0;
    if (ring_.Peek(&res) && res < 0) {
      return absl::FailedPreconditionError(absl::StrCat("registering: ", strerror(-res)));
    }
    return absl::OkStatus();
  }

  // Answers requests until stopped or unmounted.
  void Serve(const Handler& handler, const std::atomic<bool>& stopping,
             std::atomic<uint64_t>& count) {
    std::vector<char> msg;
    while (!stopping) {
      int res = 0;
      int r = ring_.Peek(&res) ? 0 : ring_.Enter(1);  // one may be there already
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        spdlog::error("fuse: io_uring_enter: {}", strerror(-r));
        return;
      }
      while (ring_.Pop(&res)) {
        if (res == -EINTR || res == -EAGAIN) {
          Command(last_cmd_, last_commit_);  // not taken: ask again
          continue;
        }
        if (res < 0) {
          if (res != -ENOTCONN && res != -ECANCELED && res != -ENODEV && res != -ECONNABORTED) {
            spdlog::error("fuse: ring entry of CPU {}: {}", qid_, strerror(-res));
          }
          return;  // unmounted or torn down
        }
        count++;
        Handle(handler, &msg);
      }
    }
    (void)ring_.Enter(0);  // hand in the last reply
  }

 private:
  void Command(uint32_t cmd, uint64_t commit_id) {
    io_uring_sqe* sqe = ring_.Next();
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = fuse_fd_;
    sqe->cmd_op = cmd;
    if (cmd == kCmdRegister) {
      sqe->addr = reinterpret_cast<uint64_t>(iov_);
      sqe->len = 2;
    }
    auto* req = reinterpret_cast<UringCmdReq*>(sqe->cmd);
    req->commit_id = commit_id;
    req->qid = qid_;
    ring_.Publish();
    last_cmd_ = cmd;
    last_commit_ = commit_id;
  }

  // Lays the request out as /dev/fuse would, runs the handler, queues the reply's commit.
  void Handle(const Handler& handler, std::vector<char>* msg) {
    fuse_in_header in;
    std::memcpy(&in, header_->in_out, sizeof(in));
    const size_t op = OpArgSize(in.opcode);
    const size_t payload = std::min<size_t>(header_->ent.payload_sz, payload_size_);
    const uint64_t commit_id = header_->ent.commit_id;
    msg->resize(sizeof(in) + op + payload);
    in.len = static_cast<uint32_t>(msg->size());
    std::memcpy(msg->data(), &in, sizeof(in));
    std::memcpy(msg->data() + sizeof(in), header_->op_in, op);
    std::memcpy(msg->data() + sizeof(in) + op, payload_, payload);
    uint32_t reply_size = 0;
    RingReply reply{header_->in_out, payload_, payload_size_, &reply_size};
    std::memset(header_->in_out, 0, sizeof(fuse_out_header));
    handler(msg->data(), msg->size(), &reply);
    header_->ent.payload_sz = reply_size;
    Command(kCmdCommitAndFetch, commit_id);
  }

  int fuse_fd_;
  uint16_t qid_;
  size_t payload_size_;
  UringReqHeader* header_ = nullptr;
  char* payload_ = nullptr;
  iovec iov_[2];
  Ring ring_;
  uint32_t last_cmd_ = 0;
  uint64_t last_commit_ = 0;
};

bool FuseUring::KernelAllows() {
  std::ifstream f("/sys/module/fuse/parameters/enable_uring");
  char c = 'N';
  return f >> c && (c == 'Y' || c == 'y' || c == '1');
}

absl::StatusOr<std::unique_ptr<FuseUring>> FuseUring::Start(
    int fuse_fd, size_t payload_size, int threads_per_cpu, Handler handler,
    const std::function<void(std::thread&)>& wake) {
  std::unique_ptr<FuseUring> u(new FuseUring());
  const int cpus = get_nprocs_conf();  // the kernel has a queue per possible CPU
  // The threads' registrations, counted here (locals: started and first_error are guarded by mu).
  absl::Mutex mu;
  int started = 0;
  absl::Status first_error;
  for (int c = 0; c < cpus; c++) {
    for (int t = 0; t < std::max(1, threads_per_cpu); t++) {
      u->entries_.push_back(
          std::make_unique<Entry>(fuse_fd, static_cast<uint16_t>(c), payload_size));
    }
  }
  u->live_ = static_cast<int>(u->entries_.size());
  auto shared = std::make_shared<Handler>(std::move(handler));
  for (auto& e : u->entries_) {
    Entry* entry = e.get();
    FuseUring* self = u.get();
    u->threads_.emplace_back([entry, self, shared, &mu, &started, &first_error] {
      absl::Status st = entry->Register();
      {
        absl::MutexLock lock(&mu);
        if (!st.ok() && first_error.ok()) first_error = st;
        started++;
      }
      if (st.ok()) entry->Serve(*shared, self->stopping_, self->requests_);
      self->live_--;
    });
  }
  {
    absl::MutexLock lock(&mu);
    const int all = static_cast<int>(u->entries_.size());
    auto all_started = [&] { return started == all; };
    mu.Await(absl::Condition(&all_started));
  }
  if (!first_error.ok()) {
    u->Stop(wake);
    return absl::Status(first_error.code(),
                        absl::StrCat("fuse over io_uring: ", first_error.message()));
  }
  spdlog::info("fuse: requests over io_uring, {} CPUs x {} threads", cpus,
               std::max(1, threads_per_cpu));
  return u;
}

void FuseUring::Stop(const std::function<void(std::thread&)>& wake) {
  stopping_ = true;
  while (live_ > 0) {
    for (auto& t : threads_) wake(t);  // repeated: a wakeup just before a wait is lost
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

FuseUring::~FuseUring() {
  // The owner stops the threads with its wake signal first (KernelFuse::StopUring).
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace ember::cachefs
