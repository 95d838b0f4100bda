// KernelFuse's session: mounting (or adopting a mount), INIT, the worker threads that read
// /dev/fuse, and stopping or quiescing them. Requests are answered in kernel_ops.cc.
#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cachefs/fuse/kernel_binding.h"
#include "cachefs/fuse/kernel_ops.h"
#include "cachefs/fuse/kernel_protocol.h"
#include "cachefs/fuse/mount_session.h"

namespace ember::cachefs {
namespace {

constexpr int kWakeSignal = SIGUSR2;  // interrupts a worker's read(2); the handler does nothing

// Installs the no-op handler for kWakeSignal once, without SA_RESTART (a restarted read would
// not return). Other threads that get it see EINTR, which they retry.
void InstallWakeHandler() {
  static const bool installed = [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = [](int) {};
    sigemptyset(&sa.sa_mask);
    return sigaction(kWakeSignal, &sa, nullptr) == 0;
  }();
  (void)installed;  // only the first call installs it
}

void WakeThread(std::thread& t) { pthread_kill(t.native_handle(), kWakeSignal); }

}  // namespace

absl::StatusOr<std::unique_ptr<KernelFuse>> KernelFuse::Mount(FileSystem* fs,
                                                              const std::string& mountpoint,
                                                              const MountOptions& options) {
  std::unique_ptr<KernelFuse> k(new KernelFuse());
  k->fs_ = fs;
  k->options_ = options;
  static const fuse_lowlevel_ops kNoOps = {};  // we read /dev/fuse ourselves
  k->options_.max_pages = std::clamp<uint32_t>(options.max_pages, 1, kMaxPages);
  RaiseFuseMaxPagesLimit(k->options_.max_pages);  // read at mount: before it
  auto session = MountSession(mountpoint, options, /*writable=*/!options.no_open, &kNoOps, nullptr,
                              &k->mountpoint_);
  if (!session.ok()) return session.status();
  k->session_ = *session;
  k->fd_ = fuse_session_fd(k->session_);
  k->files_ = std::make_unique<OpenFiles>(fs, k->fd_, options.direct_io, options.no_open);
  spdlog::info("mount: serving datasets at {} (kernel protocol)", k->mountpoint_);
  return k;
}

absl::StatusOr<std::unique_ptr<KernelFuse>> KernelFuse::Adopt(FileSystem* fs, KernelFuseState state,
                                                              const MountOptions& options) {
  std::unique_ptr<KernelFuse> k(new KernelFuse());
  k->fs_ = fs;
  k->options_ = options;
  k->adopted_ = true;
  k->fd_ = state.fd;
  k->mountpoint_ = state.mountpoint;
  k->proto_minor_ = state.proto_minor;
  k->negotiated_passthrough_ = state.passthrough;
  k->direct_io_mmap_ = state.direct_io_mmap;
  k->files_ = std::make_unique<OpenFiles>(fs, k->fd_, options.direct_io, options.no_open);
  // Negotiated by the predecessor; the successor's flags may turn new passthrough opens off
  // (or on again) without a remount.
  k->files_->SetNegotiated(state.passthrough && options.passthrough, state.direct_io_mmap);
  size_t held = k->files_->Restore(state);
  spdlog::info(
      "mount: took over {} from the previous agent ({} open files, {} in passthrough, held)",
      k->mountpoint_, state.open_files.size(), held);
  return k;
}

KernelFuse::~KernelFuse() {
  Stop();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  if (files_ != nullptr && !quiescing_) files_->CloseAllBacking();
  files_.reset();  // the FileSystem's handles and holds go before the mount does
  if (session_ != nullptr && quiescing_) {
    // Handed over: the mount stays. libfuse frees its copy of the mountpoint only when it
    // unmounts, so the session is kept (reachable) until the process exits.
    static std::vector<fuse_session*>* kept = new std::vector<fuse_session*>();
    kept->push_back(session_);
    close(fd_);
  } else if (session_ != nullptr) {
    fuse_session_unmount(session_);  // already detached by Stop(): closes fd_, frees its strings
    fuse_session_destroy(session_);
  } else if (fd_ >= 0) {
    close(fd_);
  }
}

void KernelFuse::SetSupervisor(int sock, int peer_listener) {
  supervisor_ = sock;
  peer_listener_ = peer_listener;
  files_->SetSupervisor(sock);
}

bool KernelFuse::HandleInit() {
  std::vector<char> buf(kRequestBuffer);
  ssize_t n;
  do {
    n = read(fd_, buf.data(), buf.size());
  } while (n < 0 && (errno == EINTR || errno == EAGAIN));
  if (n < static_cast<ssize_t>(sizeof(fuse_in_header) + 8)) {
    spdlog::error("fuse: reading INIT failed: {}", n < 0 ? strerror(errno) : "short message");
    return false;
  }
  const auto* h = reinterpret_cast<const fuse_in_header*>(buf.data());
  const auto* in = reinterpret_cast<const fuse_init_in*>(buf.data() + sizeof(*h));
  if (h->opcode != FUSE_INIT) {
    spdlog::error("fuse: expected INIT, got opcode {}", h->opcode);
    return false;
  }
  if (in->major != 7) {
    spdlog::error("fuse: kernel speaks protocol {}.{}, we speak 7.x", in->major, in->minor);
    ReplyError(Channel{fd_}, h->unique, EPROTO);
    return false;
  }
  uint64_t offered = in->flags;
  if ((in->flags & FUSE_INIT_EXT) && n >= static_cast<ssize_t>(sizeof(*h) + sizeof(*in))) {
    offered |= static_cast<uint64_t>(in->flags2) << 32;
  }
  uint64_t want = (options_.readdirplus ? FUSE_DO_READDIRPLUS : 0) | FUSE_ASYNC_READ |
                  FUSE_PARALLEL_DIROPS | FUSE_MAX_PAGES | FUSE_CACHE_SYMLINKS | FUSE_INIT_EXT |
                  FUSE_BIG_WRITES | FUSE_ATOMIC_O_TRUNC;
  // Volume files open for writing are FOPEN_DIRECT_IO (FileHandle::Uncached): a shared mmap
  // of one needs ALLOW_MMAP, asked for always (datasets use direct io only with --direct-io).
  want |= FUSE_DIRECT_IO_ALLOW_MMAP;
  if (options_.direct_io) want |= FUSE_ASYNC_DIO;
  if (options_.passthrough && !options_.no_open) want |= FUSE_PASSTHROUGH;
  if (options_.fuse_uring) want |= kFuseOverIoUring;
  uint64_t flags = offered & want;
  InitOut out;
  std::memset(&out, 0, sizeof(out));
  out.major = 7;
  out.minor = std::min<uint32_t>(in->minor, kOurMinor);
  out.max_readahead = in->max_readahead;
  out.flags = static_cast<uint32_t>(flags);
  out.flags2 = static_cast<uint32_t>(flags >> 32);
  out.max_background = 64;
  out.congestion_threshold = 48;
  out.max_write = kMaxWrite;  // volumes take writes (datasets answer EROFS)
  out.time_gran = 1;
  out.max_pages = static_cast<uint16_t>(options_.max_pages);  // clamped by Mount
  const bool passthrough = (flags & FUSE_PASSTHROUGH) != 0;
  negotiated_passthrough_ = passthrough;
  direct_io_mmap_ = (flags & FUSE_DIRECT_IO_ALLOW_MMAP) != 0;
  files_->SetNegotiated(passthrough, direct_io_mmap_);
  if (passthrough) out.max_stack_depth = 1;  // backing files on a plain (unstacked) file system
  proto_minor_ = out.minor;
  ReplyStruct(Channel{fd_}, h->unique, out);
  if (options_.fuse_uring && !(flags & kFuseOverIoUring)) {
    spdlog::warn(
        "fuse: --fuse-uring: {}; requests go through /dev/fuse",
        FuseUring::KernelAllows()
            ? "the kernel did not offer io_uring"
            : "io_uring is off in this kernel (echo Y > /sys/module/fuse/parameters/enable_uring)");
  }
  if (flags & kFuseOverIoUring) {
    // Requests block in the kernel until every CPU's queue has an entry: register now.
    auto u = FuseUring::Start(
        fd_, std::max<size_t>(kMaxWrite, size_t{out.max_pages} * 4096),
        options_.uring_threads_per_cpu,
        [this](const char* msg, size_t len, RingReply* reply) {
          thread_local ReplyScratch scratch;
          DispatchRequest(fs_, files_.get(), Channel{-1, reply}, msg, len, &scratch);
        },
        WakeThread);
    if (u.ok()) {
      uring_ = std::move(*u);
    } else {
      spdlog::warn("fuse: {}; requests go through /dev/fuse", std::string(u.status().message()));
    }
  }
  // Only now: the kernel clamps the readahead to the INIT reply's max_readahead when it reads it.
  if (options_.readahead_kb > 0) SetMountReadahead(mountpoint_, options_.readahead_kb);
  if (passthrough) {
    spdlog::info("fuse: kernel protocol 7.{}; passthrough on (resident files read by the kernel)",
                 in->minor);
  } else if (options_.passthrough) {
    spdlog::info(
        "fuse: kernel protocol 7.{}; this kernel has no FUSE passthrough, reads go "
        "through the daemon",
        in->minor);
  }
  return true;
}

KernelFuseState KernelFuse::SessionState() const {
  KernelFuseState s;
  s.fd = fd_;
  s.mountpoint = mountpoint_;
  s.proto_minor = proto_minor_;
  s.passthrough = negotiated_passthrough_;
  s.direct_io_mmap = direct_io_mmap_;
  s.peer_listen_fd = peer_listener_;
  return s;
}

void KernelFuse::Run() {
  InstallWakeHandler();  // before INIT: stopping ring threads uses it too
  if (adopted_) {
    // Requests a crashed predecessor had taken but not answered: the kernel queues them again.
    fuse_out_header h{sizeof(fuse_out_header), kNotifyResend, 0};
    if (write(fd_, &h, sizeof(h)) < 0 && errno != ENOENT) {
      spdlog::debug("fuse: asking the kernel to resend pending requests: {}", strerror(errno));
    }
  }
  if (!adopted_ && !HandleInit()) {
    unmounted_ = true;
    absl::MutexLock lock(&mu_);
    served_done_ = true;
    cv_.SignalAll();
    return;
  }
  if (supervisor_ >= 0) {
    absl::Status st = files_->ReportState(SessionState());
    if (!st.ok())
      spdlog::warn("fuse: the supervisor will not keep the mount: {}", std::string(st.message()));
  }
  const int threads = std::max(1, options_.max_threads);
  {
    // Counted before they start: a worker may end (unmounted) before the last one starts.
    absl::MutexLock lock(&mu_);
    live_workers_ = threads;
  }
  // Cloned fds spread requests over per-fd queues; but the kernel aborts the requests being
  // processed on a clone when it is closed, as when this process dies. Under a supervisor the
  // workers share the one fd it keeps too, so a crash leaves those requests to be resent.
  const bool clone = supervisor_ < 0;
  for (int i = 0; i < threads; i++) {
    int fd = clone ? open("/dev/fuse", O_RDWR | O_CLOEXEC) : -1;
    uint32_t master = static_cast<uint32_t>(fd_);
    if (!clone) {
      fd = dup(fd_);
    } else if (fd < 0 || ioctl(fd, FUSE_DEV_IOC_CLONE, &master) != 0) {
      if (fd >= 0) close(fd);
      if (i == 0) {
        spdlog::warn("fuse: cannot clone /dev/fuse ({}); one fd for all threads", strerror(errno));
      }
      fd = dup(fd_);
    }
    workers_.emplace_back([this, fd] {
      Serve(fd);
      close(fd);
      absl::MutexLock lock(&mu_);
      live_workers_--;
      cv_.SignalAll();
    });
  }
  mu_.Lock();
  while (live_workers_ > 0) {
    if (stopping_ || quiescing_) {
      // A signal that lands just before a worker enters read(2) is lost: repeat until all
      // have seen the flag (each finishes the request it holds first).
      mu_.Unlock();
      for (auto& t : workers_) WakeThread(t);
      mu_.Lock();
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(5));
    } else {
      cv_.Wait(&mu_);  // a worker ended (unmounted from outside), or Stop/Quiesce
    }
  }
  mu_.Unlock();
  StopUring();
  for (auto& t : workers_) t.join();
  workers_.clear();
  if (!quiescing_ && !stopping_) unmounted_ = true;  // unmounted from outside
  absl::MutexLock lock(&mu_);
  served_done_ = true;
  cv_.SignalAll();
}

void KernelFuse::StopUring() {
  if (uring_ == nullptr) return;
  uring_->Stop(WakeThread);
  spdlog::info("fuse: io_uring rings stopped after {} requests", uring_->requests());
}

void KernelFuse::Serve(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a dup shares the description's flags
  std::vector<char> buf(kRequestBuffer);
  ReplyScratch scratch;
  while (!stopping_ && !quiescing_) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;   // kWakeSignal from Run(): the loop checks why
      if (errno == ENOENT) continue;  // an interrupted request
      if (errno != ENODEV) spdlog::error("fuse: reading /dev/fuse: {}", strerror(errno));
      break;  // ENODEV: unmounted
    }
    DispatchRequest(fs_, files_.get(), Channel{fd}, buf.data(), static_cast<size_t>(n), &scratch);
    // Requests still queued stay for the successor (or end with the unmount).
    if (stopping_ || quiescing_) break;
  }
}

void KernelFuse::Stop() {
  if (stopping_.exchange(true)) return;
  if (!quiescing_ && !unmounted_) {
    LazyUnmount(mountpoint_);
    spdlog::info("mount: unmounted {}", mountpoint_);
  }
  absl::MutexLock lock(&mu_);
  cv_.SignalAll();  // Run() signals the workers out of read(2)
}

KernelFuseState KernelFuse::Quiesce() {
  quiescing_ = true;
  {
    absl::MutexLock lock(&mu_);
    cv_.SignalAll();
    // Run() ends once every worker has answered what it took.
    while (!served_done_) cv_.Wait(&mu_);
  }
  KernelFuseState s = SessionState();
  files_->Snapshot(&s);
  s.fd = dup(fd_);
  s.peer_listen_fd = -1;  // the agent hands its listener on itself, once it stops accepting
  return s;
}

}  // namespace ember::cachefs
