// The RDMA client transport and the server's queue-pair responder (rdma.h). Verbs calls stay in
// verbs.cc; this file holds sessions, the control channel over TCP, and device choice.
#include <unistd.h>

#include <cstring>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "transport/rdma/rdma.h"
#include "transport/rdma/verbs.h"
#include "transport/socket_util.h"

namespace ember::transport {
namespace {

// The first verbs device with an active port; `why` says which, or why none (with the probe's
// error, if any).
std::optional<RdmaDeviceInfo> ActiveDevice(std::string* why) {
  std::string error;
  auto device = ChooseRdmaDevice(ProbeRdmaDevices(&error), why);
  if (!device && !error.empty()) absl::StrAppend(why, " (", error, ")");
  return device;
}

// The client: per peer, a TCP control connection plus a connected endpoint. Thread-safe: one
// block in flight per transport (mu_ is held across a fetch); enough for a fill pool.
class RdmaTransport final : public BlockTransport {
 public:
  RdmaTransport(const RdmaDeviceInfo& device, const TransportOptions& options)
      : device_(device), options_(options) {}
  ~RdmaTransport() override {
    for (auto& [peer, s] : sessions_) close(s->fd);
  }
  const char* name() const override { return "rdma"; }

  absl::Status Fetch(const std::string& peer, const BlockAddr& addr, uint64_t offset,
                     uint32_t length, char* buf, FetchInfo* info) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(peer);
    if (it == sessions_.end()) {
      auto s = Open(peer);
      if (!s.ok()) return s.status();
      it = sessions_.emplace(peer, std::move(*s)).first;
    }
    Session& s = *it->second;
    Request q = MakeRequest(next_id_++, addr, offset, length);
    q.remote_addr = reinterpret_cast<uint64_t>(s.ep->buffer());
    q.rkey = s.ep->local().rkey;
    std::string qf = EncodeRequest(q);
    std::string pf(kResponseSize, '\0');
    absl::Status st = WriteFull(s.fd, qf.data(), qf.size());
    if (st.ok()) st = ReadFull(s.fd, pf.data(), pf.size());
    auto resp = st.ok() ? DecodeResponse(pf) : std::nullopt;
    if (!resp || resp->request_id != q.request_id) {
      close(s.fd);
      sessions_.erase(it);
      return absl::UnavailableError(absl::StrCat("peer ", peer, ": RDMA control channel lost"));
    }
    if (resp->status == WireStatus::kNotFound) return absl::NotFoundError("peer lacks block");
    if (resp->status != WireStatus::kOk || resp->length != length) {
      return absl::UnavailableError(
          absl::StrCat("peer ", peer, ": ", WireStatusName(resp->status)));
    }
    std::memcpy(buf, s.ep->buffer(), length);
    if (info) {
      info->block_checksum = resp->block_checksum;
      info->block_length = resp->block_length;
    }
    return absl::OkStatus();
  }

 private:
  struct Session {
    int fd = -1;
    std::unique_ptr<RdmaEndpoint> ep;
  };

  // Connects, authenticates and swaps queue-pair parameters with `peer`.
  // Returns: Unavailable (connect, token, no RDMA on the server, QP setup).
  absl::StatusOr<std::unique_ptr<Session>> Open(const std::string& peer) {
    auto fd = ConnectTcp(peer, options_.connect_timeout, options_.io_timeout);
    if (!fd.ok()) return fd.status();
    auto session = std::make_unique<Session>();
    session->fd = *fd;
    std::string qi(kQpInfoSize, '\0');
    absl::Status st = ClientHandshake(*fd, peer, options_.token);
    if (!st.ok()) return Fail(session.get(), peer, std::string(st.message()));
    auto ep = RdmaEndpoint::Create(device_, kMaxLength);
    if (!ep.ok()) return Fail(session.get(), peer, std::string(ep.status().message()));
    session->ep = std::move(*ep);
    std::string mine = EncodeQpInfo(session->ep->local());
    st = WriteFull(*fd, mine.data(), mine.size());
    if (st.ok()) st = ReadFull(*fd, qi.data(), qi.size());
    auto theirs = st.ok() ? DecodeQpInfo(qi) : std::nullopt;
    if (!theirs) return Fail(session.get(), peer, "server has no RDMA");
    st = session->ep->Connect(*theirs);
    if (!st.ok()) return Fail(session.get(), peer, std::string(st.message()));
    return session;
  }

  static absl::Status Fail(Session* s, const std::string& peer, const std::string& why) {
    close(s->fd);
    return absl::UnavailableError(absl::StrCat("peer ", peer, ": RDMA setup: ", why));
  }

  const RdmaDeviceInfo device_;
  const TransportOptions options_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// Server side, one per connection: reads the block into the registered buffer, then RDMA-WRITEs
// it into the client's.
class RdmaBlockWriter final : public BlockWriter {
 public:
  explicit RdmaBlockWriter(std::unique_ptr<RdmaEndpoint> ep) : ep_(std::move(ep)) {}

  absl::Status Write(int fd, uint64_t offset, uint32_t length, uint64_t remote_addr, uint32_t rkey,
                     std::chrono::milliseconds timeout) override {
    ssize_t n = pread(fd, ep_->buffer(), length, static_cast<off_t>(offset));
    if (n != static_cast<ssize_t>(length))
      return absl::DataLossError("short read of the block file");
    return ep_->WriteTo(length, remote_addr, rkey, timeout);
  }

 private:
  std::unique_ptr<RdmaEndpoint> ep_;
};

// Immutable after construction, so connection threads may call Accept at once.
class RdmaResponder final : public QpResponder {
 public:
  explicit RdmaResponder(const RdmaDeviceInfo& device) : device_(device) {}

  absl::StatusOr<std::unique_ptr<BlockWriter>> Accept(const QpInfo& remote,
                                                      QpInfo* local) override {
    auto ep = RdmaEndpoint::Create(device_, kMaxLength);
    if (!ep.ok()) return ep.status();
    absl::Status st = (*ep)->Connect(remote);
    if (!st.ok()) return st;
    *local = (*ep)->local();
    return std::make_unique<RdmaBlockWriter>(std::move(*ep));
  }

 private:
  const RdmaDeviceInfo device_;
};

}  // namespace

std::unique_ptr<BlockTransport> NewRdmaTransportIfActive(const TransportOptions& options,
                                                         std::string* why) {
  auto device = ActiveDevice(why);
  if (!device) return nullptr;
  return std::make_unique<RdmaTransport>(*device, options);
}

std::unique_ptr<QpResponder> NewRdmaResponderIfActive(std::string* why) {
  auto device = ActiveDevice(why);
  if (!device) return nullptr;
  return std::make_unique<RdmaResponder>(*device);
}

}  // namespace ember::transport
