// The RDMA client transport and the server's queue-pair responder (rdma.h). Verbs calls go
// through the seam (verbs.h); what both share per process is in rdma_hub.h. This file holds the
// client's sessions, the control channel over TCP, fallback and recovery, and the server's writer.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file_io.h"
#include "spdlog/spdlog.h"
#include "transport/rdma/rdma_hub.h"
#include "transport/socket_util.h"

namespace ember::transport {
namespace {

// The client: per peer, a pool of sessions; per peer, whether it speaks RDMA.
class RdmaTransport final : public BlockTransport {
 public:
  RdmaTransport(std::shared_ptr<RdmaHub> hub, const TransportOptions& options)
      : hub_(std::move(hub)), options_(options), tcp_(NewTcpTransport(options)) {}
  ~RdmaTransport() override = default;
  const char* name() const override { return "rdma"; }

  absl::StatusOr<std::string> Call(const std::string& peer, std::string_view request,
                                   std::chrono::milliseconds timeout) override {
    return tcp_->Call(peer, request, timeout);  // calls are small: always over TCP
  }

  absl::Status Fetch(const std::string& peer, const BlockAddr& addr, uint64_t offset,
                     uint32_t length, char* buf, FetchInfo* info) override {
    if (length > kMaxLength) return absl::InvalidArgumentError("length over the limit");
    if (UsesTcp(peer)) return FetchOverTcp(peer, addr, offset, length, buf, info);
    for (int attempt = 0; attempt < 2; attempt++) {
      bool refused = false;  // the peer cannot do RDMA with us: TCP for it
      // The retry always builds a new session: the other idle ones may be as dead.
      auto session = attempt == 0 ? GetSession(peer, &refused) : Open(peer, &refused);
      if (!session.ok()) {
        if (!refused) return session.status();
        MarkTcp(peer, std::string(session.status().message()));
        return FetchOverTcp(peer, addr, offset, length, buf, info);
      }
      auto buffer = (*session)->device->client_pool->Acquire(length, options_.io_timeout);
      if (!buffer.ok()) {
        // Out of registered memory (said once per cause); this fetch goes over TCP.
        WarnOnce("buffers", std::string(buffer.status().message()));
        PutSession(peer, std::move(*session));
        return FetchOverTcp(peer, addr, offset, length, buf, info);
      }
      absl::Status s = FetchOn(**session, peer, addr, offset, length, **buffer, buf, info);
      const bool first_write = !(*session)->used;
      (*session)->used = true;
      if (s.ok() || absl::IsNotFound(s) || absl::IsInvalidArgument(s) ||
          absl::IsResourceExhausted(s)) {
        (*session)->device->client_pool->Release(std::move(*buffer));
        PutSession(peer, std::move(*session));
        if (!absl::IsResourceExhausted(s)) return s;
        // The peer's RDMA buffers are all in use: this block over TCP.
        return FetchOverTcp(peer, addr, offset, length, buf, info);
      }
      // The session is gone: its QP is destroyed before the buffer can be written into again.
      RdmaHub::Device* device = (*session)->device;
      session->reset();
      device->client_pool->Release(std::move(*buffer));
      DropIdle(peer);  // a restarted peer or a flapped link took those too
      if (first_write && absl::IsAborted(s)) {
        // The queue pairs connected but the first WRITE never arrived (a path RDMA cannot
        // take: a GID on another subnet or VLAN): TCP for this peer.
        MarkTcp(peer, std::string(s.message()));
        return FetchOverTcp(peer, addr, offset, length, buf, info);
      }
      if (!absl::IsUnavailable(s) && !absl::IsAborted(s)) return s;
      if (attempt == 1) return absl::UnavailableError(s.message());
      // An idle-closed connection, a flapped link, a failed write: once more on a fresh session.
      spdlog::debug("peer {}: RDMA session ended ({}); retrying on a new one", peer,
                    std::string(s.message()));
    }
    return absl::UnavailableError(absl::StrCat("peer ", peer, ": RDMA session lost"));
  }

 private:
  struct Session {
    int fd = -1;
    RdmaHub::Device* device = nullptr;
    std::unique_ptr<QueuePair> qp;
    bool used = false;  // a block has been asked for on it
    ~Session() {
      qp.reset();  // first: no write lands in a buffer after this
      if (fd >= 0) close(fd);
    }
  };

  absl::Status FetchOverTcp(const std::string& peer, const BlockAddr& addr, uint64_t offset,
                            uint32_t length, char* buf, FetchInfo* info) {
    hub_->CountFallback();
    return tcp_->Fetch(peer, addr, offset, length, buf, info);
  }

  bool UsesTcp(const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = tcp_until_.find(peer);
    if (it == tcp_until_.end()) return false;
    if (std::chrono::steady_clock::now() < it->second) return true;
    tcp_until_.erase(it);  // time to ask again
    return false;
  }

  void MarkTcp(const std::string& peer, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_) {
    hub_->NoteError(why);
    bool first = false;
    {
      absl::MutexLock lock(&mu_);
      tcp_until_[peer] = std::chrono::steady_clock::now() + kRetryRdmaAfter;
      first = said_.insert(peer).second;
    }
    if (first) spdlog::warn("peer {}: no RDMA ({}); fetching from it over TCP", peer, why);
  }

  void WarnOnce(const std::string& key, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_) {
    hub_->NoteError(why);
    bool first = false;
    {
      absl::MutexLock lock(&mu_);
      first = said_.insert(key).second;
    }
    if (first) spdlog::error("RDMA: {}; those fetches go over TCP", why);
  }

  // An idle session to `peer`, else a new one (Open).
  absl::StatusOr<std::unique_ptr<Session>> GetSession(const std::string& peer, bool* refused)
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      auto& v = idle_[peer];
      if (!v.empty()) {
        auto s = std::move(v.back());
        v.pop_back();
        return s;
      }
    }
    return Open(peer, refused);
  }

  void DropIdle(const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::unique_ptr<Session>> idle;
    {
      absl::MutexLock lock(&mu_);
      idle.swap(idle_[peer]);
    }  // closed outside the lock
  }

  void PutSession(const std::string& peer, std::unique_ptr<Session> s) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto& v = idle_[peer];
    if (v.size() < options_.max_idle_per_peer) v.push_back(std::move(s));
  }

  // Connects, authenticates and swaps queue-pair parameters with `peer`. `*refused`: the failure
  // means RDMA cannot work with this peer (not offered, refused, no port, mismatched), rather
  // than the peer being unreachable. Returns: PermissionDenied (token), Unavailable, or
  // FailedPrecondition (refused).
  absl::StatusOr<std::unique_ptr<Session>> Open(const std::string& peer, bool* refused) {
    auto fd = ConnectTcp(peer, options_.connect_timeout, options_.io_timeout);
    if (!fd.ok()) return fd.status();
    auto s = std::make_unique<Session>();
    s->fd = *fd;
    uint32_t flags = 0;
    absl::Status st = ClientHandshake(s->fd, peer, options_.token, &flags);
    if (!st.ok()) return st;  // PermissionDenied stays PermissionDenied
    auto refuse = [&](const std::string& why) {
      *refused = true;
      return absl::FailedPreconditionError(why);
    };
    if ((flags & kHelloRdma) == 0) return refuse("the peer does not offer RDMA");
    auto choice = hub_->Choose(LocalAddress(s->fd));
    if (!choice.ok()) return refuse(std::string(choice.status().message()));
    auto device = hub_->Open(choice->device);
    if (!device.ok()) return refuse(std::string(device.status().message()));
    s->device = *device;
    auto qp = s->device->ctx->CreateQp(kMaxSendWr);
    if (!qp.ok()) return refuse(std::string(qp.status().message()));
    s->qp = std::move(*qp);
    st = s->qp->ToInit(choice->port.port, /*remote_write=*/true);
    if (!st.ok()) return refuse(std::string(st.message()));
    const uint32_t psn = RandomPsn();
    std::string mine = EncodeQpInfo(LocalQpInfo(*s->qp, *choice, psn));
    st = WriteFull(s->fd, mine.data(), mine.size());
    // The answer is the server's QpInfo, or a Response saying why not.
    std::string frame(kHeaderSize, '\0');
    if (st.ok()) st = ReadFull(s->fd, frame.data(), frame.size());
    if (!st.ok()) return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", st.message()));
    const auto type = static_cast<FrameType>(static_cast<uint8_t>(frame[6]) |
                                             (static_cast<uint8_t>(frame[7]) << 8));
    const size_t size = type == FrameType::kQpInfo     ? kQpInfoSize
                        : type == FrameType::kResponse ? kResponseSize
                                                       : 0;
    if (size == 0) return refuse("the peer answered the queue-pair handshake with garbage");
    frame.resize(size);
    st = ReadFull(s->fd, frame.data() + kHeaderSize, size - kHeaderSize);
    if (!st.ok()) return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", st.message()));
    if (type == FrameType::kResponse) {
      auto r = DecodeResponse(frame);
      return refuse(absl::StrCat("the peer refused RDMA: ",
                                 r ? WireStatusName(r->status) : "malformed answer"));
    }
    auto theirs = DecodeQpInfo(frame);
    if (!theirs) return refuse("the peer's queue-pair parameters are malformed");
    st = CheckRemote(*theirs, *choice);
    if (st.ok()) st = Connect(*s->qp, *choice, *theirs, psn, options_.rdma_traffic_class);
    if (!st.ok()) return refuse(std::string(st.message()));
    hub_->CountSession();
    return s;
  }

  // One request on a session. Returns: Ok; NotFound; InvalidArgument (session still in step);
  // Unavailable (the session must go); DataLoss.
  absl::Status FetchOn(Session& s, const std::string& peer, const BlockAddr& addr, uint64_t offset,
                       uint32_t length, MemoryRegion& mr, char* buf, FetchInfo* info) {
    Request q = MakeRequest(next_id_++, addr, offset, length);
    q.remote_addr = reinterpret_cast<uint64_t>(mr.data());
    q.rkey = mr.rkey();
    std::string qf = EncodeRequest(q);
    std::string pf(kResponseSize, '\0');
    absl::Status st = WriteFull(s.fd, qf.data(), qf.size());
    if (st.ok()) st = ReadFull(s.fd, pf.data(), pf.size());
    if (!st.ok()) return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", st.message()));
    auto resp = DecodeResponse(pf);
    if (!resp || resp->request_id != q.request_id) {
      return absl::UnavailableError(absl::StrCat("peer ", peer, ": malformed response"));
    }
    if (resp->status == WireStatus::kInternal) {  // Aborted: the session's QP is gone
      return absl::AbortedError(absl::StrCat("peer ", peer, ": its RDMA write failed"));
    }
    if (resp->status == WireStatus::kBusy) {
      return absl::ResourceExhaustedError(absl::StrCat("peer ", peer, ": RDMA buffers busy"));
    }
    if (resp->status != WireStatus::kOk) return FromWire(resp->status, peer);
    if (resp->length != length) {
      return absl::UnavailableError(
          absl::StrCat("peer ", peer, ": answered ", resp->length, " bytes for ", length));
    }
    // Out of the registered buffer, hashed in pieces while they are in the CPU's cache.
    BlockChecksummer sum;
    for (uint32_t done = 0; done < length;) {
      const uint32_t n = std::min<uint32_t>(BlockChecksummer::kPiece, length - done);
      std::memcpy(buf + done, mr.data() + done, n);
      sum.Update(buf + done, n);
      done += n;
    }
    if (info != nullptr) {
      info->block_checksum = resp->block_checksum;
      info->block_length = resp->block_length;
      info->received_checksum = sum.Digest();
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<RdmaHub> hub_;
  const TransportOptions options_;
  const std::unique_ptr<BlockTransport> tcp_;  // for peers without RDMA
  absl::Mutex mu_;
  std::map<std::string, std::vector<std::unique_ptr<Session>>> idle_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::chrono::steady_clock::time_point> tcp_until_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> said_ ABSL_GUARDED_BY(mu_);  // what was logged once
  std::atomic<uint64_t> next_id_{1};
};

// Server side, one per connection: puts the block into a registered buffer, RDMA-WRITEs it into
// the client's, and waits for that WR's completion. After any failure the writer is dead (its QP
// in ERR) and the server ends the connection.
class RdmaBlockWriter final : public BlockWriter {
 public:
  RdmaBlockWriter(RdmaHub::Device* device, std::unique_ptr<QueuePair> qp)
      : device_(device), qp_(std::move(qp)) {}
  ~RdmaBlockWriter() override {
    qp_.reset();  // first: the NIC no longer reads what it was given
    for (auto& mr : stuck_) device_->server_pool->Release(std::move(mr));
  }

  absl::Status Write(const BlockSource::Block& block, uint64_t offset, uint32_t length,
                     uint64_t remote_addr, uint32_t rkey,
                     std::chrono::milliseconds timeout) override {
    if (dead_) return absl::UnavailableError("the queue pair failed earlier");
    if (length > kMaxLength) return absl::InvalidArgumentError("longer than a block");
    // No buffer free in time: the connection stays (the client takes this block over TCP).
    auto mr = device_->server_pool->Acquire(length, timeout / 4);
    if (!mr.ok()) return absl::ResourceExhaustedError(mr.status().message());
    if (block.data != nullptr) {
      std::memcpy((*mr)->data(), block.data + offset, length);
    } else if (!PreadFull(block.fd, block.offset + offset, length, (*mr)->data())) {
      device_->server_pool->Release(std::move(*mr));
      return absl::DataLossError("short read of the block file");
    }
    const uint64_t wr = next_wr_++;
    absl::Status st = qp_->PostWrite(wr, **mr, 0, length, remote_addr, rkey);
    if (!st.ok()) {  // nothing was posted: the buffer is free
      device_->server_pool->Release(std::move(*mr));
      return Dead(st);
    }
    auto c = AwaitCompletion(*qp_, wr, std::chrono::steady_clock::now() + timeout);
    if (c) {
      device_->server_pool->Release(std::move(*mr));  // the NIC is done with it
      if (c->ok) return absl::OkStatus();
      return Dead(absl::UnavailableError(absl::StrCat("RDMA write: ", c->status)));
    }
    // Timed out: the NIC may still read the buffer. Stop the QP and wait for the flush.
    (void)qp_->ToError();
    auto flushed = AwaitCompletion(*qp_, wr, std::chrono::steady_clock::now() + kDrainWait);
    if (flushed) {
      device_->server_pool->Release(std::move(*mr));
    } else {
      // Back to the pool only once the QP is destroyed (the connection ends now).
      spdlog::error(
          "RDMA: a timed-out write was not even flushed; its buffer waits for its "
          "queue pair to be destroyed");
      device_->server_pool->CountQuarantined();
      stuck_.push_back(std::move(*mr));
    }
    return Dead(absl::UnavailableError("RDMA write timed out"));
  }

 private:
  absl::Status Dead(absl::Status s) {
    dead_ = true;
    return s;
  }

  RdmaHub::Device* const device_;
  std::unique_ptr<QueuePair> qp_;
  std::vector<std::unique_ptr<MemoryRegion>> stuck_;  // WRITEs never drained from these
  uint64_t next_wr_ = 1;
  bool dead_ = false;
};

class RdmaResponder final : public QpResponder {
 public:
  explicit RdmaResponder(std::shared_ptr<RdmaHub> hub) : hub_(std::move(hub)) {}

  absl::StatusOr<std::unique_ptr<BlockWriter>> Accept(const QpInfo& remote,
                                                      const std::string& local_ip,
                                                      QpInfo* local) override {
    auto choice = hub_->Choose(local_ip);
    if (!choice.ok()) return choice.status();
    absl::Status st = CheckRemote(remote, *choice);
    if (!st.ok()) return st;
    auto device = hub_->Open(choice->device);
    if (!device.ok()) return device.status();
    auto qp = (*device)->ctx->CreateQp(kMaxSendWr);
    if (!qp.ok()) return qp.status();
    // This side only writes: peers get no access to its memory.
    st = (*qp)->ToInit(choice->port.port, /*remote_write=*/false);
    const uint32_t psn = RandomPsn();
    if (st.ok()) st = Connect(**qp, *choice, remote, psn, hub_->options().rdma_traffic_class);
    if (!st.ok()) return st;
    *local = LocalQpInfo(**qp, *choice, psn);
    return std::make_unique<RdmaBlockWriter>(*device, std::move(*qp));
  }

 private:
  const std::shared_ptr<RdmaHub> hub_;
};

}  // namespace

std::unique_ptr<BlockTransport> NewRdmaTransport(std::shared_ptr<RdmaHub> hub,
                                                 const TransportOptions& options) {
  return std::make_unique<RdmaTransport>(std::move(hub), options);
}

std::unique_ptr<QpResponder> NewRdmaResponder(std::shared_ptr<RdmaHub> hub) {
  return std::make_unique<RdmaResponder>(std::move(hub));
}

std::unique_ptr<BlockTransport> NewRdmaTransportIfActive(const TransportOptions& options,
                                                         std::string* why) {
  auto hub = SystemHub(options, why);
  if (!hub) return nullptr;
  return NewRdmaTransport(std::move(hub), options);
}

std::unique_ptr<QpResponder> NewRdmaResponderIfActive(const TransportOptions& options,
                                                      std::string* why) {
  auto hub = SystemHub(options, why);
  if (!hub) return nullptr;
  return NewRdmaResponder(std::move(hub));
}

}  // namespace ember::transport
