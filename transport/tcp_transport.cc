// The TCP transport's server (one thread per connection; large blocks sent from the cache file,
// with sendfile when in the page cache and read O_DIRECT when not (SendFromFile), the answers of
// small ones gathered and sent together; calls handed to the BlockSource). The client is
// tcp_client.cc. The server answers queue-pair handshakes only through the QpResponder it is given
// (qp_responder.h); it knows nothing of RDMA.
#include "transport/tcp_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/batch_read.h"
#include "common/file_io.h"
#include "transport/block_transport.h"
#include "transport/qp_responder.h"
#include "transport/socket_util.h"
#include "transport/wire.h"

namespace ember::transport {
namespace {

constexpr auto kIdleTimeout = std::chrono::minutes(5);
// Bodies up to kGatherMax are copied in with their answers (small files); the answers gathered
// are sent once kFlushAt bytes are waiting, or when no request is.
constexpr uint32_t kGatherMax = 256 << 10;
constexpr size_t kFlushAt = 1 << 20;

// The answers gathered for one send, and the reads of their bodies still to do: small bodies in
// cache files are read all at once when the answers go (BatchPread: one submission, one wait;
// a holder serving a prefetch reads blocks that left its memory from disk, and read one by one
// each was a disk request, a notify of the disk and a sleep of this thread).
struct Outbox {
  struct Read {
    int fd;
    uint64_t offset;
    size_t len;
    size_t at;                         // where the body goes in bytes
    size_t resp_at;                    // where its answer starts in bytes
    std::shared_ptr<const void> hold;  // keeps fd valid
  };
  std::string bytes;
  std::vector<Read> reads;
  bool empty() const { return bytes.empty(); }
  size_t size() const { return bytes.size(); }
};

// Thread-safety: mu_ guards the connection set, the threads and the counters; no I/O happens
// under it (a connection thread takes it only to count, and once to leave).
class TcpServer final : public BlockServer {
 public:
  // wake_fd: an eventfd (owned) that ends the accept loop.
  TcpServer(int listen_fd, int wake_fd, int port, BlockSource* source,
            const TransportOptions& options, std::unique_ptr<QpResponder> responder)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        port_(port),
        source_(source),
        options_(options),
        responder_(std::move(responder)) {
    // Polled: a connection gone before accept() must not block the acceptor (the flag is the
    // socket's, kept by a server it is handed to; accepted sockets do not inherit it).
    fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~TcpServer() override {
    Stop();
    close(wake_fd_);
  }

  int port() const override { return port_; }
  int listener() const override { return listen_fd_.load(); }

  int ReleaseListener() override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_ || releasing_) return -1;
      releasing_ = true;
    }
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));  // the acceptor polls it beside the socket
    if (acceptor_.joinable()) acceptor_.join();
    return listen_fd_.exchange(-1);
  }

  Stats GetStats() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  void Stop() override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      stopped_ = true;
      for (int fd : conns_) shutdown(fd, SHUT_RDWR);
    }
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    if (acceptor_.joinable()) acceptor_.join();
    if (int fd = listen_fd_.exchange(-1); fd >= 0) close(fd);
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

 private:
  // Accepts until woken by Stop or ReleaseListener (the socket itself is left listening, so a
  // released one keeps its backlog for the next server).
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    const int listen_fd = listen_fd_.load();
    while (true) {
      pollfd p[2] = {{listen_fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      if (poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents & POLLIN) return;
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
        return;
      }
      bool busy = false;
      {
        absl::MutexLock lock(&mu_);
        if (stopped_) {
          close(fd);
          return;
        }
        busy = conns_.size() >= options_.max_connections;
        if (!busy) {
          conns_.insert(fd);
          JoinFinished();
          threads_.emplace_back([this, fd] {
            Serve(fd);
            absl::MutexLock l(&mu_);
            conns_.erase(fd);
            close(fd);
            finished_.insert(std::this_thread::get_id());
          });
        }
      }
      if (busy) RefuseBusy(fd);
    }
  }

  // Joins connection threads that have finished, so their stacks do not pile up.
  void JoinFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (finished_.count(it->get_id())) {
        finished_.erase(it->get_id());
        it->join();
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Refuses politely over the connection limit: the client sees Busy instead of a hang.
  static void RefuseBusy(int fd) {
    SetIoTimeout(fd, std::chrono::milliseconds(200));
    Hello h;
    std::string f = EncodeHello(h);
    // Best effort: the connection is closed either way, and the client reads EOF as Unavailable.
    (void)WriteFull(fd, f.data(), f.size());
    Response r;
    r.status = WireStatus::kBusy;
    std::string rf = EncodeResponse(r);
    (void)WriteFull(fd, rf.data(), rf.size());  // best effort, as above
    close(fd);
  }

  void Count(uint64_t Stats::*field, uint64_t n = 1) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    stats_.*field += n;
  }

  void Serve(int fd) {
    SetIoTimeout(fd, options_.io_timeout);
    Hello hello;
    hello.nonce = RandomNonce();
    if (responder_) hello.flags |= kHelloRdma;
    std::string hf = EncodeHello(hello);
    if (!WriteFull(fd, hf.data(), hf.size()).ok()) return;
    std::string buf(kAuthSize, '\0');
    if (!ReadFull(fd, buf.data(), buf.size()).ok()) return;
    auto auth = DecodeAuth(buf);
    AuthReply reply;
    if (!auth) {
      Count(&Stats::bad_frames);
      return;
    }
    if (!MacEqual(auth->mac, TokenMac(options_.token, hello.nonce))) {
      Count(&Stats::refused);
      spdlog::warn("peer server: refused a connection with a wrong cluster token");
      reply.status = WireStatus::kUnauthorized;
    }
    std::string rf = EncodeAuthReply(reply);
    if (!WriteFull(fd, rf.data(), rf.size()).ok() || reply.status != WireStatus::kOk) return;

    std::unique_ptr<BlockWriter> writer;  // set once the client connects a queue pair
    // A batch of requests (FetchMany) arrives together: they are read from one buffer, and the
    // answers of small blocks gathered in `out`, sent once no more requests are waiting.
    BufferedReader in(fd);
    Outbox out;
    while (true) {
      if (in.buffered() == 0) {
        if (!Flush(fd, &out)) return;
        if (!WaitReadable(fd, kIdleTimeout)) return;
      }
      std::string frame(kHeaderSize, '\0');
      if (!in.Read(frame.data(), frame.size()).ok()) return;
      size_t size = ClientFrameSize(frame);
      FrameType type = static_cast<FrameType>(static_cast<uint8_t>(frame[6]) |
                                              (static_cast<uint8_t>(frame[7]) << 8));
      if (size == 0 || type == FrameType::kAuth) {
        BadFrame(fd, &out);
        return;
      }
      frame.resize(size);
      if (!in.Read(frame.data() + kHeaderSize, size - kHeaderSize).ok()) return;
      if (type == FrameType::kQpInfo) {
        if (!Flush(fd, &out) || !ServeQpInfo(fd, frame, &writer)) return;
        continue;
      }
      if (type == FrameType::kCall) {
        if (!Flush(fd, &out) || !ServeCall(fd, frame, &in)) return;
        continue;
      }
      auto q = DecodeRequest(frame);
      if (!q) {
        BadFrame(fd, &out);
        return;
      }
      if (!ServeRequest(fd, *q, writer.get(), &out)) return;
    }
  }

  // Sends the answers gathered. Returns: false if the connection failed.
  static bool Flush(int fd, Outbox* out) {
    if (out->empty()) return true;
    const size_t good = ReadBodies(out);
    const bool ok = WriteFull(fd, out->bytes.data(), good).ok() && good == out->size();
    out->bytes.clear();
    return ok;
  }

  // Reads the bodies out waits for, all at once. Returns: how much of out->bytes is whole: all
  // of it, or up to the answer of the first body that could not be read (the client sees a
  // short read there and moves on; the connection ends).
  static size_t ReadBodies(Outbox* out) {
    if (out->reads.empty()) return out->size();
    std::vector<PreadOp> ops;
    ops.reserve(out->reads.size());
    for (const Outbox::Read& r : out->reads) {
      ops.push_back(
          {.fd = r.fd, .offset = r.offset, .len = r.len, .buf = out->bytes.data() + r.at});
    }
    BatchPread(ops);
    size_t good = out->size();
    for (size_t i = 0; i < ops.size(); i++) {
      if (ops[i].result != static_cast<int64_t>(ops[i].len)) {
        good = out->reads[i].resp_at;
        break;
      }
    }
    out->reads.clear();
    return good;
  }

  // Garbage: say so once, then drop the connection (framing can no longer be trusted).
  void BadFrame(int fd, Outbox* out = nullptr) {
    Count(&Stats::bad_frames);
    Response resp;
    resp.status = WireStatus::kBadRequest;
    std::string f = EncodeResponse(resp);
    if (out != nullptr) {  // the answers before it first
      const size_t good = ReadBodies(out);
      if (good < out->size()) f.clear();  // a short answer: the error cannot follow it
      f = out->bytes.substr(0, good) + f;
    }
    (void)WriteFull(fd, f.data(), f.size());  // best effort: the caller drops the connection
  }

  // A client's queue-pair handshake: the responder sets up this side and `*writer` serves the
  // connection's one-sided requests; without a responder (or if it fails) the answer is
  // kUnsupported and the connection ends. Returns whether to keep serving.
  bool ServeQpInfo(int fd, const std::string& frame, std::unique_ptr<BlockWriter>* writer) {
    auto remote = DecodeQpInfo(frame);
    if (!remote) {
      BadFrame(fd);
      return false;
    }
    absl::Status st = absl::UnavailableError("no RDMA device on this node");
    if (responder_) {
      QpInfo mine;
      auto w = responder_->Accept(*remote, LocalAddress(fd), &mine);
      st = w.status();
      if (st.ok()) {
        *writer = std::move(*w);
        std::string f = EncodeQpInfo(mine);
        return WriteFull(fd, f.data(), f.size()).ok();
      }
    }
    spdlog::warn("peer server: RDMA setup refused: {}", std::string(st.message()));
    Response resp;
    resp.status = WireStatus::kUnsupported;
    std::string f = EncodeResponse(resp);
    (void)WriteFull(fd, f.data(), f.size());  // best effort: the connection ends here
    return false;
  }

  // A peer's call: its payload goes to the source, the answer back with a Response. The
  // connection waits while the source works. Returns whether to keep serving.
  bool ServeCall(int fd, const std::string& frame, BufferedReader* in) {
    auto c = DecodeCall(frame);
    if (!c) {
      BadFrame(fd);
      return false;
    }
    std::string request(c->length, '\0');
    if (!in->Read(request.data(), request.size()).ok()) return false;
    Count(&Stats::requests);
    Response resp;
    resp.request_id = c->request_id;
    absl::StatusOr<std::string> answer = source_->Call(request);
    if (!answer.ok()) {
      spdlog::warn("peer server: a call failed: {}", std::string(answer.status().message()));
      resp.status =
          absl::IsUnimplemented(answer.status()) ? WireStatus::kUnsupported : WireStatus::kInternal;
    } else if (answer->size() > kMaxCallLength) {
      resp.status = WireStatus::kInternal;
    } else {
      resp.length = static_cast<uint32_t>(answer->size());
    }
    std::string f = EncodeResponse(resp);
    if (resp.length > 0) f += *answer;
    return WriteFull(fd, f.data(), f.size()).ok();
  }

  // Answers one request: into `out` when its body is small (sent by Flush), else sent now.
  bool ServeRequest(int fd, const Request& q, BlockWriter* writer, Outbox* out) {
    Response resp;
    resp.request_id = q.request_id;
    Count(&Stats::requests);
    bool via_rdma = q.rkey != 0;
    auto block = source_->Get(q.addr);
    if (!block) {
      Count(&Stats::not_found);
      resp.status = WireStatus::kNotFound;
    } else if (q.offset + q.length > block->length) {
      resp.status = WireStatus::kBadRequest;
    } else if (via_rdma && writer == nullptr) {
      resp.status = WireStatus::kUnsupported;
    } else {
      resp.block_checksum = block->checksum;
      resp.block_length = block->length;
      resp.length = q.length;
    }
    if (resp.status == WireStatus::kOk && via_rdma) {
      // Put the bytes into the client's memory first, then answer over TCP. A failed write took
      // the queue pair with it: say so, and end the connection (the client builds a new one).
      absl::Status st =
          writer->Write(*block, q.offset, q.length, q.remote_addr, q.rkey, options_.io_timeout);
      if (absl::IsResourceExhausted(st)) {  // no buffer free: say busy, keep the connection
        resp.status = WireStatus::kBusy;
        resp.length = 0;
      } else if (!st.ok()) {
        spdlog::warn("peer server: RDMA write failed: {}", std::string(st.message()));
        resp.status = WireStatus::kInternal;
        resp.length = 0;
        (void)Flush(fd, out);  // best effort: the connection ends here
        std::string f = EncodeResponse(resp);
        (void)WriteFull(fd, f.data(), f.size());
        return false;
      }
    }
    const size_t resp_at = out->size();
    out->bytes += EncodeResponse(resp);
    const bool ok = resp.status == WireStatus::kOk && resp.length > 0;
    if (ok && !via_rdma && resp.length > kGatherMax) {
      // A large body goes on its own, straight from memory or the cache file; the client sees
      // a short read if this fails, and moves on.
      if (!Flush(fd, out)) return false;
      // No POSIX_FADV_WILLNEED of the blocks ahead: the file's own readahead (sendfile after
      // sendfile is sequential) reads a cold block more cheaply. Measured on a restore of
      // 4 x 512 MiB from a holder whose page cache was dropped, alternating: this block and the
      // next hinted, 1.08-1.38 s and 0.64-0.83 CPU-s on the holder; no hint, 0.85-1.11 s and
      // 0.50-0.68 CPU-s (with a warm page cache: 0.76-0.89 s, 0.33-0.54 CPU-s).
      absl::Status sent = block->data != nullptr
                              ? WriteFull(fd, block->data + q.offset, resp.length)
                              : SendFromFile(fd, block->fd, block->offset + q.offset, resp.length);
      if (!sent.ok()) return false;
      Count(&Stats::bytes, resp.length);
      return true;
    }
    if (ok && !via_rdma) {
      // A small body goes with the answers around it: one send for a batch of small files.
      const size_t at = out->size();
      out->bytes.resize(at + resp.length);
      if (block->data != nullptr) {
        memcpy(out->bytes.data() + at, block->data + q.offset, resp.length);
      } else {  // read with the others when the answers go (ReadBodies)
        out->reads.push_back(
            {block->fd, block->offset + q.offset, resp.length, at, resp_at, block->hold});
      }
    }
    if (ok) Count(&Stats::bytes, resp.length);
    return out->size() < kFlushAt || Flush(fd, out);
  }

  std::atomic<int> listen_fd_;
  int wake_fd_ = -1;
  bool releasing_ ABSL_GUARDED_BY(mu_) = false;
  int port_;
  BlockSource* source_;
  TransportOptions options_;
  const std::unique_ptr<QpResponder> responder_;  // null: queue pairs are refused
  std::thread acceptor_;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int> conns_ ABSL_GUARDED_BY(mu_);  // open connections, shut down by Stop
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::set<std::thread::id> finished_ ABSL_GUARDED_BY(mu_);  // threads_ ready to join
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<BlockServer>> StartTcpBlockServer(
    const std::string& listen, BlockSource* source, const TransportOptions& options,
    std::unique_ptr<QpResponder> responder) {
  // A client hanging up mid-send must cost one connection, not the process: sendfile() has no
  // MSG_NOSIGNAL, so SIGPIPE is ignored in any process that serves blocks.
  signal(SIGPIPE, SIG_IGN);
  int port = 0;
  auto fd = options.listen_fd >= 0 ? AdoptListener(options.listen_fd, listen, &port)
                                   : ListenTcp(listen, &port);
  if (!fd.ok()) return fd.status();
  int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    close(*fd);
    return absl::UnavailableError(absl::StrCat("eventfd: ", strerror(errno)));
  }
  return std::unique_ptr<BlockServer>(
      new TcpServer(*fd, wake, port, source, options, std::move(responder)));
}

}  // namespace ember::transport
