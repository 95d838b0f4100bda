#include "cachefs/fuse/mount_state.h"

#include <sys/socket.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace ember::cachefs {

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
