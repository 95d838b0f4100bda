#include "cachefs/fuse/service_manager.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ember::cachefs {
namespace {

constexpr char kFuseName[] = "ember-fuse";
constexpr char kPeersName[] = "ember-peers";
constexpr char kStateName[] = "ember-state";
constexpr int kListenFdsStart = 3;  // SD_LISTEN_FDS_START

// This process's systemd unit (the last part of its cgroup path), or "".
std::string OwnUnit() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, unit;
  while (std::getline(in, line)) {
    size_t slash = line.rfind('/');
    if (slash != std::string::npos && line.ends_with(".service")) unit = line.substr(slash + 1);
  }
  return unit;
}

}  // namespace

bool UnderServiceManager() {
  const char* path = std::getenv("NOTIFY_SOCKET");
  return path != nullptr && *path != '\0';
}

absl::Status NotifyServiceManager(const std::string& text, const std::vector<int>& fds) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || *path == '\0') return absl::OkStatus();
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const size_t len = std::strlen(path);
  if (len >= sizeof(a.sun_path)) return absl::UnavailableError("NOTIFY_SOCKET is too long");
  std::memcpy(a.sun_path, path, len);
  if (path[0] == '@') a.sun_path[0] = '\0';  // an abstract socket
  int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  absl::Status st = absl::OkStatus();
  if (connect(s, reinterpret_cast<sockaddr*>(&a),
              static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len)) != 0 ||
      SendWithFds(s, text.data(), text.size(), fds) != static_cast<ssize_t>(text.size())) {
    st = absl::UnavailableError(absl::StrCat("notifying the service manager: ", strerror(errno)));
  }
  close(s);
  return st;
}

bool RestartQueued() {
  if (const char* t = std::getenv("EMBER_TEST_RESTART_QUEUED"); t != nullptr) {
    return std::string(t) == "1";
  }
  const std::string unit = OwnUnit();
  if (unit.empty()) return false;
  // SIGKILL: this process blocks SIGTERM, and the child inherits that.
  FILE* p = popen("timeout -s KILL 5 systemctl list-jobs --no-legend --plain 2>/dev/null", "r");
  if (p == nullptr) return false;
  bool queued = false;
  char line[512];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    // JOB UNIT TYPE STATE
    std::istringstream fields(line);
    std::string job, name, type;
    fields >> job >> name >> type;
    if (name == unit && (type == "restart" || type == "try-restart")) queued = true;
  }
  pclose(p);
  return queued;
}

absl::Status StoreMount(const KernelFuseState& state) {
  auto memfd = StateMemfd(state);
  if (!memfd.ok()) return memfd.status();
  absl::Status st = NotifyServiceManager(absl::StrCat("FDSTORE=1\nFDNAME=", kFuseName), {state.fd});
  if (st.ok() && state.peer_listen_fd >= 0) {
    st = NotifyServiceManager(absl::StrCat("FDSTORE=1\nFDNAME=", kPeersName),
                              {state.peer_listen_fd});
  }
  // The state last: a start that finds it has the rest.
  if (st.ok()) st = NotifyServiceManager(absl::StrCat("FDSTORE=1\nFDNAME=", kStateName), {*memfd});
  close(*memfd);
  return st;
}

void ForgetStoredMount() {
  for (const char* name : {kFuseName, kPeersName, kStateName}) {
    absl::Status st = NotifyServiceManager(absl::StrCat("FDSTOREREMOVE=1\nFDNAME=", name));
    if (!st.ok()) spdlog::warn("supervisor: {}", std::string(st.message()));
  }
}

std::optional<KernelFuseState> MountFromServiceManager() {
  const char* pid = std::getenv("LISTEN_PID");
  const char* count = std::getenv("LISTEN_FDS");
  const char* names = std::getenv("LISTEN_FDNAMES");
  if (pid == nullptr || count == nullptr || std::atoi(pid) != getpid()) return std::nullopt;
  const int n = std::atoi(count);
  std::vector<std::string> name_list =
      absl::StrSplit(names == nullptr ? "" : names, ':', absl::SkipEmpty());
  unsetenv("LISTEN_PID");  // not the agent's
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  int fuse = -1, peers = -1, memfd = -1;
  for (int i = 0; i < n; i++) {
    const int fd = kListenFdsStart + i;
    const std::string name = i < static_cast<int>(name_list.size()) ? name_list[i] : "";
    if (name == kFuseName) {
      fuse = fd;
    } else if (name == kPeersName) {
      peers = fd;
    } else if (name == kStateName) {
      memfd = fd;
    } else {
      close(fd);  // not ours: not for the agent either
    }
  }
  if (fuse < 0 && peers < 0 && memfd < 0) return std::nullopt;
  if (fuse < 0 || memfd < 0) {
    spdlog::error("supervisor: the service manager passed part of a mount; mounting afresh");
    for (int fd : {fuse, peers, memfd}) {
      if (fd >= 0) close(fd);
    }
    return std::nullopt;
  }
  auto s = StateFromMemfd(memfd, fuse, peers);
  if (!s.ok()) {
    spdlog::error("supervisor: the mount kept by the service manager is unreadable: {}",
                  std::string(s.status().message()));
    return std::nullopt;
  }
  return std::move(*s);
}

}  // namespace ember::cachefs
