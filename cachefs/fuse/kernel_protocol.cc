#include "cachefs/fuse/kernel_protocol.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>

#include "absl/synchronization/mutex.h"
#include "cachefs/fuse/mount_session.h"
#include "common/metrics.h"

namespace ember::cachefs {

void ReplyIov(const Channel& ch, uint64_t unique, int error, iovec* iov, size_t n) {
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

void Reply(const Channel& ch, uint64_t unique, int error, std::initializer_list<iovec> parts) {
  iovec iov[8];
  size_t n = 1;
  for (const iovec& p : parts) {
    if (p.iov_len == 0 || n == 8) continue;
    iov[n++] = p;
  }
  ReplyIov(ch, unique, error, iov, n);
}

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
  o->blksize = PreferredIoSize(a.size);
}

void FillEntry(const Entry& e, fuse_entry_out* o) {
  std::memset(o, 0, sizeof(*o));
  o->nodeid = e.attr.ino;
  o->generation = 1;
  SplitTimeout(e.timeout_s, &o->entry_valid, &o->entry_valid_nsec);
  SplitTimeout(e.timeout_s, &o->attr_valid, &o->attr_valid_nsec);
  FillAttr(e.attr, &o->attr);
}

metrics::Histogram* OpHistogram(uint32_t opcode) {
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
  // Created on first use, so /metrics shows the operations that happened.
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static auto* by_op = new std::map<uint32_t, metrics::Histogram*>();  // never destroyed
  absl::MutexLock lock(&mu);
  auto& h = (*by_op)[opcode];
  if (h == nullptr) h = FuseOpHistogram(name);
  return h;
}

}  // namespace ember::cachefs
