#define FUSE_USE_VERSION 312
#include "cachefs/fuse_mount.h"

#include <fuse3/fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachefs/errno.h"
#include "common/metrics.h"

namespace ember::cachefs {
namespace {

FileSystem* Fs(fuse_req_t req) { return static_cast<FileSystem*>(fuse_req_userdata(req)); }

void FillStat(const Attr& a, struct stat* st) {
  std::memset(st, 0, sizeof(*st));
  st->st_ino = a.ino;
  st->st_mode = a.mode;
  st->st_nlink = a.nlink;
  st->st_uid = a.uid;
  st->st_gid = a.gid;
  st->st_size = static_cast<off_t>(a.size);
  st->st_blksize = 1 << 20;
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
    int err = ToErrno(e.status());
    if (err == ENOENT) {
      // Negative entries are cacheable below the root: manifests never change.
      fuse_entry_param p;
      std::memset(&p, 0, sizeof(p));
      p.entry_timeout = parent == kRootIno ? 0 : 3600;
      fuse_reply_entry(req, &p);
      return;
    }
    fuse_reply_err(req, err);
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
  fi->fh = *h;
  fi->keep_cache = 1;  // contents never change: later opens keep the page cache
  fuse_reply_open(req, fi);
}

void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  EMBER_FUSE_OP("read");
  auto r = Fs(req)->Read(ino, fi->fh, static_cast<uint64_t>(off), size);
  if (!r.ok()) {
    fuse_reply_err(req, ToErrno(r.status()));
    return;
  }
  const auto& segs = r->segments;
  if (segs.empty()) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  // A bufvec with one fuse_buf per segment; fd segments are spliced by the kernel.
  std::vector<char> storage(sizeof(fuse_bufvec) + segs.size() * sizeof(fuse_buf));
  auto* bv = reinterpret_cast<fuse_bufvec*>(storage.data());
  bv->count = segs.size();
  bv->idx = 0;
  bv->off = 0;
  for (size_t i = 0; i < segs.size(); i++) {
    fuse_buf& b = bv->buf[i];
    std::memset(&b, 0, sizeof(b));
    b.size = segs[i].len;
    if (segs[i].fd >= 0) {
      b.flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
      b.fd = segs[i].fd;
      b.pos = static_cast<off_t>(segs[i].pos);
    } else {
      b.mem = const_cast<char*>(segs[i].mem->data() + segs[i].mem_off);
    }
  }
  fuse_reply_data(req, bv, FUSE_BUF_SPLICE_MOVE);
  // *r (and the pins it holds) is released only now, after the kernel has the bytes.
}

void OpRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  EMBER_FUSE_OP("release");
  Fs(req)->Release(fi->fh);
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

bool IsMountpoint(const std::string& path) {
  std::ifstream f("/proc/self/mountinfo");
  std::string line;
  while (std::getline(f, line)) {
    // Field 5 is the mount point (octal escapes for spaces).
    size_t pos = 0;
    for (int i = 0; i < 4 && pos != std::string::npos; i++) pos = line.find(' ', pos + 1);
    if (pos == std::string::npos) continue;
    size_t end = line.find(' ', pos + 1);
    if (line.substr(pos + 1, end - pos - 1) == path) return true;
  }
  return false;
}

}  // namespace

void LazyUnmount(const std::string& mountpoint) {
  if (umount2(mountpoint.c_str(), MNT_DETACH) == 0) return;
  // Not root: ask the setuid helper.
  pid_t pid = fork();
  if (pid == 0) {
    execlp("fusermount3", "fusermount3", "-u", "-z", "-q", mountpoint.c_str(), nullptr);
    _exit(127);
  }
  if (pid > 0) waitpid(pid, nullptr, 0);
}

metrics::Histogram* FuseOpHistogram(const std::string& op) {
  return metrics::Global().GetHistogram(
      "ember_fuse_request_seconds", "FUSE requests by operation, until the reply.", {{"op", op}});
}

absl::Status PrepareMountpoint(const std::string& mountpoint) {
  struct stat st;
  if (stat(mountpoint.c_str(), &st) != 0) {
    if (errno == ENOTCONN || errno == ECONNABORTED) {
      spdlog::warn(
          "mount: {} is a stale FUSE mount (Transport endpoint is not connected); "
          "unmounting it",
          mountpoint);
      LazyUnmount(mountpoint);
      if (stat(mountpoint.c_str(), &st) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("mountpoint ", mountpoint,
                         " is a stale mount that could not be removed: ", strerror(errno)));
      }
    } else if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("mountpoint ", mountpoint, " does not exist"));
    } else {
      return absl::FailedPreconditionError(
          absl::StrCat("mountpoint ", mountpoint, ": ", strerror(errno)));
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("mountpoint ", mountpoint, " is not a directory"));
  }
  if (IsMountpoint(mountpoint)) {
    // stat() may be answered from cached attributes; statfs always asks the file system.
    struct statvfs vfs;
    if (statvfs(mountpoint.c_str(), &vfs) != 0 && (errno == ENOTCONN || errno == ECONNABORTED)) {
      spdlog::warn(
          "mount: {} is a stale FUSE mount (Transport endpoint is not connected); "
          "unmounting it",
          mountpoint);
      LazyUnmount(mountpoint);
    }
    if (IsMountpoint(mountpoint)) {
      return absl::FailedPreconditionError(
          absl::StrCat("mountpoint ", mountpoint, " is busy: something is already mounted there"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<fuse_session*> MountSession(const std::string& mountpoint,
                                           const MountOptions& options,
                                           const fuse_lowlevel_ops* ops, void* userdata,
                                           std::string* resolved_mp) {
  char resolved[PATH_MAX];
  if (realpath(mountpoint.c_str(), resolved) == nullptr) {
    // PrepareMountpoint explains the common cases.
    absl::Status st = PrepareMountpoint(mountpoint);
    if (!st.ok()) return st;
    return absl::FailedPreconditionError(
        absl::StrCat("mountpoint ", mountpoint, ": ", strerror(errno)));
  }
  std::string mp = resolved;
  absl::Status prep = PrepareMountpoint(mp);
  if (!prep.ok()) return prep;
  std::vector<std::string> args = {"ember", "-o",
                                   "ro,default_permissions,fsname=ember,subtype=ember"};
  if (options.allow_other) {
    args.push_back("-o");
    args.push_back("allow_other");
  }
  if (options.debug) args.push_back("-d");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* session = fuse_session_new(&fargs, ops, sizeof(*ops), userdata);
  fuse_opt_free_args(&fargs);  // libfuse may have copied them
  if (session == nullptr) return absl::InternalError("fuse_session_new failed");
  if (fuse_session_mount(session, mp.c_str()) != 0) {
    fuse_session_destroy(session);
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot mount FUSE at ", mp, " (is /dev/fuse available and fuse3 installed?)"));
  }
  *resolved_mp = mp;
  return session;
}

bool SetMountReadahead(const std::string& mountpoint, uint32_t kb) {
  std::ifstream mi("/proc/self/mountinfo");
  std::string line, dev;
  while (std::getline(mi, line)) {
    // "ID PARENT MAJ:MIN ROOT MOUNTPOINT ...": the last match wins (the newest mount on top).
    std::istringstream f(line);
    std::string id, parent, majmin, root, mp;
    if (f >> id >> parent >> majmin >> root >> mp && mp == mountpoint) dev = majmin;
  }
  std::string path = absl::StrCat("/sys/class/bdi/", dev, "/read_ahead_kb");
  std::ofstream out(path);
  if (dev.empty() || !(out << kb << "\n") || !out.flush()) {
    spdlog::info("mount: cannot set the readahead of {} to {} KiB ({}); kernel default kept",
                 mountpoint, kb, dev.empty() ? "not in mountinfo" : path);
    return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<FuseMount>> FuseMount::Mount(FileSystem* fs,
                                                            const std::string& mountpoint,
                                                            const MountOptions& options) {
  std::unique_ptr<FuseMount> m(new FuseMount());
  m->fs_ = fs;
  m->options_ = options;
  g_readdirplus = options.readdirplus;
  auto session = MountSession(mountpoint, options, &kOps, fs, &m->mountpoint_);
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
