#include "cachefs/fuse/takeover.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ember::cachefs {
namespace {

constexpr char kLegacyRequest[] = "takeover v1\n";  // protocol 1: no version range
constexpr size_t kMaxRequestLine = 64;
constexpr uint32_t kMaxState = 16 << 20;

std::string RequestLine(HandoverProtocol p) {
  if (p.current <= 1) return kLegacyRequest;
  return absl::StrCat("takeover v", p.current, " oldest ", p.oldest, "\n");
}

// Returns: the protocols a request line names; nullopt if it is not a takeover request.
std::optional<HandoverProtocol> ParseRequestLine(const std::string& line) {
  if (line == kLegacyRequest) return HandoverProtocol{1, 1};
  HandoverProtocol p;
  char end = 0;
  if (std::sscanf(line.c_str(), "takeover v%d oldest %d%c", &p.current, &p.oldest, &end) != 3 ||
      end != '\n' || p.oldest < 1 || p.oldest > p.current) {
    return std::nullopt;
  }
  return p;
}

std::string Range(HandoverProtocol p) {
  return p.oldest == p.current ? absl::StrCat(p.current) : absl::StrCat(p.oldest, "-", p.current);
}

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

HandoverProtocol OwnHandoverProtocol() {
  HandoverProtocol p;
  if (const char* t = std::getenv("EMBER_TEST_HANDOVER_PROTOCOL"); t != nullptr && *t != '\0') {
    HandoverProtocol q;
    if (std::sscanf(t, "%d:%d", &q.oldest, &q.current) == 2 && q.oldest >= 1 &&
        q.oldest <= q.current) {
      p = q;
    }
  }
  return p;
}

bool HandoverCompatible(HandoverProtocol a, HandoverProtocol b) {
  return a.oldest <= b.current && b.oldest <= a.current;
}

namespace {

// One request on a fresh connection. Returns: the state; NotFound (nothing listens);
// Aborted (the listener closed without a word: an agent of protocol 1 ignores later requests).
absl::StatusOr<KernelFuseState> RequestOnce(const std::string& path, const std::string& request,
                                            std::chrono::steady_clock::time_point deadline) {
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
      return fail(absl::NotFoundError(absl::StrCat("nothing serving the mount listens at ", path)));
    }
    return fail(absl::UnavailableError(absl::StrCat("connect ", path, ": ", strerror(errno))));
  }
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return fail(absl::UnavailableError(absl::StrCat("write ", path, ": ", strerror(errno))));
  }
  // First message: the length, with the fd attached (none: a refusal follows).
  uint32_t len = 0;
  std::vector<int> passed;
  auto drop = [&] {
    for (int f : passed) close(f);
  };
  {
    if (!WaitReadable(fd, deadline)) {
      return fail(absl::DeadlineExceededError("the running agent did not hand over in time"));
    }
    ssize_t n = RecvWithFds(fd, &len, sizeof(len), MSG_WAITALL, &passed);
    // A protocol-1 agent closes with the rest of the request line unread: a reset, not an EOF.
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      return fail(absl::AbortedError("the running agent closed the connection"));
    }
    if (n != sizeof(len)) {
      drop();
      return fail(absl::UnavailableError("the running agent closed the takeover connection"));
    }
  }
  if (len == 0 || len > kMaxState) {
    drop();
    return fail(absl::DataLossError("malformed takeover message (a bad length)"));
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
    drop();
    return absl::DataLossError("takeover state was cut short");
  }
  if (passed.empty()) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object() && j.contains("refused") && j["refused"].is_string()) {
      return absl::FailedPreconditionError(j["refused"].get<std::string>());
    }
    return absl::DataLossError("malformed takeover message (no fd)");
  }
  auto s = DecodeMountState(text);
  if (!s.ok()) {
    drop();
    return s.status();
  }
  AttachStateFds(passed, &*s);
  return s;
}

}  // namespace

absl::StatusOr<KernelFuseState> RequestTakeover(const std::string& path,
                                                std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const HandoverProtocol own = OwnHandoverProtocol();
  auto s = RequestOnce(path, RequestLine(own), deadline);
  if (absl::IsAborted(s.status()) && own.current > 1 && own.oldest <= 1) {
    // An agent of protocol 1 drops requests it does not know; ask it its way.
    s = RequestOnce(path, kLegacyRequest, deadline);
  }
  if (absl::IsAborted(s.status())) {
    return absl::UnavailableError(absl::StrCat(s.status().message(), " without handing over"));
  }
  if (absl::IsDeadlineExceeded(s.status())) {
    return absl::DeadlineExceededError(
        absl::StrCat("the running agent did not hand over within ", timeout.count(), " ms"));
  }
  return s;
}

absl::Status SendTakeoverState(int conn, const KernelFuseState& state) {
  std::string text = EncodeMountState(state);
  uint32_t len = static_cast<uint32_t>(text.size());
  absl::Status st = absl::OkStatus();
  if (SendWithFds(conn, &len, sizeof(len), StateFds(state)) != sizeof(len)) {
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
    const std::string& path, std::function<void(int conn, HandoverProtocol theirs)> on_request) {
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
  if (l->stop_fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat("eventfd: ", strerror(errno)));
  }
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
      const HandoverProtocol own = OwnHandoverProtocol();
      // Protocol 1 read exactly its request's length (and closed with the rest unread).
      const size_t most = own.current == 1 ? sizeof(kLegacyRequest) - 1 : kMaxRequestLine;
      std::string line;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (line.size() < most && (line.empty() || line.back() != '\n') &&
             WaitReadable(conn, deadline)) {
        char c;
        if (read(conn, &c, 1) != 1) break;
        line.push_back(c);
      }
      auto theirs = ParseRequestLine(line);
      if (own.current == 1 && line != kLegacyRequest) theirs.reset();
      if (!theirs) {
        spdlog::warn("takeover: ignored a malformed request on {}", p->path_);
        close(conn);
        continue;
      }
      if (!HandoverCompatible(own, *theirs)) {
        std::string why =
            absl::StrCat("the running agent speaks handover protocol ", Range(own),
                         " and its successor ", Range(*theirs),
                         ": they cannot hand over (upgrade one release at a time); the "
                         "running agent keeps serving");
        spdlog::error("takeover: refused a successor: {}", why);
        std::string text = nlohmann::json{{"refused", why}}.dump();
        uint32_t len = static_cast<uint32_t>(text.size());
        if (send(conn, &len, sizeof(len), MSG_NOSIGNAL) == sizeof(len)) {
          (void)!send(conn, text.data(), text.size(), MSG_NOSIGNAL);  // best effort: it is told
        }
        close(conn);
        continue;
      }
      spdlog::info("takeover: a successor asked for the mount; handing it over");
      on_request(conn, *theirs);
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
