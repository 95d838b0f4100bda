// The FUSE kernel protocol as the kernel binding speaks it: the parts of linux/fuse.h newer than
// Debian bookworm's header (7.38; passthrough is 7.40), the binding's limits, and how one reply
// is written (to the /dev/fuse fd a request came from, or into its io_uring entry). Internal to
// fuse/.
#pragma once

#include <linux/fuse.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cachefs/filesystem.h"
#include "cachefs/fuse/fuse_uring.h"

#ifndef FUSE_PASSTHROUGH
#define FUSE_PASSTHROUGH (1ULL << 37)
#endif
#ifndef FUSE_DIRECT_IO_ALLOW_MMAP
#define FUSE_DIRECT_IO_ALLOW_MMAP (1ULL << 36)
#endif
#ifndef FOPEN_PASSTHROUGH
#define FOPEN_PASSTHROUGH (1 << 7)
#endif

namespace ember::metrics {
class Histogram;
}

namespace ember::cachefs {

inline constexpr int kNotifyResend = 7;    // FUSE_NOTIFY_RESEND (7.40): requeue requests
inline constexpr uint32_t kOurMinor = 40;  // what we speak: 7.40 (passthrough)
// Pages per request we ask for: 4 MiB READs, a whole block each. The kernel clamps this to
// fs.fuse.max_pages_limit (256 by default), which the agent raises before it mounts
// (RaiseFuseMaxPagesLimit) when it may.
inline constexpr uint32_t kMaxPages = 1024;
inline constexpr size_t kMaxRead = kMaxPages * 4096;
// Volume writes come in requests of up to 1 MiB (max_write).
inline constexpr size_t kMaxWrite = 1u << 20;
// A request: headers and a name, or a volume write of up to kMaxWrite bytes.
inline constexpr size_t kRequestBuffer = kMaxWrite + 4096;

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

// Where a request's reply goes: written to the /dev/fuse fd it was read from, or into the ring
// entry it came in (FuseUring).
struct Channel {
  int fd = -1;
  RingReply* ring = nullptr;
};

// One reply: the header and pieces (iov[0] is left for the header). ENOENT from the write means
// the request was interrupted meanwhile; nothing to do.
void ReplyIov(const Channel& ch, uint64_t unique, int error, iovec* iov, size_t n);
// A reply of up to 7 pieces (empty ones are skipped).
void Reply(const Channel& ch, uint64_t unique, int error, std::initializer_list<iovec> parts);
// An error (or, with 0, an empty success).
inline void ReplyError(const Channel& ch, uint64_t unique, int error) {
  Reply(ch, unique, error, {});
}
template <typename T>
void ReplyStruct(const Channel& ch, uint64_t unique, const T& body) {
  Reply(ch, unique, 0, {iovec{const_cast<T*>(&body), sizeof(T)}});
}

void SplitTimeout(double t, uint64_t* sec, uint32_t* nsec);
void FillAttr(const Attr& a, fuse_attr* o);
void FillEntry(const Entry& e, fuse_entry_out* o);

// Per-operation counts and latency, into the same metric as the libfuse binding. Returns:
// nullptr for opcodes not measured.
metrics::Histogram* OpHistogram(uint32_t opcode);

}  // namespace ember::cachefs
