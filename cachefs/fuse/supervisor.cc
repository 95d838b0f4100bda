#include "cachefs/fuse/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ember::cachefs {
namespace {
constexpr uint32_t kMaxState = 16 << 20;
}

absl::Status SendStateMessage(int sock, const KernelFuseState& state) {
  std::string text = EncodeMountState(state);
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
    auto s = DecodeMountState(text);
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
      // After the last passthrough open of an inode its backing id is gone, or lingers
      // (open_files.h: the release then names it; a later release of fh 0 ends it).
      bool still = std::any_of(files.begin(), files.end(),
                               [&](const auto& f) { return f.ino == ino && f.passthrough; });
      const int32_t lingering = j.value("backing_id", 0);
      if (!still && lingering > 0) {
        state->backing_ids[ino] = lingering;
      } else if (!still) {
        state->backing_ids.erase(ino);
      }
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

absl::StatusOr<int> Supervise(const std::vector<std::string>& agent_argv) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("supervisor: socketpair: ", strerror(errno)));
  }
  std::vector<std::string> args = agent_argv;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string fd_text = std::to_string(sv[1]);
  KernelFuseState state;
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigaddset(&term, SIGINT);
  while (true) {
    // Stale messages a dead agent never read, then the mount for the next one.
    KernelFuseState stale;
    while (ReceiveSupervisorMessage(sv[1], &stale) > 0) {
    }
    if (stale.fd >= 0) close(stale.fd);
    if (state.fd >= 0) {
      absl::Status st = SendStateMessage(sv[0], state);
      if (!st.ok()) spdlog::error("supervisor: {}", std::string(st.message()));
    }
    pid_t pid = fork();
    if (pid == 0) {
      sigprocmask(SIG_UNBLOCK, &term, nullptr);
      fcntl(sv[1], F_SETFD, 0);  // inherited by the agent
      setenv(kSupervisorFdEnv, fd_text.c_str(), 1);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    if (pid < 0) return absl::InternalError(absl::StrCat("supervisor: fork: ", strerror(errno)));
    spdlog::info("supervisor: agent started (pid {})", pid);
    bool stopping = false;
    int status = 0;
    while (true) {
      pollfd p{sv[0], POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        while (ReceiveSupervisorMessage(sv[0], &state) > 0) {
        }
      }
      timespec zero{0, 0};
      int sig = sigtimedwait(&term, nullptr, &zero);
      if (sig > 0) {
        stopping = true;
        kill(pid, sig);
      }
      if (waitpid(pid, &status, WNOHANG) == pid) break;
    }
    while (ReceiveSupervisorMessage(sv[0], &state) > 0) {
    }
    bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (stopping || clean || state.fd < 0) {
      // Stopped on purpose, or it never mounted (a bad flag): nothing to keep.
      if (state.fd >= 0) close(state.fd);
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    spdlog::error("supervisor: agent (pid {}) died ({}); restarting it on the same mount", pid,
                  WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                                      : absl::StrCat("exit code ", WEXITSTATUS(status)));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace ember::cachefs
