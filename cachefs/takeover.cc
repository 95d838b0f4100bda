#include "cachefs/takeover.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

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

// One message of `len` bytes with `fd` attached (SCM_RIGHTS). Returns sendmsg's result.
ssize_t SendWithFd(int sock, const void* data, size_t len, int fd) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  std::memset(control, 0, sizeof(control));
  msghdr m;
  std::memset(&m, 0, sizeof(m));
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return sendmsg(sock, &m, MSG_NOSIGNAL);
}

// Receives one message into buf; *fd is the fd attached to it, or -1. Returns recvmsg's result.
ssize_t RecvWithFd(int sock, void* buf, size_t len, int flags, int* fd) {
  iovec iov{buf, len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr m;
  std::memset(&m, 0, sizeof(m));
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  *fd = -1;
  ssize_t n = recvmsg(sock, &m, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(fd, CMSG_DATA(c), sizeof(int));
    }
  }
  return n;
}

nlohmann::json ToJson(const KernelFuseState& s) {
  nlohmann::json j;
  j["mountpoint"] = s.mountpoint;
  j["proto_minor"] = s.proto_minor;
  j["passthrough"] = s.passthrough;
  j["direct_io_mmap"] = s.direct_io_mmap;
  j["next_fh"] = s.next_fh;
  j["open_files"] = nlohmann::json::array();
  for (const auto& f : s.open_files) {
    j["open_files"].push_back({{"fh", f.fh}, {"ino", f.ino}, {"passthrough", f.passthrough}});
  }
  j["backing_ids"] = nlohmann::json::array();
  for (const auto& [ino, id] : s.backing_ids) j["backing_ids"].push_back({ino, id});
  return j;
}

absl::StatusOr<KernelFuseState> FromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::DataLossError("takeover state is not JSON");
  try {
    KernelFuseState s;
    s.mountpoint = j.at("mountpoint").get<std::string>();
    s.proto_minor = j.at("proto_minor").get<uint32_t>();
    s.passthrough = j.at("passthrough").get<bool>();
    s.direct_io_mmap = j.value("direct_io_mmap", false);  // absent from older agents
    s.next_fh = j.at("next_fh").get<uint64_t>();
    for (const auto& f : j.at("open_files")) {
      s.open_files.push_back({f.at("fh").get<uint64_t>(), f.at("ino").get<uint64_t>(),
                              f.at("passthrough").get<bool>()});
    }
    for (const auto& b : j.at("backing_ids")) {
      s.backing_ids[b.at(0).get<uint64_t>()] = b.at(1).get<int32_t>();
    }
    if (s.mountpoint.empty()) return absl::DataLossError("takeover state has no mountpoint");
    return s;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("takeover state is malformed: ", e.what()));
  }
}

}  // namespace

absl::Status SendStateMessage(int sock, const KernelFuseState& state) {
  std::string text = ToJson(state).dump();
  if (SendWithFd(sock, text.data(), text.size(), state.fd) != static_cast<ssize_t>(text.size())) {
    return absl::UnavailableError(absl::StrCat("sending the mount state: ", strerror(errno)));
  }
  return absl::OkStatus();
}

void SendOpenUpdate(int sock, bool open, const KernelFuseState::OpenFile& f, int32_t backing_id) {
  std::string text = nlohmann::json{
      {"op", open ? "open" : "release"},
      {"fh", f.fh},
      {"ino", f.ino},
      {"passthrough", f.passthrough},
      {"backing_id",
       backing_id}}.dump();
  // Blocking: a lost update could make a successor reuse a closed backing id. The supervisor
  // drains its end at once; if it is gone, send fails (EPIPE) and nothing waits.
  (void)!send(sock, text.data(), text.size(), MSG_NOSIGNAL);
}

bool ApplySupervisorMessage(const char* msg, size_t len, int passed_fd, KernelFuseState* state) {
  std::string text(msg, len);
  if (passed_fd >= 0) {
    auto s = FromJson(text);
    if (!s.ok()) return false;
    if (state->fd >= 0) close(state->fd);
    *state = std::move(*s);
    state->fd = passed_fd;
    return true;
  }
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  try {
    uint64_t fh = j.at("fh").get<uint64_t>();
    auto& files = state->open_files;
    files.erase(
        std::remove_if(files.begin(), files.end(), [&](const auto& f) { return f.fh == fh; }),
        files.end());
    uint64_t ino = j.at("ino").get<uint64_t>();
    if (j.at("op") != "open") {
      // The last passthrough open of an inode closes its backing id.
      bool still = std::any_of(files.begin(), files.end(),
                               [&](const auto& f) { return f.ino == ino && f.passthrough; });
      if (!still) state->backing_ids.erase(ino);
    } else {
      files.push_back({fh, ino, j.at("passthrough").get<bool>()});
      int32_t id = j.at("backing_id").get<int32_t>();
      if (id > 0) state->backing_ids[ino] = id;
      state->next_fh = std::max(state->next_fh, fh + 1);
    }
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

int ReceiveSupervisorMessage(int sock, KernelFuseState* state) {
  thread_local std::vector<char> buf(kMaxState);  // allocated once per thread
  int fd = -1;
  ssize_t n = RecvWithFd(sock, buf.data(), buf.size(), MSG_DONTWAIT, &fd);
  if (n <= 0) return n == 0 ? -1 : (errno == EAGAIN ? 0 : -1);
  if (!ApplySupervisorMessage(buf.data(), static_cast<size_t>(n), fd, state)) {
    if (fd >= 0) close(fd);
    spdlog::warn("supervisor: ignored a malformed message");
  }
  return 1;
}

std::optional<KernelFuseState> TakeQueuedState(int sock) {
  KernelFuseState s;
  while (ReceiveSupervisorMessage(sock, &s) > 0) {
  }
  if (s.fd < 0) return std::nullopt;
  return s;
}

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
  auto s = FromJson(text);
  if (!s.ok()) {
    close(passed_fd);
    return s.status();
  }
  s->fd = passed_fd;
  return s;
}

absl::Status SendTakeoverState(int conn, const KernelFuseState& state) {
  std::string text = ToJson(state).dump();
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
    (void)!write(stop_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

}  // namespace ember::cachefs
