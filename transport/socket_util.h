// Small blocking-socket helpers with timeouts, for the TCP transport. Internal to transport/.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/ids.h"

namespace ember::transport {

// Splits "HOST:PORT". Returns: InvalidArgument.
absl::Status SplitHostPort(const std::string& hp, std::string* host, int* port);
// Connects within `timeout`; the socket gets SO_RCVTIMEO/SO_SNDTIMEO = io_timeout and
// TCP_NODELAY. Returns the fd, or Unavailable naming the peer.
absl::StatusOr<int> ConnectTcp(const std::string& host_port, std::chrono::milliseconds timeout,
                               std::chrono::milliseconds io_timeout);
// Binds and listens. Returns the fd (and the bound port), or Unavailable.
absl::StatusOr<int> ListenTcp(const std::string& host_port, int* bound_port);
// A listening socket handed over by a predecessor: kept if it is bound to `host_port`'s address
// (port 0: any port), else closed and ListenTcp's. Returns as ListenTcp.
absl::StatusOr<int> AdoptListener(int fd, const std::string& host_port, int* bound_port);
void SetIoTimeout(int fd, std::chrono::milliseconds t);
// Reads/writes exactly n bytes (the socket's timeouts apply). Unavailable on EOF, error or
// timeout.
absl::Status ReadFull(int fd, void* buf, size_t n);
// ReadFull for a bulk body after a request: ACKs every segment at once (TCP_QUICKACK). A client
// that sends requests puts its connection in delayed-ACK ("pingpong") mode, which holds back the
// sender of a 4 MiB body; measured on loopback, 4 MiB request/response 2,147-2,242 -> 2,335-2,618
// MiB/s.
// With `sum`, the bytes are hashed as they arrive (in pieces that fit the CPU's cache).
absl::Status ReadBulk(int fd, void* buf, size_t n, BlockChecksummer* sum = nullptr);
absl::Status WriteFull(int fd, const void* buf, size_t n);
// Sends n bytes of file `in_fd` from `offset` with sendfile (no user-space copy).
absl::Status SendFileFull(int sock, int in_fd, uint64_t offset, size_t n);

// Sends n bytes of file `in_fd` from `offset` the way that costs least: with sendfile when they
// are all in the page cache; else read with O_DIRECT (the file reopened through /proc/self/fd)
// a 2 MiB chunk at a time into a buffer (shared by all connections, a few kept between sends)
// and sent from there, so that a block read for a peer never passes through the page cache.
// sendfile of a cold block fills new page-cache pages, and the receiver's copy out of them is
// their first touch by a CPU: on this VM that first touch costs an exit per page (a restore of
// 4 x 512 MiB from a dropped page cache: 220-400 CPU ticks on the receiving node, against 65
// once the holder's pages had been read; docs/benchmarks.md, Checkpoints, 2026-12-07). A file
// O_DIRECT cannot read (an unaligned offset, a file system without it) goes by sendfile.
// Errors as SendFileFull. Thread-safe.
absl::Status SendFromFile(int sock, int in_fd, uint64_t offset, size_t n);

// The socket's local IPv4 address, dotted ("" if it has none).
std::string LocalAddress(int fd);
// Waits until fd is readable; false on timeout.
bool WaitReadable(int fd, std::chrono::milliseconds timeout);

// Reads a connection through a buffer: the many small frames of a batch that arrive together
// cost one recv instead of one or two each. A large read (half the buffer or more) goes straight
// into its destination as ReadBulk does. Not thread-safe.
class BufferedReader {
 public:
  explicit BufferedReader(int fd, size_t capacity = 64 << 10);
  // Bytes read from the socket and not yet taken.
  size_t buffered() const { return end_ - start_; }
  // Reads exactly n bytes into buf, hashing them with `sum` if given. Errors as ReadFull.
  // `then`: how many bytes the caller reads next, if it knows (an answer's body after its
  // header). When they are a large read, the socket is read no further than these n bytes, so
  // that the large read lands in its destination and not in the buffer (ImageNet-sized bodies
  // were half copied through it: 7.5% of a prefetching agent's CPU).
  absl::Status Read(void* buf, size_t n, BlockChecksummer* sum = nullptr, size_t then = 0);

 private:
  int fd_;
  std::string buf_;
  size_t start_ = 0, end_ = 0;
};

}  // namespace ember::transport
