#define FUSE_USE_VERSION 312
#include "cachefs/fuse_kernel.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cachefs/errno.h"
#include "cachefs/takeover.h"
#include "common/metrics.h"

// Newer than Debian bookworm's linux/fuse.h (protocol 7.38): passthrough is 7.40.
#ifndef FUSE_PASSTHROUGH
#define FUSE_PASSTHROUGH (1ULL << 37)
#endif
#ifndef FUSE_DIRECT_IO_ALLOW_MMAP
#define FUSE_DIRECT_IO_ALLOW_MMAP (1ULL << 36)
#endif
#ifndef FOPEN_PASSTHROUGH
#define FOPEN_PASSTHROUGH (1 << 7)
#endif
constexpr int kNotifyResend = 7;  // FUSE_NOTIFY_RESEND (7.40): requeue requests being processed

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
  (void)installed;
}

void WakeThread(std::thread& t) { pthread_kill(t.native_handle(), kWakeSignal); }

constexpr uint32_t kOurMinor = 40;          // what we speak: 7.40 (passthrough)
constexpr uint32_t kMaxPages = 256;         // 1 MiB read requests
constexpr size_t kRequestBuffer = 1 << 17;  // a request: headers + a name; no writes come
constexpr size_t kMaxRead = kMaxPages * 4096;

// fuse_init_out and fuse_open_out as of 7.40 (the older header calls the new fields unused).
struct InitOut {
  uint32_t major, minor, max_readahead, flags;
  uint16_t max_background, congestion_threshold;
  uint32_t max_write, time_gran;
  uint16_t max_pages, map_alignment;
  uint32_t flags2, max_stack_depth;
  uint32_t unused[6];
};
static_assert(sizeof(InitOut) == sizeof(fuse_init_out));
struct OpenOut {
  uint64_t fh;
  uint32_t open_flags;
  int32_t backing_id;
};
static_assert(sizeof(OpenOut) == sizeof(fuse_open_out));
struct BackingMap {
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
constexpr unsigned long kIocBackingOpen = _IOW(229, 1, BackingMap);
constexpr unsigned long kIocBackingClose = _IOW(229, 2, uint32_t);

void SplitTimeout(double t, uint64_t* sec, uint32_t* nsec) {
  double whole = std::floor(t);
  *sec = static_cast<uint64_t>(whole);
  *nsec = static_cast<uint32_t>((t - whole) * 1e9);
}

void FillAttr(const Attr& a, fuse_attr* o) {
  std::memset(o, 0, sizeof(*o));
  o->ino = a.ino;
  o->size = a.size;
  o->blocks = (a.size + 511) / 512;
  o->mtime = o->atime = o->ctime = static_cast<uint64_t>(a.mtime_ns / 1'000'000'000);
  o->mtimensec = o->atimensec = o->ctimensec = static_cast<uint32_t>(a.mtime_ns % 1'000'000'000);
  o->mode = a.mode;
  o->nlink = a.nlink;
  o->uid = a.uid;
  o->gid = a.gid;
  o->blksize = 1 << 20;
}

void FillEntry(const Entry& e, fuse_entry_out* o) {
  std::memset(o, 0, sizeof(*o));
  o->nodeid = e.attr.ino;
  o->generation = 1;
  SplitTimeout(e.timeout_s, &o->entry_valid, &o->entry_valid_nsec);
  SplitTimeout(e.timeout_s, &o->attr_valid, &o->attr_valid_nsec);
  FillAttr(e.attr, &o->attr);
}

}  // namespace

// Where a request's reply goes: written to the /dev/fuse fd it was read from, or into the ring
// entry it came in (FuseUring).
struct KernelFuse::Channel {
  int fd = -1;
  RingReply* ring = nullptr;
};

namespace {

// One reply: the header and pieces (iov[0] is left for the header). ENOENT from the write means
// the request was interrupted meanwhile; nothing to do.
void ReplyIov(const KernelFuse::Channel& ch, uint64_t unique, int error, iovec* iov, size_t n) {
  fuse_out_header h;
  h.len = sizeof(h);
  for (size_t i = 1; i < n; i++) h.len += static_cast<uint32_t>(iov[i].iov_len);
  h.error = -error;
  h.unique = unique;
  if (ch.ring != nullptr) {
    size_t used = 0;
    for (size_t i = 1; i < n; i++) {
      if (used + iov[i].iov_len > ch.ring->capacity) {
        h.error = -EIO;
        used = 0;
        break;
      }
      if (iov[i].iov_base != ch.ring->payload + used) {
        std::memcpy(ch.ring->payload + used, iov[i].iov_base, iov[i].iov_len);
      }
      used += iov[i].iov_len;
    }
    h.len = static_cast<uint32_t>(sizeof(h) + used);
    std::memcpy(ch.ring->out_header, &h, sizeof(h));
    *ch.ring->payload_size = static_cast<uint32_t>(used);
    return;
  }
  iov[0] = {&h, sizeof(h)};
  if (writev(ch.fd, iov, static_cast<int>(n)) < 0 && errno != ENOENT) {
    spdlog::debug("fuse: reply to request {} failed: {}", unique, strerror(errno));
  }
}
void Reply(const KernelFuse::Channel& ch, uint64_t unique, int error,
           std::initializer_list<iovec> parts) {
  iovec iov[8];
  size_t n = 1;
  for (const iovec& p : parts) {
    if (p.iov_len == 0 || n == 8) continue;
    iov[n++] = p;
  }
  ReplyIov(ch, unique, error, iov, n);
}
void ReplyError(const KernelFuse::Channel& ch, uint64_t unique, int error) {
  Reply(ch, unique, error, {});
}
template <typename T>
void ReplyStruct(const KernelFuse::Channel& ch, uint64_t unique, const T& body) {
  Reply(ch, unique, 0, {iovec{const_cast<T*>(&body), sizeof(T)}});
}

// Per-operation counts and latency, into the same metric as the libfuse binding.
metrics::Histogram* OpHistogram(uint32_t opcode) {
  static std::mutex mu;
  static std::map<uint32_t, metrics::Histogram*> by_op;
  const char* name = nullptr;
  switch (opcode) {
    case FUSE_LOOKUP:
      name = "lookup";
      break;
    case FUSE_GETATTR:
      name = "getattr";
      break;
    case FUSE_READLINK:
      name = "readlink";
      break;
    case FUSE_OPEN:
      name = "open";
      break;
    case FUSE_READ:
      name = "read";
      break;
    case FUSE_RELEASE:
      name = "release";
      break;
    case FUSE_OPENDIR:
      name = "opendir";
      break;
    case FUSE_READDIR:
      name = "readdir";
      break;
    case FUSE_READDIRPLUS:
      name = "readdirplus";
      break;
    case FUSE_STATFS:
      name = "statfs";
      break;
    case FUSE_ACCESS:
      name = "access";
      break;
    default:
      return nullptr;
  }
  std::lock_guard lock(mu);
  auto& h = by_op[opcode];
  if (h == nullptr) h = FuseOpHistogram(name);
  return h;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelFuse>> KernelFuse::Mount(FileSystem* fs,
                                                              const std::string& mountpoint,
                                                              const MountOptions& options) {
  std::unique_ptr<KernelFuse> k(new KernelFuse());
  k->fs_ = fs;
  k->options_ = options;
  static const fuse_lowlevel_ops kNoOps = {};  // we read /dev/fuse ourselves
  auto session = MountSession(mountpoint, options, &kNoOps, nullptr, &k->mountpoint_);
  if (!session.ok()) return session.status();
  k->session_ = *session;
  k->fd_ = fuse_session_fd(k->session_);
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
  // Negotiated by the predecessor; the successor's flags may turn new passthrough opens off
  // (or on again) without a remount.
  k->passthrough_ = state.passthrough && options.passthrough;
  k->negotiated_passthrough_ = state.passthrough;
  k->direct_io_mmap_ = state.direct_io_mmap;
  k->next_fh_ = state.next_fh;
  // Re-derive what the predecessor held: a FileSystem handle per open file, and the pins of
  // every file the kernel reads through a backing file (they must not be evicted meanwhile).
  size_t pinned = 0;
  for (const auto& f : state.open_files) {
    Open o;
    o.ino = f.ino;
    o.passthrough = f.passthrough;
    Inode& in = k->inodes_[f.ino];
    if (f.passthrough) {
      in.passthrough_opens++;
      auto it = state.backing_ids.find(f.ino);
      if (it != state.backing_ids.end()) in.backing_id = it->second;
      if (!in.hold) {
        auto b = fs->OpenBacking(f.ino);
        if (b.ok()) {
          in.hold = b->hold;
          pinned++;
        } else {
          spdlog::error("takeover: cannot pin the blocks of open file (inode {}): {}", f.ino,
                        std::string(b.status().message()));
        }
      }
    } else {
      in.cached_opens++;
      auto h = fs->Open(f.ino, O_RDONLY);
      if (h.ok()) o.fs_handle = *h;  // else Read rebuilds from the inode
    }
    k->opens_[f.fh] = o;
  }
  spdlog::info(
      "mount: took over {} from the previous agent ({} open files, {} in passthrough, pinned)",
      k->mountpoint_, state.open_files.size(), pinned);
  return k;
}

KernelFuse::~KernelFuse() {
  Stop();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  {
    std::lock_guard lock(mu_);
    if (!quiescing_) {
      for (auto& [ino, in] : inodes_) CloseBacking(in.backing_id);
    }
    for (auto& [fh, o] : opens_) {
      if (!o.passthrough && o.fs_handle != 0) fs_->Release(o.fs_handle);
    }
  }
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
                  FUSE_PARALLEL_DIROPS | FUSE_MAX_PAGES | FUSE_CACHE_SYMLINKS | FUSE_INIT_EXT;
  if (options_.direct_io) want |= FUSE_ASYNC_DIO | FUSE_DIRECT_IO_ALLOW_MMAP;
  if (options_.passthrough) want |= FUSE_PASSTHROUGH;
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
  out.max_write = 4096;  // read-only: no writes come
  out.time_gran = 1;
  out.max_pages = kMaxPages;
  passthrough_ = (flags & FUSE_PASSTHROUGH) != 0;
  negotiated_passthrough_ = passthrough_;
  direct_io_mmap_ = (flags & FUSE_DIRECT_IO_ALLOW_MMAP) != 0;
  if (passthrough_) out.max_stack_depth = 1;  // backing files on a plain (unstacked) file system
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
        fd_, kMaxRead, options_.uring_threads_per_cpu,
        [this](const char* msg, size_t len, RingReply* reply) {
          thread_local std::vector<char> scratch;
          Dispatch(Channel{-1, reply}, msg, len, &scratch);
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
  if (passthrough_) {
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
    std::lock_guard lock(mu_);
    served_done_ = true;
    served_cv_.notify_all();
    return;
  }
  if (supervisor_ >= 0) {
    std::lock_guard lock(mu_);
    absl::Status st = SendStateMessage(supervisor_, StateLocked());
    if (!st.ok())
      spdlog::warn("fuse: the supervisor will not keep the mount: {}", std::string(st.message()));
  }
  const int threads = std::max(1, options_.max_threads);
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
      std::lock_guard lock(workers_mu_);
      live_workers_--;
      workers_cv_.notify_all();
    });
  }
  {
    std::unique_lock lock(workers_mu_);
    live_workers_ = static_cast<int>(workers_.size());
    while (live_workers_ > 0) {
      if (stopping_ || quiescing_) {
        // A signal that lands just before a worker enters read(2) is lost: repeat until all
        // have seen the flag (each finishes the request it holds first).
        lock.unlock();
        for (auto& t : workers_) WakeThread(t);
        lock.lock();
        workers_cv_.wait_for(lock, std::chrono::milliseconds(5));
      } else {
        workers_cv_.wait(lock);  // a worker ended (unmounted from outside), or Stop/Quiesce
      }
    }
  }
  StopUring();
  for (auto& t : workers_) t.join();
  workers_.clear();
  if (!quiescing_ && !stopping_) unmounted_ = true;  // unmounted from outside
  std::lock_guard lock(mu_);
  served_done_ = true;
  served_cv_.notify_all();
}

void KernelFuse::StopUring() {
  if (uring_ == nullptr) return;
  uring_->Stop(WakeThread);
  spdlog::info("fuse: io_uring rings stopped after {} requests", uring_->requests());
}

void KernelFuse::Serve(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a dup shares the description's flags
  std::vector<char> buf(kRequestBuffer);
  std::vector<char> scratch;
  while (!stopping_ && !quiescing_) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;   // kWakeSignal from Run(): the loop checks why
      if (errno == ENOENT) continue;  // an interrupted request
      if (errno != ENODEV) spdlog::error("fuse: reading /dev/fuse: {}", strerror(errno));
      break;  // ENODEV: unmounted
    }
    Dispatch(Channel{fd}, buf.data(), static_cast<size_t>(n), &scratch);
    // Requests still queued stay for the successor (or end with the unmount).
    if (stopping_ || quiescing_) break;
  }
}

void KernelFuse::Dispatch(const Channel& fd, const char* msg, size_t len,
                          std::vector<char>* scratch) {
  if (len < sizeof(fuse_in_header)) return;
  const auto* h = reinterpret_cast<const fuse_in_header*>(msg);
  const char* arg = msg + sizeof(*h);
  const size_t arg_len = std::min<size_t>(len, h->len) - sizeof(*h);
  const uint64_t u = h->unique;
  metrics::Timer timer(OpHistogram(h->opcode));
  auto need = [&](size_t n) {
    if (arg_len >= n) return true;
    ReplyError(fd, u, EINVAL);
    return false;
  };
  switch (h->opcode) {
    case FUSE_LOOKUP: {
      std::string name(arg, strnlen(arg, arg_len));
      auto e = fs_->Lookup(h->nodeid, name);
      fuse_entry_out out;
      if (!e.ok()) {
        int err = ToErrno(e.status());
        if (err == ENOENT && h->nodeid != kRootIno) {
          // Negative entries are cacheable below the root: manifests never change.
          std::memset(&out, 0, sizeof(out));
          out.entry_valid = 3600;
          ReplyStruct(fd, u, out);
        } else {
          ReplyError(fd, u, err);
        }
        return;
      }
      FillEntry(*e, &out);
      ReplyStruct(fd, u, out);
      return;
    }
    case FUSE_FORGET:
    case FUSE_BATCH_FORGET:
    case FUSE_INTERRUPT:
      return;  // no reply; inode numbers are stable and requests short
    case FUSE_GETATTR: {
      auto e = fs_->GetAttr(h->nodeid);
      if (!e.ok()) return ReplyError(fd, u, ToErrno(e.status()));
      fuse_attr_out out;
      std::memset(&out, 0, sizeof(out));
      SplitTimeout(e->timeout_s, &out.attr_valid, &out.attr_valid_nsec);
      FillAttr(e->attr, &out.attr);
      return ReplyStruct(fd, u, out);
    }
    case FUSE_READLINK: {
      auto t = fs_->ReadLink(h->nodeid);
      if (!t.ok()) return ReplyError(fd, u, ToErrno(t.status()));
      return Reply(fd, u, 0, {iovec{t->data(), t->size()}});
    }
    case FUSE_OPEN: {
      if (!need(sizeof(fuse_open_in))) return;
      const auto* in = reinterpret_cast<const fuse_open_in*>(arg);
      OpenOut out;
      std::memset(&out, 0, sizeof(out));
      int err = OpenFile(h->nodeid, static_cast<int>(in->flags), &out.fh, &out.open_flags,
                         &out.backing_id);
      if (err != 0) return ReplyError(fd, u, err);
      return ReplyStruct(fd, u, out);
    }
    case FUSE_READ: {
      if (!need(sizeof(fuse_read_in))) return;
      const auto* in = reinterpret_cast<const fuse_read_in*>(arg);
      uint64_t fs_handle = 0;
      {
        std::lock_guard lock(mu_);
        auto it = opens_.find(in->fh);
        if (it != opens_.end()) fs_handle = it->second.fs_handle;
      }
      auto r = fs_->Read(h->nodeid, fs_handle, in->offset, std::min<size_t>(in->size, kMaxRead));
      if (!r.ok()) return ReplyError(fd, u, ToErrno(r.status()));
      // Bytes in memory go out as they are; bytes in cache files are read into a buffer (the
      // ring entry's payload, when the request came through one: no copy after).
      std::vector<iovec> iov(1);
      const bool in_payload = fd.ring != nullptr && r->total <= fd.ring->capacity;
      if (!in_payload && scratch->size() < r->total) scratch->resize(std::max(r->total, kMaxRead));
      char* base = in_payload ? fd.ring->payload : scratch->data();
      size_t used = 0;
      for (const auto& s : r->segments) {
        if (s.fd >= 0) {
          char* dst = base + used;
          size_t got = 0;
          while (got < s.len) {
            ssize_t k = pread(s.fd, dst + got, s.len - got, static_cast<off_t>(s.pos + got));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) return ReplyError(fd, u, EIO);
            got += static_cast<size_t>(k);
          }
          iov.push_back({dst, s.len});
          used += s.len;
        } else {
          iov.push_back({const_cast<char*>(s.mem->data() + s.mem_off), s.len});
          if (in_payload) used += s.len;  // laid out in order: ReplyIov copies it there
        }
      }
      ReplyIov(fd, u, 0, iov.data(), iov.size());
      return;  // *r (pins) released here, after the kernel has the bytes
    }
    case FUSE_RELEASE: {
      if (!need(sizeof(fuse_release_in))) return;
      ReleaseFile(reinterpret_cast<const fuse_release_in*>(arg)->fh);
      return ReplyError(fd, u, 0);
    }
    case FUSE_OPENDIR: {
      auto e = fs_->GetAttr(h->nodeid);
      if (!e.ok()) return ReplyError(fd, u, ToErrno(e.status()));
      if (!S_ISDIR(e->attr.mode)) return ReplyError(fd, u, ENOTDIR);
      OpenOut out;
      std::memset(&out, 0, sizeof(out));
      if (h->nodeid != kRootIno) out.open_flags = FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE;
      return ReplyStruct(fd, u, out);
    }
    case FUSE_READDIR:
    case FUSE_READDIRPLUS: {
      if (!need(sizeof(fuse_read_in))) return;
      const auto* in = reinterpret_cast<const fuse_read_in*>(arg);
      const bool plus = h->opcode == FUSE_READDIRPLUS;
      const size_t size = std::min<size_t>(in->size, kMaxRead);
      if (scratch->size() < size) scratch->resize(std::max(size, kMaxRead));
      char* buf = scratch->data();
      size_t used = 0;
      absl::Status st = fs_->ReadDir(
          h->nodeid, in->offset, [&](const std::string& name, const Attr& attr, uint64_t next) {
            size_t rec = plus ? FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET_DIRENTPLUS + name.size())
                              : FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET + name.size());
            if (used + rec > size) return false;
            char* p = buf + used;
            std::memset(p, 0, rec);
            fuse_dirent* d;
            if (plus) {
              auto* dp = reinterpret_cast<fuse_direntplus*>(p);
              bool dots = name == "." || name == "..";
              if (attr.complete && !dots) {
                FillEntry(Entry{attr, 3600}, &dp->entry_out);
              }  // else nodeid 0: the kernel looks it up itself
              d = &dp->dirent;
            } else {
              d = reinterpret_cast<fuse_dirent*>(p);
            }
            d->ino = attr.ino;
            d->off = next;
            d->namelen = static_cast<uint32_t>(name.size());
            d->type = (attr.mode & S_IFMT) >> 12;
            std::memcpy(d->name, name.data(), name.size());
            used += rec;
            return true;
          });
      if (!st.ok()) return ReplyError(fd, u, ToErrno(st));
      return Reply(fd, u, 0, {iovec{buf, used}});
    }
    case FUSE_RELEASEDIR:
      return ReplyError(fd, u, 0);
    case FUSE_STATFS: {
      FsStats s = fs_->StatFs();
      fuse_statfs_out out;
      std::memset(&out, 0, sizeof(out));
      out.st.bsize = 4096;
      out.st.frsize = 4096;
      out.st.blocks = (s.total_bytes + 4095) / 4096;
      out.st.files = s.files;
      out.st.namelen = 255;
      return ReplyStruct(fd, u, out);
    }
    case FUSE_ACCESS: {
      if (!need(sizeof(fuse_access_in))) return;
      int mask = static_cast<int>(reinterpret_cast<const fuse_access_in*>(arg)->mask);
      return ReplyError(fd, u, (mask & W_OK) ? EROFS : 0);
    }
    case FUSE_DESTROY:
      return ReplyError(fd, u, 0);
    case FUSE_INIT:
      return ReplyError(fd, u, EPROTO);  // only once, answered by HandleInit
    case FUSE_SETATTR:
    case FUSE_SYMLINK:
    case FUSE_MKNOD:
    case FUSE_MKDIR:
    case FUSE_UNLINK:
    case FUSE_RMDIR:
    case FUSE_RENAME:
    case FUSE_RENAME2:
    case FUSE_LINK:
    case FUSE_WRITE:
    case FUSE_CREATE:
    case FUSE_SETXATTR:
    case FUSE_REMOVEXATTR:
    case FUSE_FALLOCATE:
    case FUSE_TMPFILE:
      return ReplyError(fd, u, EROFS);
    default:
      // FLUSH, FSYNC, GETXATTR, LISTXATTR, LSEEK, POLL, IOCTL, STATX, ...: not implemented; the
      // kernel remembers and stops asking (or falls back, as for STATX -> GETATTR).
      return ReplyError(fd, u, ENOSYS);
  }
}

int KernelFuse::OpenFile(uint64_t ino, int flags, uint64_t* fh, uint32_t* open_flags,
                         int32_t* backing_id) {
  auto h = fs_->Open(ino, flags);
  if (!h.ok()) return ToErrno(h.status());
  // Passthrough while no open file of this inode goes through us (the kernel refuses to mix the
  // two on one inode), and only for files whose blocks are all resident (then pinned). Pinning
  // (and verifying after a restart) happens outside the lock.
  bool try_backing;
  {
    std::lock_guard lock(mu_);
    const Inode& in = inodes_[ino];
    try_backing = passthrough_ && in.cached_opens == 0 && in.backing_id == 0;
  }
  absl::StatusOr<FileSystem::Backing> backing = absl::NotFoundError("not tried");
  if (try_backing) backing = fs_->OpenBacking(ino);
  std::lock_guard lock(mu_);
  Inode& in = inodes_[ino];
  Open o;
  o.ino = ino;
  if (passthrough_ && in.cached_opens == 0) {
    if (in.backing_id == 0 && backing.ok()) {
      BackingMap map{backing->fd, 0, 0};
      int id = ioctl(fd_, kIocBackingOpen, &map);
      if (id > 0) {
        in.backing_id = id;
        in.hold = backing->hold;
      } else {
        spdlog::warn("fuse: passthrough unavailable ({}); reads go through the daemon",
                     strerror(errno));
        passthrough_ = false;
      }
    }
    if (in.backing_id > 0) {
      o.passthrough = true;
      in.passthrough_opens++;
      *open_flags = FOPEN_PASSTHROUGH;
      *backing_id = in.backing_id;
    }
  }
  if (!o.passthrough) {
    in.cached_opens++;
    // Contents never change: later opens keep the page cache. With --direct-io (and
    // passthrough, so cached files still get a page cache: their backing file's), a file not
    // yet wholly cached is read without the mount's page cache: the reply lands in the reader's
    // buffer. Off by default: it also turns off the kernel's readahead, so a reader with 4-8 KiB
    // reads makes one round trip per read. Needs the kernel's mmap support for such files.
    *open_flags =
        options_.direct_io && passthrough_ && direct_io_mmap_ ? FOPEN_DIRECT_IO : FOPEN_KEEP_CACHE;
    o.fs_handle = *h;
    daemon_opens_++;
  } else {
    fs_->Release(*h);  // the kernel reads the backing file; no handle needed here
    passthrough_opens_++;
  }
  *fh = next_fh_++;
  opens_[*fh] = o;
  if (supervisor_ >= 0) {
    // Every open: a successor must know which inodes the kernel has open through us, as it
    // refuses passthrough opens of those.
    SendOpenUpdate(supervisor_, true, {*fh, ino, o.passthrough}, in.backing_id);
  }
  return 0;
}

void KernelFuse::ReleaseFile(uint64_t fh) {
  std::shared_ptr<const void> unpin;  // released outside the lock
  std::lock_guard lock(mu_);
  auto it = opens_.find(fh);
  if (it == opens_.end()) return;
  Open o = it->second;
  opens_.erase(it);
  if (supervisor_ >= 0) SendOpenUpdate(supervisor_, false, {fh, o.ino, o.passthrough}, 0);
  auto in = inodes_.find(o.ino);
  if (!o.passthrough && o.fs_handle != 0) fs_->Release(o.fs_handle);
  if (in == inodes_.end()) return;
  if (o.passthrough) {
    if (--in->second.passthrough_opens == 0) {
      CloseBacking(in->second.backing_id);
      unpin = std::move(in->second.hold);
      in->second.backing_id = 0;
    }
  } else if (in->second.cached_opens > 0) {
    in->second.cached_opens--;
  }
  if (in->second.passthrough_opens == 0 && in->second.cached_opens == 0) inodes_.erase(in);
}

void KernelFuse::CloseBacking(int32_t id) {
  if (id <= 0) return;
  uint32_t v = static_cast<uint32_t>(id);
  if (ioctl(fd_, kIocBackingClose, &v) != 0) {
    spdlog::debug("fuse: closing backing id {}: {}", id, strerror(errno));
  }
}

void KernelFuse::Stop() {
  if (stopping_.exchange(true)) return;
  if (!quiescing_ && !unmounted_) {
    LazyUnmount(mountpoint_);
    spdlog::info("mount: unmounted {}", mountpoint_);
  }
  std::lock_guard lock(workers_mu_);
  workers_cv_.notify_all();  // Run() signals the workers out of read(2)
}

KernelFuseState KernelFuse::Quiesce() {
  quiescing_ = true;
  {
    std::lock_guard lock(workers_mu_);
    workers_cv_.notify_all();
  }
  {
    // Run() ends once every worker has answered what it took.
    std::unique_lock lock(mu_);
    served_cv_.wait(lock, [&] { return served_done_; });
  }
  std::lock_guard lock(mu_);
  KernelFuseState s = StateLocked();
  s.fd = dup(fd_);
  return s;
}

KernelFuseState KernelFuse::StateLocked() {
  KernelFuseState s;
  s.fd = fd_;
  s.mountpoint = mountpoint_;
  s.proto_minor = proto_minor_;
  s.passthrough = negotiated_passthrough_;
  s.direct_io_mmap = direct_io_mmap_;
  s.next_fh = next_fh_;
  for (const auto& [fh, o] : opens_) s.open_files.push_back({fh, o.ino, o.passthrough});
  for (const auto& [ino, in] : inodes_) {
    if (in.backing_id > 0) s.backing_ids[ino] = in.backing_id;
  }
  return s;
}

KernelFuse::Stats KernelFuse::GetStats() {
  Stats s;
  s.passthrough = passthrough_;
  s.passthrough_opens = passthrough_opens_;
  s.daemon_opens = daemon_opens_;
  std::lock_guard lock(mu_);
  for (const auto& [ino, in] : inodes_) {
    if (in.backing_id > 0) s.passthrough_files_open++;
  }
  return s;
}

}  // namespace ember::cachefs
