#include "cachefs/fuse/takeover.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ember::cachefs {
namespace {

constexpr char kRequest[] = "takeover v1\n";
constexpr uint32_t kMaxState = 16 << 20;

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un a;
  std::memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof(a.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("takeover socket path is too long (", path.size(), " bytes): ", path));
  }
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

// Waits until fd is readable or the deadline passes. Returns false on timeout.
bool WaitReadable(int fd, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;  // let the read report it
  }
}

}  // namespace

std::string TakeoverSocketPath(const std::string& cache_dir) { return cache_dir + "/agent.sock"; }

absl::StatusOr<KernelFuseState> RequestTakeover(const std::string& path,
                                                std::chrono::milliseconds timeout) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  auto fail = [&](absl::Status s) {
    close(fd);
    return s;
  };
  if (connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    if (errno == ENOENT || errno == ECONNREFUSED) {
      return fail(absl::NotFoundError(absl::StrCat("no running agent listens at ", path)));
    }
    return fail(absl::UnavailableError(absl::StrCat("connect ", path, ": ", strerror(errno))));
  }
  if (write(fd, kRequest, sizeof(kRequest) - 1) != static_cast<ssize_t>(sizeof(kRequest) - 1)) {
    return fail(absl::UnavailableError(absl::StrCat("write ", path, ": ", strerror(errno))));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // First message: the length, with the fd attached.
  uint32_t len = 0;
  int passed_fd = -1;
  {
    if (!WaitReadable(fd, deadline)) {
      return fail(absl::DeadlineExceededError(
          absl::StrCat("the running agent did not hand over within ", timeout.count(), " ms")));
    }
    ssize_t n = RecvWithFd(fd, &len, sizeof(len), MSG_WAITALL, &passed_fd);
    if (n != sizeof(len)) {
      if (passed_fd >= 0) close(passed_fd);
      return fail(absl::UnavailableError("the running agent closed the takeover connection"));
    }
  }
  if (passed_fd < 0 || len == 0 || len > kMaxState) {
    if (passed_fd >= 0) close(passed_fd);
    return fail(absl::DataLossError("malformed takeover message (no fd or a bad length)"));
  }
  std::string text(len, '\0');
  size_t got = 0;
  while (got < len) {
    if (!WaitReadable(fd, deadline)) break;
    ssize_t n = read(fd, text.data() + got, len - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (got < len) {
    close(passed_fd);
    return absl::DataLossError("takeover state was cut short");
  }
  auto s = DecodeMountState(text);
  if (!s.ok()) {
    close(passed_fd);
    return s.status();
  }
  s->fd = passed_fd;
  return s;
}

absl::Status SendTakeoverState(int conn, const KernelFuseState& state) {
  std::string text = EncodeMountState(state);
  uint32_t len = static_cast<uint32_t>(text.size());
  absl::Status st = absl::OkStatus();
  if (SendWithFd(conn, &len, sizeof(len), state.fd) != sizeof(len)) {
    st = absl::UnavailableError(absl::StrCat("sending the mount: ", strerror(errno)));
  } else {
    size_t sent = 0;
    while (sent < text.size()) {
      ssize_t n = send(conn, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) {
        st = absl::UnavailableError(absl::StrCat("sending the state: ", strerror(errno)));
        break;
      }
      sent += static_cast<size_t>(n);
    }
  }
  close(conn);
  return st;
}

absl::StatusOr<std::unique_ptr<TakeoverListener>> TakeoverListener::Start(
    const std::string& path, std::function<void(int conn)> on_request) {
  auto addr = Address(path);
  if (!addr.ok()) return addr.status();
  std::unique_ptr<TakeoverListener> l(new TakeoverListener());
  l->path_ = path;
  l->fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  unlink(path.c_str());  // a stale socket of an agent that is gone (a live one was asked first)
  if (bind(l->fd_, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0 ||
      listen(l->fd_, 4) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen for takeover at ", path, ": ", strerror(errno)));
  }
  chmod(path.c_str(), 0600);  // the agent's own user only
  l->stop_fd_ = eventfd(0, EFD_CLOEXEC);
  l->thread_ = std::thread([p = l.get(), on_request = std::move(on_request)] {
    pollfd pfds[2] = {{p->fd_, POLLIN, 0}, {p->stop_fd_, POLLIN, 0}};
    while (true) {
      if (poll(pfds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (pfds[1].revents & POLLIN) return;
      int conn = accept4(p->fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      // The request line, within a second (anything else is not a successor).
      char buf[sizeof(kRequest)] = {};
      size_t got = 0;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (got < sizeof(kRequest) - 1 && WaitReadable(conn, deadline)) {
        ssize_t n = read(conn, buf + got, sizeof(kRequest) - 1 - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      if (got != sizeof(kRequest) - 1 || std::memcmp(buf, kRequest, got) != 0) {
        spdlog::warn("takeover: ignored a malformed request on {}", p->path_);
        close(conn);
        continue;
      }
      spdlog::info("takeover: a successor asked for the mount; handing it over");
      on_request(conn);
      return;  // one handover per agent
    }
  });
  return l;
}

TakeoverListener::~TakeoverListener() {
  if (stop_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));  // a failed wake-up: the thread ends with the fd
  }
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

}  // namespace ember::cachefs
