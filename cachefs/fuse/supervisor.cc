#include "cachefs/fuse/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/fuse/mount_session.h"
#include "cachefs/fuse/service_manager.h"
#include "cachefs/fuse/takeover.h"

namespace ember::cachefs {
namespace {
constexpr uint32_t kMaxState = 16 << 20;
constexpr char kReloadEnv[] = "EMBER_SUPERVISOR_RELOAD";
}  // namespace

absl::Status SendStateMessage(int sock, const KernelFuseState& state) {
  std::string text = EncodeMountState(state);
  if (SendWithFds(sock, text.data(), text.size(), StateFds(state)) !=
      static_cast<ssize_t>(text.size())) {
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

bool ApplySupervisorMessage(const char* msg, size_t len, const std::vector<int>& fds,
                            KernelFuseState* state) {
  std::string text(msg, len);
  if (!fds.empty()) {
    auto s = DecodeMountState(text);
    if (!s.ok()) return false;
    CloseStateFds(state);
    *state = std::move(*s);
    AttachStateFds(fds, state);
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
  std::vector<int> fds;
  ssize_t n = RecvWithFds(sock, buf.data(), buf.size(), MSG_DONTWAIT, &fds);
  if (n <= 0) return n == 0 ? -1 : (errno == EAGAIN ? 0 : -1);
  const bool whole = !fds.empty();
  if (!ApplySupervisorMessage(buf.data(), static_cast<size_t>(n), fds, state)) {
    for (int fd : fds) close(fd);
    spdlog::warn("supervisor: ignored a malformed message");
    return 1;
  }
  return whole ? 2 : 1;
}

std::optional<KernelFuseState> TakeQueuedState(int sock) {
  KernelFuseState s;
  while (ReceiveSupervisorMessage(sock, &s) > 0) {
  }
  if (s.fd < 0) return std::nullopt;
  return s;
}

std::string SupervisorSocketPath(const std::string& cache_dir) {
  return cache_dir + "/supervisor.sock";
}

namespace {

// The ready file names the agent serving this supervisor's mount (a readiness probe checks it).
void WriteReadyFile(const std::string& path, pid_t agent) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    spdlog::warn("supervisor: cannot write {}: {}", tmp, strerror(errno));
    return;
  }
  std::fprintf(f, "%d\n", static_cast<int>(agent));
  std::fclose(f);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    spdlog::warn("supervisor: cannot write {}: {}", path, strerror(errno));
  }
}

void RemoveReadyFile(const std::string& path) {
  if (!path.empty()) unlink(path.c_str());
}

// Waits for `pid` to exit, killing it after `patience`. Returns: its wait status.
int Reap(pid_t pid, std::chrono::milliseconds patience) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      spdlog::warn("supervisor: agent (pid {}) did not exit; killing it", pid);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status;
}

// A successor supervisor that asked for the mount (its connection), set by the listener thread.
class SuccessorSlot {
 public:
  void Put(int conn) {
    absl::MutexLock lock(&mu_);
    if (conn_ >= 0) close(conn_);
    conn_ = conn;
  }
  int Take() {
    absl::MutexLock lock(&mu_);
    int c = conn_;
    conn_ = -1;
    return c;
  }

 private:
  absl::Mutex mu_;
  int conn_ ABSL_GUARDED_BY(mu_) = -1;
};

// Takes the mount from the agent `pid` for a successor: the agent hands it over on its takeover
// socket and exits; a dead or stuck agent is killed and the copy kept in `state` goes instead
// (requests it had taken are resent to the next agent). Returns: the agent's wait status, once it
// has exited (never two agents on one mount).
int TakeFromAgent(pid_t pid, const std::string& cache_dir, int sock, KernelFuseState* state) {
  // Meanwhile the agent's updates are applied to the copy: an agent blocked on a full socket
  // while it finishes its requests could not hand over.
  auto request = std::async(std::launch::async, [&cache_dir] {
    return RequestTakeover(TakeoverSocketPath(cache_dir), std::chrono::seconds(60));
  });
  while (request.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    while (ReceiveSupervisorMessage(sock, state) > 0) {
    }
  }
  auto taken = request.get();
  if (!taken.ok()) {
    spdlog::warn("supervisor: the agent did not hand over ({}); handing over this copy",
                 std::string(taken.status().message()));
    kill(pid, SIGKILL);
  }
  int status = Reap(pid, std::chrono::seconds(30));
  KernelFuseState after;  // updates the agent sent before handing over are in what it handed
  while (ReceiveSupervisorMessage(sock, taken.ok() ? &after : state) > 0) {
  }
  CloseStateFds(&after);
  if (taken.ok()) {
    CloseStateFds(state);
    *state = std::move(*taken);
  }
  return status;
}

// The binary now at this process's path (a package upgrade replaced it), if it can continue this
// supervisor's mount. Returns: its path; FailedPrecondition naming why not.
absl::StatusOr<std::string> ReloadTarget() {
  char buf[PATH_MAX + 1];
  ssize_t n = readlink("/proc/self/exe", buf, PATH_MAX);
  if (n <= 0) return absl::FailedPreconditionError("cannot read /proc/self/exe");
  std::string bin(buf, static_cast<size_t>(n));
  const std::string deleted = " (deleted)";
  if (bin.size() > deleted.size() && bin.ends_with(deleted))
    bin.resize(bin.size() - deleted.size());
  // Ask it which handover protocols it speaks (`ember handover-protocol`).
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::FailedPreconditionError("pipe failed");
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    if (const char* t = std::getenv("EMBER_TEST_RELOAD_PROTOCOL"); t != nullptr) {
      setenv("EMBER_TEST_HANDOVER_PROTOCOL", t, 1);  // tests: act as another release would
    }
    execl(bin.c_str(), bin.c_str(), "handover-protocol", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pid > 0 && std::chrono::steady_clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char chunk[256];
    ssize_t got = read(out[0], chunk, sizeof(chunk));
    if (got <= 0) break;
    text.append(chunk, static_cast<size_t>(got));
  }
  close(out[0]);
  if (pid > 0) Reap(pid, std::chrono::seconds(1));
  HandoverProtocol theirs;
  if (std::sscanf(text.c_str(), "%d %d", &theirs.oldest, &theirs.current) != 2) {
    return absl::FailedPreconditionError(
        absl::StrCat(bin, " does not say which handover protocols it speaks"));
  }
  const HandoverProtocol own = OwnHandoverProtocol();
  if (!HandoverCompatible(own, theirs)) {
    return absl::FailedPreconditionError(absl::StrCat(
        bin, " speaks handover protocol ", theirs.oldest, "-", theirs.current, " and this one ",
        own.oldest, "-", own.current, ": they cannot hand over (upgrade one release at a time)"));
  }
  return bin;
}

// Runs `bin` with `argv` in this process, giving it the mount (the state in a memfd and the
// /dev/fuse fd, both named in $EMBER_SUPERVISOR_RELOAD). Returns: only on failure, why.
absl::Status ExecWithMount(const std::string& bin, const std::vector<std::string>& argv,
                           const KernelFuseState& state) {
  auto memfd = StateMemfd(state);
  if (!memfd.ok()) return memfd.status();
  fcntl(*memfd, F_SETFD, 0);  // kept across exec, as are:
  for (int fd : StateFds(state)) fcntl(fd, F_SETFD, 0);
  setenv(kReloadEnv, absl::StrCat(*memfd, ":", state.fd, ":", state.peer_listen_fd).c_str(), 1);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  execv(bin.c_str(), cargv.data());
  const int err = errno;
  unsetenv(kReloadEnv);
  for (int fd : StateFds(state)) fcntl(fd, F_SETFD, FD_CLOEXEC);
  close(*memfd);
  return absl::InternalError(absl::StrCat("exec ", bin, ": ", strerror(err)));
}

// The mount an in-place upgrade left this process (ExecWithMount), if any.
std::optional<KernelFuseState> MountFromReload() {
  const char* env = std::getenv(kReloadEnv);
  if (env == nullptr) return std::nullopt;
  int memfd = -1, fd = -1, listener = -1;
  const bool named = std::sscanf(env, "%d:%d:%d", &memfd, &fd, &listener) == 3;
  unsetenv(kReloadEnv);
  if (!named) return std::nullopt;
  auto s = StateFromMemfd(memfd, fd, listener);
  if (!s.ok()) {
    spdlog::error("supervisor: the mount handed over by the previous binary is unreadable: {}",
                  std::string(s.status().message()));
    return std::nullopt;
  }
  return std::move(*s);
}

}  // namespace

absl::StatusOr<int> Supervise(const std::vector<std::string>& agent_argv,
                              const SuperviseOptions& options) {
  KernelFuseState state;
  bool from_store = false;  // systemd's fd store holds the mount until the agent serves it
  // A supervisor already serving this cache dir (the old pod of a rolling update) hands its
  // mount over; without one, the first agent asks a running agent itself (--takeover).
  if (auto reloaded = MountFromReload()) {
    state = std::move(*reloaded);
    spdlog::info("supervisor: upgraded in place; continuing the mount {}", state.mountpoint);
  } else if (auto stored = MountFromServiceManager()) {
    state = std::move(*stored);
    from_store = true;
    spdlog::info("supervisor: continuing the mount {} the service manager kept across a restart",
                 state.mountpoint);
  } else {
    auto inherited =
        RequestTakeover(SupervisorSocketPath(options.cache_dir), std::chrono::seconds(150));
    if (inherited.ok()) {
      state = std::move(*inherited);
      spdlog::info("supervisor: took the mount {} over from the running supervisor",
                   state.mountpoint);
    } else if (absl::IsFailedPrecondition(inherited.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat("supervisor: the running supervisor refused to hand its mount over: ",
                       inherited.status().message()));
    } else if (!absl::IsNotFound(inherited.status())) {
      // Asking its agent instead would take the mount behind its supervisor's back (which
      // would then exit and, restarted, take it back).
      CloseStateFds(&state);
      return absl::UnavailableError(
          absl::StrCat("supervisor: the running supervisor did not hand its mount over: ",
                       inherited.status().message(), "; it keeps serving (start again to retry)"));
    }
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    CloseStateFds(&state);
    return absl::InternalError(absl::StrCat("supervisor: socketpair: ", strerror(errno)));
  }
  std::vector<std::string> args = agent_argv;
  if (std::find(args.begin(), args.end(), "--takeover") == args.end()) {
    args.push_back("--takeover");  // used only when no mount is queued for the agent
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string fd_text = std::to_string(sv[1]);
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigaddset(&term, SIGINT);
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  SuccessorSlot successor;
  std::unique_ptr<TakeoverListener> listener;
  while (true) {
    // Stale messages a dead agent never read, then the mount for the next one.
    KernelFuseState stale;
    while (ReceiveSupervisorMessage(sv[1], &stale) > 0) {
    }
    CloseStateFds(&stale);
    if (state.fd >= 0) {
      absl::Status st = SendStateMessage(sv[0], state);
      if (!st.ok()) spdlog::error("supervisor: {}", std::string(st.message()));
      // The peer listener is the agent's from here (it sends it back once it serves): a copy
      // kept here would hold the port if the agent must bind anew (another --listen).
      if (state.peer_listen_fd >= 0) close(std::exchange(state.peer_listen_fd, -1));
    }
    pid_t pid = fork();
    if (pid == 0) {
      sigprocmask(SIG_UNBLOCK, &term, nullptr);
      sigprocmask(SIG_UNBLOCK, &hup, nullptr);
      fcntl(sv[1], F_SETFD, 0);  // inherited by the agent
      setenv(kSupervisorFdEnv, fd_text.c_str(), 1);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    if (pid < 0) return absl::InternalError(absl::StrCat("supervisor: fork: ", strerror(errno)));
    spdlog::info("supervisor: agent started (pid {})", pid);
    bool stopping = false;
    bool took = false;  // the mount was taken from the agent for a successor
    bool handed = false;
    int status = 0;
    while (true) {
      pollfd p{sv[0], POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        int r;
        while ((r = ReceiveSupervisorMessage(sv[0], &state)) > 0) {
          if (r != 2) continue;
          // The agent serves: a successor may ask for the mount from now on.
          WriteReadyFile(options.ready_file, pid);
          (void)NotifyServiceManager("READY=1");  // best effort: systemd times the start out
          if (std::exchange(from_store, false)) ForgetStoredMount();
          if (listener == nullptr) {
            auto l = TakeoverListener::Start(
                SupervisorSocketPath(options.cache_dir),
                [&successor](int conn, HandoverProtocol) { successor.Put(conn); });
            if (l.ok()) {
              listener = std::move(*l);
            } else {
              spdlog::warn("supervisor: {}; an upgrade will remount",
                           std::string(l.status().message()));
            }
          }
        }
      }
      timespec zero{0, 0};
      int sig = sigtimedwait(&term, nullptr, &zero);
      if (sig == SIGTERM && state.fd >= 0 && UnderServiceManager() && RestartQueued()) {
        // Restarted by the service manager: the mount waits in its fd store for the next start.
        listener.reset();
        RemoveReadyFile(options.ready_file);
        TakeFromAgent(pid, options.cache_dir, sv[0], &state);
        absl::Status st = StoreMount(state);
        if (st.ok()) {
          spdlog::info("supervisor: restarting; the service manager keeps the mount {}",
                       state.mountpoint);
          CloseStateFds(&state);
          return 0;
        }
        spdlog::error("supervisor: {}; unmounting", std::string(st.message()));
        LazyUnmount(state.mountpoint);
        CloseStateFds(&state);
        return 0;
      }
      if (sig > 0) {
        stopping = true;
        kill(pid, sig);
      }
      if (int conn = successor.Take(); conn >= 0 && stopping) {
        close(conn);  // stopping: the successor hears so at once
      } else if (conn >= 0) {
        listener.reset();  // it ended with this request; a failed handover listens anew
        RemoveReadyFile(options.ready_file);
        spdlog::info("supervisor: a successor asked for the mount; taking it from the agent");
        status = TakeFromAgent(pid, options.cache_dir, sv[0], &state);
        took = true;
        absl::Status st = SendTakeoverState(conn, state);
        if (st.ok()) {
          handed = true;
        } else {
          spdlog::error("supervisor: {}; restarting the agent on the mount",
                        std::string(st.message()));
        }
        break;
      }
      if (sigtimedwait(&hup, nullptr, &zero) == SIGHUP && !stopping) {
        auto bin = state.fd >= 0 ? ReloadTarget()
                                 : absl::FailedPreconditionError("the agent does not serve yet");
        if (!bin.ok()) {
          spdlog::error("supervisor: not upgrading in place: {}; the agent keeps serving",
                        std::string(bin.status().message()));
          continue;
        }
        listener.reset();
        RemoveReadyFile(options.ready_file);
        spdlog::info("supervisor: upgrading in place to {}; taking the mount from the agent", *bin);
        status = TakeFromAgent(pid, options.cache_dir, sv[0], &state);
        took = true;
        absl::Status st = ExecWithMount(*bin, options.self_argv, state);  // only on failure
        spdlog::error("supervisor: {}; restarting the agent on the mount",
                      std::string(st.message()));
        break;
      }
      if (waitpid(pid, &status, WNOHANG) == pid) break;
    }
    if (handed) {
      spdlog::info("supervisor: the mount {} was handed to a successor; waiting to be stopped",
                   state.mountpoint);
      CloseStateFds(&state);
      close(sv[0]);
      close(sv[1]);
      int sig = 0;
      sigwait(&term, &sig);
      spdlog::info("supervisor: signal {}; exiting (the successor keeps the mount)", sig);
      return 0;
    }
    RemoveReadyFile(options.ready_file);
    while (ReceiveSupervisorMessage(sv[0], &state) > 0) {
    }
    // An agent that handed its mount to this supervisor exits cleanly; it is restarted on it.
    bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0 && !took;
    if (stopping || clean || state.fd < 0) {
      // Stopped on purpose, or it never mounted (a bad flag): nothing to keep.
      listener.reset();
      CloseStateFds(&state);
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (!took) {
      spdlog::error("supervisor: agent (pid {}) died ({}); restarting it on the same mount", pid,
                    WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                                        : absl::StrCat("exit code ", WEXITSTATUS(status)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace ember::cachefs
