// The TCP transport's client: pooled, authenticated connections; large blocks received straight
// into the caller's buffer, a batch's small ones through a read buffer; calls (BlockSource::Call
// on the peer) on a connection of their own time limit.
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file_io.h"
#include "transport/block_transport.h"
#include "transport/socket_util.h"
#include "transport/wire.h"

namespace ember::transport {
namespace {

// Thread-safety: mu_ guards only the idle pool; fetches run on a connection taken out of it.
class TcpTransport final : public BlockTransport {
 public:
  explicit TcpTransport(const TransportOptions& options) : options_(options) {}
  ~TcpTransport() override {
    for (auto& [peer, fds] : idle_) {
      for (int fd : fds) close(fd);
    }
  }

  const char* name() const override { return "tcp"; }

  absl::Status Fetch(const std::string& peer, const BlockAddr& addr, uint64_t offset,
                     uint32_t length, char* buf, FetchInfo* info) override {
    if (length > kMaxLength) return absl::InvalidArgumentError("length over the limit");
    for (int attempt = 0; attempt < 2; attempt++) {
      bool pooled = false;
      // The retry always connects afresh: the other idle connections may be as dead.
      auto fd = Get(peer, &pooled, /*fresh=*/attempt == 1);
      if (!fd.ok()) return fd.status();
      absl::Status s = FetchOn(*fd, peer, addr, offset, length, buf, info);
      if (s.ok() || absl::IsNotFound(s) || absl::IsInvalidArgument(s)) {
        Put(peer, *fd);  // the connection is still in step
        return s;
      }
      close(*fd);
      // A pooled connection the peer closed while idle: try once more on a fresh one.
      if (!pooled || !absl::IsUnavailable(s)) return s;
    }
    return absl::UnavailableError(absl::StrCat("peer ", peer, ": connection lost"));
  }

  void FetchMany(const std::string& peer, std::span<FetchPiece> pieces) override {
    size_t done = 0;
    absl::Status s;
    for (int attempt = 0; attempt < 2 && done < pieces.size(); attempt++) {
      bool pooled = false;
      auto fd = Get(peer, &pooled, /*fresh=*/attempt == 1);
      if (!fd.ok()) {
        s = fd.status();
        break;
      }
      size_t answered = 0;
      s = FetchManyOn(*fd, peer, pieces.subspan(done), &answered);
      done += answered;
      if (s.ok()) {
        Put(peer, *fd);  // every answer read: the connection is in step
        return;
      }
      close(*fd);
      // A pooled connection the peer closed while idle: once more on a fresh one.
      if (!pooled || answered > 0 || !absl::IsUnavailable(s)) break;
    }
    for (size_t i = done; i < pieces.size(); i++) pieces[i].status = s;
  }

  absl::StatusOr<std::string> Call(const std::string& peer, std::string_view request,
                                   std::chrono::milliseconds timeout) override {
    if (request.size() > kMaxCallLength) return absl::InvalidArgumentError("call over the limit");
    // A connection of its own (the answer may take long): not from the pool, not returned.
    bool pooled = false;
    auto fd = Get(peer, &pooled, /*fresh=*/true);
    if (!fd.ok()) return fd.status();
    transport::Call c;
    c.request_id = next_id_++;
    c.length = static_cast<uint32_t>(request.size());
    std::string f = EncodeCall(c);
    f.append(request);
    absl::Status s = WriteFull(*fd, f.data(), f.size());
    SetIoTimeout(*fd, timeout);
    std::string pf(kResponseSize, '\0');
    if (s.ok()) s = ReadFull(*fd, pf.data(), pf.size());
    std::optional<Response> resp;
    if (s.ok()) resp = DecodeResponse(pf);
    std::string answer;
    if (s.ok() && resp && resp->request_id == c.request_id && resp->status == WireStatus::kOk) {
      if (resp->length > kMaxCallLength) {
        close(*fd);
        return absl::DataLossError(absl::StrCat("peer ", peer, ": an answer over the limit"));
      }
      answer.resize(resp->length);
      s = ReadFull(*fd, answer.data(), answer.size());
    }
    close(*fd);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", s.message()));
    // (a server that does not know the call frame answers kBadRequest without its id)
    if (resp && resp->status == WireStatus::kBadRequest) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer ", peer, " does not know calls (an older agent)"));
    }
    if (!resp || resp->request_id != c.request_id) {
      return absl::DataLossError(absl::StrCat("peer ", peer, ": malformed answer to a call"));
    }
    if (resp->status != WireStatus::kOk) {
      return absl::UnavailableError(
          absl::StrCat("peer ", peer, ": the call failed (", WireStatusName(resp->status), ")"));
    }
    return answer;
  }

 private:
  absl::StatusOr<int> Get(const std::string& peer, bool* pooled, bool fresh)
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (!fresh) {
      absl::MutexLock lock(&mu_);
      auto& v = idle_[peer];
      if (!v.empty()) {
        int fd = v.back();
        v.pop_back();
        *pooled = true;
        return fd;
      }
    }
    auto fd = ConnectTcp(peer, options_.connect_timeout, options_.io_timeout);
    if (!fd.ok()) return fd.status();
    absl::Status s = ClientHandshake(*fd, peer, options_.token);
    if (!s.ok()) {
      close(*fd);
      return s;
    }
    return fd;
  }

  void Put(const std::string& peer, int fd) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto& v = idle_[peer];
    if (v.size() < options_.max_idle_per_peer) {
      v.push_back(fd);
    } else {
      close(fd);
    }
  }

  // Sends every request at once, then reads the answers in order. `*answered`: the pieces whose
  // answers were read (each with its status). Returns: an error that leaves the connection out
  // of step (the rest of the pieces unanswered).
  absl::Status FetchManyOn(int fd, const std::string& peer, std::span<FetchPiece> pieces,
                           size_t* answered) {
    *answered = 0;
    std::string frames;
    std::vector<uint64_t> ids;
    ids.reserve(pieces.size());
    for (const FetchPiece& p : pieces) {
      if (p.length > kMaxLength) return absl::InvalidArgumentError("length over the limit");
      ids.push_back(next_id_++);
      frames += EncodeRequest(MakeRequest(ids.back(), p.addr, 0, p.length));
    }
    absl::Status s = WriteFull(fd, frames.data(), frames.size());
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", s.message()));
    // The answers (and the bodies of small blocks) come in runs: read through a buffer.
    BufferedReader in(fd);
    std::string pf(kResponseSize, '\0');
    for (size_t i = 0; i < pieces.size(); i++) {
      FetchPiece& p = pieces[i];
      s = in.Read(pf.data(), pf.size(), nullptr, p.length);
      if (!s.ok()) return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", s.message()));
      auto resp = DecodeResponse(pf);
      if (!resp || resp->request_id != ids[i]) {
        return absl::DataLossError(absl::StrCat("peer ", peer, ": malformed response"));
      }
      if (resp->status != WireStatus::kOk) {
        p.status = FromWire(resp->status, peer);  // no body follows: still in step
      } else if (resp->length != p.length) {
        return absl::DataLossError(
            absl::StrCat("peer ", peer, ": answered ", resp->length, " bytes for ", p.length));
      } else {
        BlockChecksummer sum;
        s = in.Read(p.buf, p.length, &sum);
        if (!s.ok()) {
          return absl::UnavailableError(
              absl::StrCat("peer ", peer, ": short block: ", s.message()));
        }
        p.info.block_checksum = resp->block_checksum;
        p.info.block_length = resp->block_length;
        p.info.received_checksum = sum.Digest();
        p.status = absl::OkStatus();
      }
      *answered = i + 1;
    }
    if (in.buffered() != 0) {  // bytes nobody asked for: the connection cannot be reused
      return absl::DataLossError(absl::StrCat("peer ", peer, ": sent more than was asked"));
    }
    return absl::OkStatus();
  }

  absl::Status FetchOn(int fd, const std::string& peer, const BlockAddr& addr, uint64_t offset,
                       uint32_t length, char* buf, FetchInfo* info) {
    Request q = MakeRequest(next_id_++, addr, offset, length);
    std::string qf = EncodeRequest(q);
    absl::Status s = WriteFull(fd, qf.data(), qf.size());
    std::string pf(kResponseSize, '\0');
    if (s.ok()) s = ReadFull(fd, pf.data(), pf.size());
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", s.message()));
    auto resp = DecodeResponse(pf);
    if (!resp || resp->request_id != q.request_id) {
      return absl::DataLossError(absl::StrCat("peer ", peer, ": malformed response"));
    }
    if (resp->status != WireStatus::kOk) return FromWire(resp->status, peer);
    if (resp->length != length) {
      return absl::DataLossError(
          absl::StrCat("peer ", peer, ": answered ", resp->length, " bytes for ", length));
    }
    BlockChecksummer sum;
    s = ReadBulk(fd, buf, length, &sum);  // straight into the caller's buffer, hashed as it comes
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat("peer ", peer, ": short block: ", s.message()));
    }
    if (info != nullptr) {
      info->block_checksum = resp->block_checksum;
      info->block_length = resp->block_length;
      info->received_checksum = sum.Digest();
    }
    return absl::OkStatus();
  }

  const TransportOptions options_;
  absl::Mutex mu_;
  std::map<std::string, std::vector<int>> idle_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace

std::unique_ptr<BlockTransport> NewTcpTransport(const TransportOptions& options) {
  return std::make_unique<TcpTransport>(options);
}

}  // namespace ember::transport
