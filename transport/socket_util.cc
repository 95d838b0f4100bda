#include "transport/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/memory.h"

namespace ember::transport {

absl::Status SplitHostPort(const std::string& hp, std::string* host, int* port) {
  size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(hp.substr(colon + 1), port) ||
      *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", hp, "' is not HOST:PORT"));
  }
  *host = hp.substr(0, colon);
  return absl::OkStatus();
}

void SetIoTimeout(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = t.count() / 1000;
  tv.tv_usec = (t.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static absl::StatusOr<addrinfo*> Resolve(const std::string& host_port, bool passive) {
  std::string host;
  int port;
  if (auto s = SplitHostPort(host_port, &host, &port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", host_port, ": ", gai_strerror(rc)));
  }
  return res;
}

absl::StatusOr<int> ConnectTcp(const std::string& host_port, std::chrono::milliseconds timeout,
                               std::chrono::milliseconds io_timeout) {
  auto res = Resolve(host_port, false);
  if (!res.ok()) return res.status();
  std::string last = "no address";
  for (addrinfo* ai = *res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int pr = poll(&p, 1, static_cast<int>(timeout.count()));
      if (pr == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        rc = -1;
        if (pr == 0) errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      int flags = fcntl(fd, F_GETFL);
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      SetIoTimeout(fd, io_timeout);
      freeaddrinfo(*res);
      return fd;
    }
    last = strerror(errno);
    close(fd);
  }
  freeaddrinfo(*res);
  return absl::UnavailableError(absl::StrCat("cannot connect to ", host_port, ": ", last));
}

absl::StatusOr<int> ListenTcp(const std::string& host_port, int* bound_port) {
  auto res = Resolve(host_port, true);
  if (!res.ok()) return res.status();
  std::string last = "no address";
  for (addrinfo* ai = *res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      *bound_port =
          ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                        : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
      freeaddrinfo(*res);
      return fd;
    }
    last = strerror(errno);
    close(fd);
  }
  freeaddrinfo(*res);
  return absl::UnavailableError(absl::StrCat("cannot listen on ", host_port, ": ", last));
}

absl::StatusOr<int> AdoptListener(int fd, const std::string& host_port, int* bound_port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  int listening = 0;
  socklen_t optlen = sizeof(listening);
  bool same = false;
  auto res = Resolve(host_port, true);
  if (res.ok() && getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) == 0 && listening) {
    for (addrinfo* ai = *res; ai != nullptr && !same; ai = ai->ai_next) {
      if (ai->ai_family != ss.ss_family) continue;
      if (ss.ss_family == AF_INET) {
        const auto* want = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
        const auto* have = reinterpret_cast<const sockaddr_in*>(&ss);
        same = want->sin_addr.s_addr == have->sin_addr.s_addr &&
               (want->sin_port == 0 || want->sin_port == have->sin_port);
      } else if (ss.ss_family == AF_INET6) {
        const auto* want = reinterpret_cast<const sockaddr_in6*>(ai->ai_addr);
        const auto* have = reinterpret_cast<const sockaddr_in6*>(&ss);
        same = std::memcmp(&want->sin6_addr, &have->sin6_addr, sizeof(in6_addr)) == 0 &&
               (want->sin6_port == 0 || want->sin6_port == have->sin6_port);
      }
    }
  }
  if (res.ok()) freeaddrinfo(*res);
  if (!same) {
    close(fd);  // another address now (or not a listener): bind as configured
    return ListenTcp(host_port, bound_port);
  }
  *bound_port = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                              : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return fd;
}

namespace {

// quickack: ACK each segment at once (TCP_QUICKACK is not sticky, so it is set before each recv).
absl::Status ReadLoop(int fd, void* buf, size_t n, bool quickack, BlockChecksummer* sum) {
  // Hashed pieces stay within a core's cache between the copy and the hash.
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  const int one = 1;
  while (done < n) {
    if (quickack) setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
    const size_t want = sum != nullptr ? std::min(n - done, BlockChecksummer::kPiece) : n - done;
    ssize_t r = recv(fd, p + done, want, 0);
    if (r > 0) {
      if (sum != nullptr) sum->Update(p + done, static_cast<size_t>(r));
      done += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return absl::UnavailableError("connection closed by peer");
    if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::UnavailableError("read timed out");
    return absl::UnavailableError(absl::StrCat("read: ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadFull(int fd, void* buf, size_t n) { return ReadLoop(fd, buf, n, false, nullptr); }

absl::Status ReadBulk(int fd, void* buf, size_t n, BlockChecksummer* sum) {
  return ReadLoop(fd, buf, n, true, sum);
}

absl::Status WriteFull(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return absl::UnavailableError("write timed out");
    }
    return absl::UnavailableError(absl::StrCat("write: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SendFileFull(int sock, int in_fd, uint64_t offset, size_t n) {
  off_t off = static_cast<off_t>(offset);
  size_t done = 0;
  while (done < n) {
    ssize_t r = sendfile(sock, in_fd, &off, n - done);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return absl::DataLossError("block file is shorter than its index says");
    if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::UnavailableError("send timed out");
    return absl::UnavailableError(absl::StrCat("sendfile: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SendFromFile(int sock, int in_fd, uint64_t offset, size_t n) {
  if (offset % 4096 != 0 || PagesCached(in_fd, offset, n).value_or(true)) {
    return SendFileFull(sock, in_fd, offset, n);
  }
  const std::string self = absl::StrCat("/proc/self/fd/", in_fd);
  const int direct = open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (direct < 0) return SendFileFull(sock, in_fd, offset, n);
  std::shared_ptr<char[]> bounce = TakeDirectBuffer();
  char* buf = bounce.get();
  size_t done = 0;
  absl::Status st;
  while (done < n && st.ok()) {
    const size_t want = std::min(n - done, kDirectBufferBytes);
    if (!PreadDirectFull(direct, offset + done, want, buf)) {
      if (errno == EINVAL && done == 0) {  // no O_DIRECT here after all
        close(direct);
        GiveDirectBuffer(std::move(bounce));
        return SendFileFull(sock, in_fd, offset, n);
      }
      st = errno == 0
               ? absl::DataLossError("block file is shorter than its index says")
               : absl::UnavailableError(absl::StrCat("read of a block file: ", strerror(errno)));
    } else {
      st = WriteFull(sock, buf, want);
      done += want;
    }
  }
  close(direct);
  GiveDirectBuffer(std::move(bounce));
  return st;
}

BufferedReader::BufferedReader(int fd, size_t capacity) : fd_(fd), buf_(capacity, '\0') {}

absl::Status BufferedReader::Read(void* out, size_t n, BlockChecksummer* sum, size_t then) {
  char* p = static_cast<char*>(out);
  size_t done = 0;
  const bool large_next = then >= buf_.size() / 2;
  while (done < n) {
    if (start_ == end_) {
      start_ = end_ = 0;
      if (n - done >= buf_.size() / 2) return ReadLoop(fd_, p + done, n - done, true, sum);
      const int one = 1;  // the body of a batch's answers, as ReadBulk
      setsockopt(fd_, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
      ssize_t r = recv(fd_, buf_.data(), large_next ? n - done : buf_.size(), 0);
      if (r > 0) {
        end_ = static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return absl::UnavailableError("connection closed by peer");
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::UnavailableError("read timed out");
      return absl::UnavailableError(absl::StrCat("read: ", strerror(errno)));
    }
    const size_t take = std::min(n - done, end_ - start_);
    memcpy(p + done, buf_.data() + start_, take);
    if (sum != nullptr) sum->Update(p + done, take);
    start_ += take;
    done += take;
  }
  return absl::OkStatus();
}

bool WaitReadable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  while (true) {
    int rc = poll(&p, 1, static_cast<int>(timeout.count()));
    if (rc < 0 && errno == EINTR) continue;
    return rc > 0;
  }
}

std::string LocalAddress(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET) {
    return "";
  }
  char text[INET_ADDRSTRLEN] = {};
  return inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text)) ? text : "";
}

}  // namespace ember::transport
