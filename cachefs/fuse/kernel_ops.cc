#include "cachefs/fuse/kernel_ops.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
  std::vector<char>* scratch;

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

void OpGetattr(const Request& r) {
  auto e = r.fs->GetAttr(r.h.nodeid);
  if (!e.ok()) return ReplyError(r.ch, r.unique(), ToErrno(e.status()));
  fuse_attr_out out;
  std::memset(&out, 0, sizeof(out));
  SplitTimeout(e->timeout_s, &out.attr_valid, &out.attr_valid_nsec);
  FillAttr(e->attr, &out.attr);
  ReplyStruct(r.ch, r.unique(), out);
}

void OpReadlink(const Request& r) {
  auto t = r.fs->ReadLink(r.h.nodeid);
  if (!t.ok()) return ReplyError(r.ch, r.unique(), ToErrno(t.status()));
  Reply(r.ch, r.unique(), 0, {iovec{t->data(), t->size()}});
}

void OpOpen(const Request& r) {
  const auto* in = r.Args<fuse_open_in>();
  if (in == nullptr) return;
  // No-open mode: from this answer on the kernel opens files itself (keep-cache) and sends
  // neither OPEN nor RELEASE again. The mount is read-only ("ro"), so write opens fail before.
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
  std::vector<char>& scratch = *r.scratch;
  if (!in_payload && scratch.size() < size) scratch.resize(std::max(size, kMaxRead));
  char* base = in_payload ? r.ch.ring->payload : scratch.data();
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
  std::vector<char>& scratch = *r.scratch;
  if (scratch.size() < size) scratch.resize(std::max(size, kMaxRead));
  char* buf = scratch.data();
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
  ReplyError(r.ch, r.unique(), (static_cast<int>(in->mask) & W_OK) ? EROFS : 0);
}

}  // namespace

void DispatchRequest(FileSystem* fs, OpenFiles* files, const Channel& ch, const char* msg,
                     size_t len, std::vector<char>* scratch) {
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
      return ReplyError(ch, h->unique, EROFS);
    default:
      // FLUSH, FSYNC, GETXATTR, LISTXATTR, LSEEK, POLL, IOCTL, STATX, ...: not implemented; the
      // kernel remembers and stops asking (or falls back, as for STATX -> GETATTR).
      return ReplyError(ch, h->unique, ENOSYS);
  }
}

}  // namespace ember::cachefs
