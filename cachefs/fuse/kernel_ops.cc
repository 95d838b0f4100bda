#include "cachefs/fuse/kernel_ops.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "cachefs/fuse/errno.h"
#include "common/metrics.h"

namespace ember::cachefs {
namespace {

// One request being answered.
struct Request {
  const Channel& ch;
  const fuse_in_header& h;
  const char* arg;  // the opcode's arguments
  size_t arg_len;
  FileSystem* fs;
  OpenFiles* files;
  ReplyScratch* scratch;

  uint64_t unique() const { return h.unique; }
  // The arguments as T, or nullptr after answering EINVAL when they are too short.
  template <typename T>
  const T* Args() const {
    if (arg_len >= sizeof(T)) return reinterpret_cast<const T*>(arg);
    ReplyError(ch, h.unique, EINVAL);
    return nullptr;
  }
};

void OpLookup(const Request& r) {
  std::string name(r.arg, strnlen(r.arg, r.arg_len));
  auto e = r.fs->Lookup(r.h.nodeid, name);
  fuse_entry_out out;
  if (e.ok()) {
    FillEntry(*e, &out);
    return ReplyStruct(r.ch, r.unique(), out);
  }
  if (IsAbsentEntry(e.status()) && r.h.nodeid != kRootIno) {
    // A name certainly absent from an immutable directory: a negative entry the kernel keeps.
    std::memset(&out, 0, sizeof(out));
    out.entry_valid = kAbsentEntryTimeoutS;
    return ReplyStruct(r.ch, r.unique(), out);
  }
  ReplyError(r.ch, r.unique(), LookupErrno(name, e.status()));
}

// GETATTR's answer (and SETATTR's): the attributes and how long the kernel may keep them.
void ReplyAttr(const Request& r, const absl::StatusOr<Entry>& e) {
  if (!e.ok()) return ReplyError(r.ch, r.unique(), ToErrno(e.status()));
  fuse_attr_out out;
  std::memset(&out, 0, sizeof(out));
  SplitTimeout(e->timeout_s, &out.attr_valid, &out.attr_valid_nsec);
  FillAttr(e->attr, &out.attr);
  ReplyStruct(r.ch, r.unique(), out);
}

void OpGetattr(const Request& r) { ReplyAttr(r, r.fs->GetAttr(r.h.nodeid)); }

void OpReadlink(const Request& r) {
  auto t = r.fs->ReadLink(r.h.nodeid);
  if (!t.ok()) return ReplyError(r.ch, r.unique(), ToErrno(t.status()));
  Reply(r.ch, r.unique(), 0, {iovec{t->data(), t->size()}});
}

void OpOpen(const Request& r) {
  const auto* in = r.Args<fuse_open_in>();
  if (in == nullptr) return;
  // No-open mode: from this answer on the kernel opens files itself (keep-cache) and sends
  // neither OPEN nor RELEASE again. Such a mount is read-only ("ro", no volumes: their writes
  // need OPEN), so write opens fail before.
  if (r.files->no_open()) return ReplyError(r.ch, r.unique(), ENOSYS);
  OpenFiles::Opened opened;
  int err = r.files->Open(r.h.nodeid, static_cast<int>(in->flags), &opened);
  if (err != 0) return ReplyError(r.ch, r.unique(), err);
  OpenOut out;
  std::memset(&out, 0, sizeof(out));
  out.fh = opened.fh;
  out.open_flags = opened.open_flags;
  out.backing_id = opened.backing_id;
  ReplyStruct(r.ch, r.unique(), out);
}

void OpRead(const Request& r) {
  const auto* in = r.Args<fuse_read_in>();
  if (in == nullptr) return;
  std::shared_ptr<FileSystem::FileHandle> handle = in->fh == 0 && r.files->no_open()
                                                       ? r.files->InodeHandle(r.h.nodeid)
                                                       : r.files->Handle(in->fh);
  const size_t size = std::min<size_t>(in->size, kMaxRead);
  // Bytes from the cache are copied (checked) straight into the reply buffer: the ring entry's
  // payload when the request came through one (no copy after), else this thread's scratch.
  const bool in_payload = r.ch.ring != nullptr && size <= r.ch.ring->capacity;
  char* base = in_payload ? r.ch.ring->payload : r.scratch->Get(size);
  auto res = r.fs->Read(r.h.nodeid, handle.get(), in->offset, size, base);
  if (!res.ok()) return ReplyError(r.ch, r.unique(), ToErrno(res.status()));
  // Segments are in reply order; ReplyIov copies those not already in place into a payload.
  std::vector<iovec> iov(1);
  iov.reserve(res->segments.size() + 1);
  for (const auto& s : res->segments) iov.push_back({const_cast<char*>(s.data), s.len});
  ReplyIov(r.ch, r.unique(), 0, iov.data(), iov.size());
  // *res (its holds) is released on return, after the kernel has the bytes.
}

void OpRelease(const Request& r) {
  const auto* in = r.Args<fuse_release_in>();
  if (in == nullptr) return;
  r.files->Release(in->fh);
  ReplyError(r.ch, r.unique(), 0);
}

void OpOpendir(const Request& r) {
  auto e = r.fs->GetAttr(r.h.nodeid);
  if (!e.ok()) return ReplyError(r.ch, r.unique(), ToErrno(e.status()));
  if (!S_ISDIR(e->attr.mode)) return ReplyError(r.ch, r.unique(), ENOTDIR);
  OpenOut out;
  std::memset(&out, 0, sizeof(out));
  if (r.h.nodeid != kRootIno) out.open_flags = FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE;
  ReplyStruct(r.ch, r.unique(), out);
}

// READDIR and READDIRPLUS.
void OpReaddir(const Request& r) {
  const auto* in = r.Args<fuse_read_in>();
  if (in == nullptr) return;
  const bool plus = r.h.opcode == FUSE_READDIRPLUS;
  const size_t size = std::min<size_t>(in->size, kMaxRead);
  char* buf = r.scratch->Get(size);
  size_t used = 0;
  absl::Status st = r.fs->ReadDir(
      r.h.nodeid, in->offset, [&](const std::string& name, const Attr& attr, uint64_t next) {
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
  if (!st.ok()) return ReplyError(r.ch, r.unique(), ToErrno(st));
  Reply(r.ch, r.unique(), 0, {iovec{buf, used}});
}

void OpStatfs(const Request& r) {
  FsStats s = r.fs->StatFs();
  fuse_statfs_out out;
  std::memset(&out, 0, sizeof(out));
  out.st.bsize = 4096;
  out.st.frsize = 4096;
  out.st.blocks = (s.total_bytes + 4095) / 4096;
  out.st.files = s.files;
  out.st.namelen = 255;
  ReplyStruct(r.ch, r.unique(), out);
}

void OpAccess(const Request& r) {
  const auto* in = r.Args<fuse_access_in>();
  if (in == nullptr) return;
  const bool write = (static_cast<int>(in->mask) & W_OK) != 0;
  ReplyError(r.ch, r.unique(), write && !r.fs->Writable(r.h.nodeid) ? EROFS : 0);
}

// ---- changes (volumes only; the file system answers EROFS for datasets) ----

// The name after a request's fixed arguments T (NUL-terminated), or nullopt after EINVAL.
template <typename T>
const char* NameAfter(const Request& r, size_t* len) {
  if (r.arg_len <= sizeof(T)) {
    ReplyError(r.ch, r.unique(), EINVAL);
    return nullptr;
  }
  const char* name = r.arg + sizeof(T);
  *len = strnlen(name, r.arg_len - sizeof(T));
  return name;
}

void ReplyEntry(const Request& r, const absl::StatusOr<Entry>& e) {
  if (!e.ok()) return ReplyError(r.ch, r.unique(), ToErrno(e.status()));
  fuse_entry_out out;
  FillEntry(*e, &out);
  ReplyStruct(r.ch, r.unique(), out);
}

void OpCreate(const Request& r) {
  size_t len = 0;
  const char* name = NameAfter<fuse_create_in>(r, &len);
  if (name == nullptr) return;
  const auto* in = reinterpret_cast<const fuse_create_in*>(r.arg);
  auto made = r.fs->Create(r.h.nodeid, std::string(name, len), in->mode & ~in->umask,
                           static_cast<int>(in->flags), r.h.uid, r.h.gid);
  if (!made.ok()) return ReplyError(r.ch, r.unique(), ToErrno(made.status()));
  OpenFiles::Opened opened;
  r.files->Adopt(made->first.attr.ino, std::move(made->second), &opened);
  struct {
    fuse_entry_out entry;
    OpenOut open;
  } out;
  std::memset(&out, 0, sizeof(out));
  FillEntry(made->first, &out.entry);
  out.open.fh = opened.fh;
  out.open.open_flags = opened.open_flags;
  ReplyStruct(r.ch, r.unique(), out);
}

void OpMkdir(const Request& r) {
  size_t len = 0;
  const char* name = NameAfter<fuse_mkdir_in>(r, &len);
  if (name == nullptr) return;
  const auto* in = reinterpret_cast<const fuse_mkdir_in*>(r.arg);
  ReplyEntry(
      r, r.fs->MkDir(r.h.nodeid, std::string(name, len), in->mode & ~in->umask, r.h.uid, r.h.gid));
}

void OpUnlink(const Request& r, bool dir) {
  std::string name(r.arg, strnlen(r.arg, r.arg_len));
  absl::Status st = dir ? r.fs->RmDir(r.h.nodeid, name) : r.fs->Unlink(r.h.nodeid, name);
  ReplyError(r.ch, r.unique(), ToErrno(st));
}

// RENAME and RENAME2: the fixed arguments, then the old and the new name.
void OpRename(const Request& r) {
  const bool two = r.h.opcode == FUSE_RENAME2;
  const size_t fixed = two ? sizeof(fuse_rename2_in) : sizeof(fuse_rename_in);
  if (r.arg_len <= fixed) return ReplyError(r.ch, r.unique(), EINVAL);
  const uint64_t new_dir = reinterpret_cast<const fuse_rename_in*>(r.arg)->newdir;
  const uint32_t flags = two ? reinterpret_cast<const fuse_rename2_in*>(r.arg)->flags : 0;
  const char* names = r.arg + fixed;
  const size_t left = r.arg_len - fixed;
  const size_t old_len = strnlen(names, left);
  if (old_len + 1 >= left) return ReplyError(r.ch, r.unique(), EINVAL);
  std::string old_name(names, old_len);
  std::string new_name(names + old_len + 1, strnlen(names + old_len + 1, left - old_len - 1));
  ReplyError(r.ch, r.unique(),
             ToErrno(r.fs->Rename(r.h.nodeid, old_name, new_dir, new_name, flags)));
}

void OpWrite(const Request& r) {
  const auto* in = r.Args<fuse_write_in>();
  if (in == nullptr) return;
  const size_t avail = r.arg_len - sizeof(fuse_write_in);
  if (in->size > avail) return ReplyError(r.ch, r.unique(), EINVAL);
  std::shared_ptr<FileSystem::FileHandle> handle = r.files->Handle(in->fh);
  auto n =
      r.fs->Write(r.h.nodeid, handle.get(), in->offset, r.arg + sizeof(fuse_write_in), in->size);
  if (!n.ok()) return ReplyError(r.ch, r.unique(), ToErrno(n.status()));
  fuse_write_out out;
  std::memset(&out, 0, sizeof(out));
  out.size = static_cast<uint32_t>(*n);
  ReplyStruct(r.ch, r.unique(), out);
}

// FLUSH (each close) and FSYNC: a volume file's writes are committed before the answer.
void OpFlush(const Request& r) {
  const auto* in = r.Args<fuse_flush_in>();
  if (in == nullptr) return;
  // No-open mode: files carry no handle and datasets have nothing to flush; ENOSYS stops the
  // kernel from asking at every close.
  if (r.files->no_open()) return ReplyError(r.ch, r.unique(), ENOSYS);
  std::shared_ptr<FileSystem::FileHandle> handle = r.files->Handle(in->fh);
  if (handle == nullptr || !handle->Volatile()) return ReplyError(r.ch, r.unique(), 0);
  ReplyError(r.ch, r.unique(), ToErrno(r.fs->Flush(r.h.nodeid, handle.get())));
}

void OpFsync(const Request& r) {
  const auto* in = r.Args<fuse_fsync_in>();
  if (in == nullptr) return;
  std::shared_ptr<FileSystem::FileHandle> handle = r.files->Handle(in->fh);
  if (handle == nullptr || !handle->Volatile()) return ReplyError(r.ch, r.unique(), 0);
  ReplyError(r.ch, r.unique(), ToErrno(r.fs->Fsync(r.h.nodeid, handle.get())));
}

void OpSetattr(const Request& r) {
  const auto* in = r.Args<fuse_setattr_in>();
  if (in == nullptr) return;
  FileSystem::SetAttrs a;
  if (in->valid & FATTR_SIZE) a.size = in->size;
  if (in->valid & FATTR_MODE) a.mode = in->mode;
  if (in->valid & FATTR_UID) a.uid = in->uid;
  if (in->valid & FATTR_GID) a.gid = in->gid;
  if (in->valid & FATTR_MTIME_NOW) {
    a.mtime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  } else if (in->valid & FATTR_MTIME) {
    a.mtime_ns = static_cast<int64_t>(in->mtime) * 1'000'000'000 + in->mtimensec;
  }
  std::shared_ptr<FileSystem::FileHandle> handle;
  if (in->valid & FATTR_FH) handle = r.files->Handle(in->fh);
  if (!a.size && !a.mode && !a.uid && !a.gid && !a.mtime_ns) {
    // Only what is not kept (atime, ctime): the attributes as they are.
    if (!r.fs->Writable(r.h.nodeid)) return ReplyError(r.ch, r.unique(), EROFS);
    return OpGetattr(r);
  }
  ReplyAttr(r, r.fs->SetAttr(r.h.nodeid, handle.get(), a));
}

void OpGetxattr(const Request& r) {
  size_t len = 0;
  const char* name = NameAfter<fuse_getxattr_in>(r, &len);
  if (name == nullptr) return;
  const auto* in = reinterpret_cast<const fuse_getxattr_in*>(r.arg);
  auto v = r.fs->GetXattr(r.h.nodeid, std::string(name, len));
  if (!v.ok()) return ReplyError(r.ch, r.unique(), ToErrno(v.status()));
  if (in->size == 0) {
    fuse_getxattr_out out;
    std::memset(&out, 0, sizeof(out));
    out.size = static_cast<uint32_t>(v->size());
    return ReplyStruct(r.ch, r.unique(), out);
  }
  if (v->size() > in->size) return ReplyError(r.ch, r.unique(), ERANGE);
  Reply(r.ch, r.unique(), 0, {iovec{v->data(), v->size()}});
}

}  // namespace

void DispatchRequest(FileSystem* fs, OpenFiles* files, const Channel& ch, const char* msg,
                     size_t len, ReplyScratch* scratch) {
  if (len < sizeof(fuse_in_header)) return;
  const auto* h = reinterpret_cast<const fuse_in_header*>(msg);
  const Request r{ch, *h,    msg + sizeof(*h), std::min<size_t>(len, h->len) - sizeof(*h),
                  fs, files, scratch};
  metrics::Timer timer(OpHistogram(h->opcode));
  switch (h->opcode) {
    case FUSE_LOOKUP:
      return OpLookup(r);
    case FUSE_FORGET:
    case FUSE_BATCH_FORGET:
    case FUSE_INTERRUPT:
      return;  // no reply; inode numbers are stable and requests short
    case FUSE_GETATTR:
      return OpGetattr(r);
    case FUSE_READLINK:
      return OpReadlink(r);
    case FUSE_OPEN:
      return OpOpen(r);
    case FUSE_READ:
      return OpRead(r);
    case FUSE_RELEASE:
      return OpRelease(r);
    case FUSE_OPENDIR:
      return OpOpendir(r);
    case FUSE_READDIR:
    case FUSE_READDIRPLUS:
      return OpReaddir(r);
    case FUSE_RELEASEDIR:
    case FUSE_DESTROY:
      return ReplyError(ch, h->unique, 0);
    case FUSE_STATFS:
      return OpStatfs(r);
    case FUSE_ACCESS:
      return OpAccess(r);
    case FUSE_INIT:
      return ReplyError(ch, h->unique, EPROTO);  // only once, answered by HandleInit
    case FUSE_CREATE:
      return OpCreate(r);
    case FUSE_MKDIR:
      return OpMkdir(r);
    case FUSE_UNLINK:
      return OpUnlink(r, /*dir=*/false);
    case FUSE_RMDIR:
      return OpUnlink(r, /*dir=*/true);
    case FUSE_RENAME:
    case FUSE_RENAME2:
      return OpRename(r);
    case FUSE_WRITE:
      return OpWrite(r);
    case FUSE_FLUSH:
      return OpFlush(r);
    case FUSE_FSYNC:
      return OpFsync(r);
    case FUSE_SETATTR:
      return OpSetattr(r);
    case FUSE_GETXATTR:
      return OpGetxattr(r);
    case FUSE_SYMLINK:
    case FUSE_MKNOD:
    case FUSE_LINK:
    case FUSE_TMPFILE:
      // Not in a volume (checkpoints need none of them), not in a dataset (read-only).
      return ReplyError(ch, h->unique, r.fs->Writable(h->nodeid) ? EPERM : EROFS);
    case FUSE_SETXATTR:
    case FUSE_REMOVEXATTR:
      return ReplyError(ch, h->unique, r.fs->Writable(h->nodeid) ? ENOTSUP : EROFS);
    case FUSE_FALLOCATE:
      return ReplyError(ch, h->unique, r.fs->Writable(h->nodeid) ? EOPNOTSUPP : EROFS);
    default:
      // LISTXATTR, LSEEK, POLL, IOCTL, STATX, ...: not implemented; the kernel remembers and
      // stops asking (or falls back, as for STATX -> GETATTR).
      return ReplyError(ch, h->unique, ENOSYS);
  }
}

}  // namespace ember::cachefs
