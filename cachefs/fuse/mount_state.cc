#include "cachefs/fuse/mount_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace ember::cachefs {

ssize_t SendWithFds(int sock, const void* data, size_t len, const std::vector<int>& fds) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  std::memset(control, 0, sizeof(control));
  msghdr m;
  std::memset(&m, 0, sizeof(m));
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  const size_t n = std::min(fds.size(), kMaxPassedFds);
  if (n > 0) {
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * n);
  }
  return sendmsg(sock, &m, MSG_NOSIGNAL);
}

ssize_t RecvWithFds(int sock, void* buf, size_t len, int flags, std::vector<int>* fds) {
  iovec iov{buf, len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  msghdr m;
  std::memset(&m, 0, sizeof(m));
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  fds->clear();
  ssize_t n = recvmsg(sock, &m, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; i++) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(fd);
      }
    }
  }
  return n;
}

std::vector<int> StateFds(const KernelFuseState& s) {
  std::vector<int> fds{s.fd};
  if (s.peer_listen_fd >= 0) fds.push_back(s.peer_listen_fd);
  return fds;
}

void AttachStateFds(const std::vector<int>& fds, KernelFuseState* s) {
  s->fd = fds.empty() ? -1 : fds[0];
  s->peer_listen_fd = fds.size() > 1 ? fds[1] : -1;
  for (size_t i = 2; i < fds.size(); i++) close(fds[i]);
}

void CloseStateFds(KernelFuseState* s) {
  if (s->fd >= 0) close(s->fd);
  if (s->peer_listen_fd >= 0) close(s->peer_listen_fd);
  s->fd = -1;
  s->peer_listen_fd = -1;
}

absl::StatusOr<int> StateMemfd(const KernelFuseState& state) {
  int memfd = memfd_create("ember-mount-state", MFD_CLOEXEC);
  if (memfd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  const std::string text = EncodeMountState(state);
  if (write(memfd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    close(memfd);
    return absl::InternalError(absl::StrCat("writing the mount state: ", strerror(errno)));
  }
  return memfd;
}

absl::StatusOr<KernelFuseState> StateFromMemfd(int memfd, int fuse_fd, int peer_listen_fd) {
  std::vector<int> fds{fuse_fd};
  if (peer_listen_fd >= 0) fds.push_back(peer_listen_fd);
  std::string text;
  char chunk[4096];
  lseek(memfd, 0, SEEK_SET);
  for (ssize_t n; (n = read(memfd, chunk, sizeof(chunk))) > 0;) {
    text.append(chunk, static_cast<size_t>(n));
  }
  close(memfd);
  for (int f : fds) fcntl(f, F_SETFD, FD_CLOEXEC);
  auto s = DecodeMountState(text);
  if (!s.ok()) {
    for (int f : fds) close(f);
    return s.status();
  }
  AttachStateFds(fds, &*s);
  return s;
}

std::string EncodeMountState(const KernelFuseState& s) {
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
  return j.dump();
}

absl::StatusOr<KernelFuseState> DecodeMountState(const std::string& text) {
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

}  // namespace ember::cachefs
