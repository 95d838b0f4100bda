#define FUSE_USE_VERSION 312
#include "cachefs/fuse/libfuse_binding.h"

#include <fuse3/fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "cachefs/fuse/errno.h"
#include "cachefs/fuse/mount_session.h"
#include "common/metrics.h"

namespace ember::cachefs {
namespace {

FileSystem* Fs(fuse_req_t req) { return static_cast<FileSystem*>(fuse_req_userdata(req)); }
// The FileSystem's handle of an open file, kept in the kernel's file from OPEN to RELEASE.
FileSystem::FileHandle* Handle(const fuse_file_info* fi) {
  return reinterpret_cast<FileSystem::FileHandle*>(fi->fh);
}

void FillStat(const Attr& a, struct stat* st) {
  std::memset(st, 0, sizeof(*st));
  st->st_ino = a.ino;
  st->st_mode = a.mode;
  st->st_nlink = a.nlink;
  st->st_uid = a.uid;
  st->st_gid = a.gid;
  st->st_size = static_cast<off_t>(a.size);
  st->st_blksize = PreferredIoSize(a.size);
  st->st_blocks = static_cast<blkcnt_t>((a.size + 511) / 512);
  st->st_mtim.tv_sec = a.mtime_ns / 1'000'000'000;
  st->st_mtim.tv_nsec = a.mtime_ns % 1'000'000'000;
  st->st_atim = st->st_mtim;
  st->st_ctim = st->st_mtim;
}

void FillEntry(const Entry& e, fuse_entry_param* p) {
  std::memset(p, 0, sizeof(*p));
  p->ino = e.attr.ino;
  p->generation = 1;
  p->attr_timeout = e.timeout_s;
  p->entry_timeout = e.timeout_s;
  FillStat(e.attr, &p->attr);
}

// Per-operation request counts and latency (until the reply) for /metrics: one histogram per
// operation, looked up once per call site.
#define EMBER_FUSE_OP(op)                                              \
  static metrics::Histogram* const op_histogram = FuseOpHistogram(op); \
  metrics::Timer op_timer(op_histogram)

std::atomic<bool> g_readdirplus{false};  // MountOptions::readdirplus of the libfuse mount

void OpInit(void* userdata, fuse_conn_info* conn) {
  // Zero-copy replies from cache files, and large read requests.
  if (conn->capable & FUSE_CAP_SPLICE_WRITE) conn->want |= FUSE_CAP_SPLICE_WRITE;
  if (conn->capable & FUSE_CAP_SPLICE_MOVE) conn->want |= FUSE_CAP_SPLICE_MOVE;
  if (g_readdirplus && (conn->capable & FUSE_CAP_READDIRPLUS)) {
    conn->want |= FUSE_CAP_READDIRPLUS;
  } else {
    conn->want &= ~FUSE_CAP_READDIRPLUS;
  }
  conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
  conn->max_write = 1 << 20;  // also raises max_pages, so reads come in 1 MiB requests
  conn->max_readahead = 1 << 20;
  conn->max_background = 64;
}

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  EMBER_FUSE_OP("lookup");
  auto e = Fs(req)->Lookup(parent, name);
  if (!e.ok()) {
    if (IsAbsentEntry(e.status()) && parent != kRootIno) {
      // A name certainly absent from an immutable directory: a negative entry the kernel keeps.
      fuse_entry_param p;
      std::memset(&p, 0, sizeof(p));
      p.entry_timeout = kAbsentEntryTimeoutS;
      fuse_reply_entry(req, &p);
      return;
    }
    fuse_reply_err(req, LookupErrno(name, e.status()));
    return;
  }
  fuse_entry_param p;
  FillEntry(*e, &p);
  fuse_reply_entry(req, &p);
}

void OpForget(fuse_req_t req, fuse_ino_t, uint64_t) { fuse_reply_none(req); }

void OpForgetMulti(fuse_req_t req, size_t, fuse_forget_data*) { fuse_reply_none(req); }

void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  EMBER_FUSE_OP("getattr");
  auto e = Fs(req)->GetAttr(ino);
  if (!e.ok()) {
    fuse_reply_err(req, ToErrno(e.status()));
    return;
  }
  struct stat st;
  FillStat(e->attr, &st);
  fuse_reply_attr(req, &st, e->timeout_s);
}

void OpReadlink(fuse_req_t req, fuse_ino_t ino) {
  EMBER_FUSE_OP("readlink");
  auto t = Fs(req)->ReadLink(ino);
  if (!t.ok()) {
    fuse_reply_err(req, ToErrno(t.status()));
    return;
  }
  fuse_reply_readlink(req, t->c_str());
}

void OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  EMBER_FUSE_OP("opendir");
  auto e = Fs(req)->GetAttr(ino);
  if (!e.ok()) {
    fuse_reply_err(req, ToErrno(e.status()));
    return;
  }
  if (!S_ISDIR(e->attr.mode)) {
    fuse_reply_err(req, ENOTDIR);
    return;
  }
  fi->cache_readdir = ino != kRootIno;  // manifests are immutable
  fi->keep_cache = ino != kRootIno;
  fuse_reply_open(req, fi);
}

void DoReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  std::vector<char> buf(size);
  size_t used = 0;
  absl::Status st = Fs(req)->ReadDir(
      ino, static_cast<uint64_t>(off),
      [&](const std::string& name, const Attr& attr, uint64_t next) {
        size_t n;
        if (plus) {
          fuse_entry_param p;
          std::memset(&p, 0, sizeof(p));
          bool dots = name == "." || name == "..";
          if (attr.complete && !dots) {
            FillEntry(Entry{attr, 3600}, &p);
          } else {
            p.attr.st_ino = attr.ino;
            p.attr.st_mode = attr.mode;  // ino 0: the kernel will look it up itself
          }
          n = fuse_add_direntry_plus(req, buf.data() + used, size - used, name.c_str(), &p,
                                     static_cast<off_t>(next));
        } else {
          struct stat s;
          std::memset(&s, 0, sizeof(s));
          s.st_ino = attr.ino;
          s.st_mode = attr.mode;
          n = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &s,
                                static_cast<off_t>(next));
        }
        if (n > size - used) return false;
        used += n;
        return true;
      });
  if (!st.ok()) {
    fuse_reply_err(req, ToErrno(st));
    return;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  EMBER_FUSE_OP("readdir");
  DoReaddir(req, ino, size, off, false);
}

void OpReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  EMBER_FUSE_OP("readdirplus");
  DoReaddir(req, ino, size, off, true);
}

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  EMBER_FUSE_OP("open");
  auto h = Fs(req)->Open(ino, fi->flags);
  if (!h.ok()) {
    fuse_reply_err(req, ToErrno(h.status()));
    return;
  }
  fi->fh = reinterpret_cast<uint64_t>(h->release());  // deleted at RELEASE
  fi->keep_cache = 1;  // contents never change: later opens keep the page cache
  fuse_reply_open(req, fi);
}

void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  EMBER_FUSE_OP("read");
  // Bytes from the cache are copied (checked) into this thread's buffer; filled bytes stay in
  // their fill's buffer.
  thread_local std::vector<char> buffer;
  if (buffer.size() < size) buffer.resize(size);
  auto r = Fs(req)->Read(ino, Handle(fi), static_cast<uint64_t>(off), size, buffer.data());
  if (!r.ok()) {
    fuse_reply_err(req, ToErrno(r.status()));
    return;
  }
  std::vector<iovec> iov;
  iov.reserve(r->segments.size());
  for (const auto& s : r->segments) iov.push_back({const_cast<char*>(s.data), s.len});
  fuse_reply_iov(req, iov.data(), static_cast<int>(iov.size()));
  // *r (and the block holds in it) is released only now, after the kernel has the bytes.
}

void OpRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  EMBER_FUSE_OP("release");
  delete Handle(fi);
  fuse_reply_err(req, 0);
}

void OpStatfs(fuse_req_t req, fuse_ino_t) {
  EMBER_FUSE_OP("statfs");
  FsStats s = Fs(req)->StatFs();
  struct statvfs st;
  std::memset(&st, 0, sizeof(st));
  st.f_bsize = 4096;
  st.f_frsize = 4096;
  st.f_blocks = (s.total_bytes + 4095) / 4096;
  st.f_files = s.files;
  st.f_namemax = 255;
  st.f_flag = ST_RDONLY;
  fuse_reply_statfs(req, &st);
}

void OpAccess(fuse_req_t req, fuse_ino_t, int mask) {
  EMBER_FUSE_OP("access");
  fuse_reply_err(req, (mask & W_OK) ? EROFS : 0);
}

const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops ops;
  std::memset(&ops, 0, sizeof(ops));
  ops.init = OpInit;
  ops.lookup = OpLookup;
  ops.forget = OpForget;
  ops.forget_multi = OpForgetMulti;
  ops.getattr = OpGetattr;
  ops.readlink = OpReadlink;
  ops.opendir = OpOpendir;
  ops.readdir = OpReaddir;
  ops.readdirplus = OpReaddirplus;
  ops.open = OpOpen;
  ops.read = OpRead;
  ops.release = OpRelease;
  ops.statfs = OpStatfs;
  ops.access = OpAccess;
  return ops;
}();

}  // namespace

absl::StatusOr<std::unique_ptr<FuseMount>> FuseMount::Mount(FileSystem* fs,
                                                            const std::string& mountpoint,
                                                            const MountOptions& options) {
  std::unique_ptr<FuseMount> m(new FuseMount());
  m->fs_ = fs;
  m->options_ = options;
  g_readdirplus = options.readdirplus;
  auto session = MountSession(mountpoint, options, /*writable=*/false, &kOps, fs, &m->mountpoint_);
  if (!session.ok()) return session.status();
  m->session_ = *session;
  spdlog::info("mount: serving datasets at {} (libfuse)", m->mountpoint_);
  return m;
}

FuseMount::~FuseMount() {
  Stop();
  if (session_ != nullptr) {
    fuse_session_unmount(session_);
    fuse_session_destroy(session_);
  }
}

void FuseMount::Run() {
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(cfg, 1);
  fuse_loop_cfg_set_max_threads(cfg, options_.max_threads);
  fuse_loop_cfg_set_idle_threads(cfg, 4);
  fuse_session_loop_mt(session_, cfg);
  fuse_loop_cfg_destroy(cfg);
  unmounted_ = true;
}

void FuseMount::Stop() {
  if (stopping_.exchange(true) || session_ == nullptr) return;
  fuse_session_exit(session_);
  // Unmounting aborts the connection, which wakes the loop's threads blocked on /dev/fuse.
  if (!unmounted_) LazyUnmount(mountpoint_);
  spdlog::info("mount: unmounted {}", mountpoint_);
}

}  // namespace ember::cachefs
