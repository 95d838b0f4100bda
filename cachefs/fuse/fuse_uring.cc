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
#include "common/io_ring.h"

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
    if (!ring_.Init(4, IORING_SETUP_SQE128, 8))
      return absl::InternalError(absl::StrCat("io_uring_setup: ", strerror(errno)));
    iov_[0] = {header_, sizeof(*header_)};
    iov_[1] = {payload_, payload_size_};
    Command(kCmdRegister, 0);
    int r = ring_.Enter(0);
    if (r < 0) return absl::InternalError(absl::StrCat("io_uring_enter: ", strerror(-r)));
    // Refused at once, or pending until a request comes. A request may already be there (the
    // kernel holds requests until every CPU has an entry, then hands them out): Serve() takes
    // it, so only look.
    if (const io_uring_cqe* c = ring_.Peek(); c != nullptr && c->res < 0) {
      return absl::FailedPreconditionError(absl::StrCat("registering: ", strerror(-c->res)));
    }
    return absl::OkStatus();
  }

  // Answers requests until stopped or unmounted.
  void Serve(const Handler& handler, const std::atomic<bool>& stopping,
             std::atomic<uint64_t>& count) {
    std::vector<char> msg;
    while (!stopping) {
      int r = ring_.Peek() != nullptr ? 0 : ring_.Enter(1);  // one may be there already
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        spdlog::error("fuse: io_uring_enter: {}", strerror(-r));
        return;
      }
      for (const io_uring_cqe* c; (c = ring_.Peek()) != nullptr;) {
        const int res = c->res;
        ring_.Pop();
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
  IoRing ring_;
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
