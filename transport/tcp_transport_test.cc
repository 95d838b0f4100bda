#include "transport/tcp_transport.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/testing.h"
#include "transport/block_transport.h"
#include "transport/qp_responder.h"
#include "transport/socket_util.h"
#include "transport/wire.h"

namespace ember::transport {
namespace {

// Blocks stored in one file, like a cache file.
class FileSource : public BlockSource {
 public:
  explicit FileSource(const std::string& path) : fd_(open(path.c_str(), O_RDONLY)) {}
  ~FileSource() override { close(fd_); }
  void Add(const BlockAddr& a, uint64_t offset, uint32_t length, uint64_t checksum) {
    blocks_[a] = {nullptr, fd_, offset, length, checksum, nullptr};
  }
  std::optional<Block> Get(const BlockAddr& a) override {
    auto it = blocks_.find(a);
    if (it == blocks_.end()) return std::nullopt;
    return it->second;
  }
  // Calls: "fail" fails, "" is not taken, anything else comes back reversed after `call_delay`.
  absl::StatusOr<std::string> Call(std::string_view request) override {
    if (request.empty()) return BlockSource::Call(request);
    if (request == "fail") return absl::InternalError("asked to fail");
    std::this_thread::sleep_for(call_delay);
    return std::string(request.rbegin(), request.rend());
  }
  std::chrono::milliseconds call_delay{0};

 private:
  int fd_;
  std::map<BlockAddr, Block> blocks_;
};

class TcpTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_.resize(3 << 20);
    for (size_t i = 0; i < data_.size(); i++) data_[i] = static_cast<char>(i * 31 + i / 4099);
    testing::WriteFile(dir_.Sub("cache"), data_);
    source_ = std::make_unique<FileSource>(dir_.Sub("cache"));
    source_->Add({1, 1, 5, 0}, 0, 1 << 20, BlockChecksum(data_.data(), 1 << 20));
    source_->Add({1, 1, 5, 1}, 1 << 20, 2 << 20, BlockChecksum(data_.data() + (1 << 20), 2 << 20));
    options_.token = "cluster-secret";
    options_.io_timeout = std::chrono::milliseconds(800);
    auto server = StartBlockServer("127.0.0.1:0", source_.get(), options_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    peer_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  // A raw, authenticated connection to the server for sending arbitrary bytes.
  int RawConnection(const std::string& token) { return RawConnectionTo(peer_, token); }
  int RawConnectionTo(const std::string& peer, const std::string& token) {
    auto fd = ConnectTcp(peer, std::chrono::seconds(1), std::chrono::seconds(2));
    EXPECT_TRUE(fd.ok());
    std::string hello(kHelloSize, '\0');
    EXPECT_TRUE(ReadFull(*fd, hello.data(), hello.size()).ok());
    Auth a;
    a.mac = TokenMac(token, DecodeHello(hello)->nonce);
    std::string af = EncodeAuth(a);
    EXPECT_TRUE(WriteFull(*fd, af.data(), af.size()).ok());
    std::string reply(kAuthReplySize, '\0');
    EXPECT_TRUE(ReadFull(*fd, reply.data(), reply.size()).ok());
    return *fd;
  }

  void ExpectServerStillServes() {
    auto client = NewTcpTransport(options_);
    std::string buf(1 << 20, '\0');
    EXPECT_TRUE(client->Fetch(peer_, {1, 1, 5, 0}, 0, 1 << 20, buf.data(), nullptr).ok());
    EXPECT_TRUE(buf == data_.substr(0, 1 << 20));
  }

  testing::TempDir dir_;
  std::string data_;
  std::unique_ptr<FileSource> source_;
  TransportOptions options_;
  std::unique_ptr<BlockServer> server_;
  std::string peer_;
};

TEST_F(TcpTransportTest, ClientHangingUpMidTransferDoesNotKillTheServer) {
  // Found by the chaos test: a client that gave up (timeout) closed its socket while the server
  // was still sending; sendfile() then raised SIGPIPE and killed the whole node.
  for (int i = 0; i < 5; i++) {
    int fd = RawConnection(options_.token);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    for (uint64_t id = 1; id <= 8; id++) {
      std::string req = EncodeRequest(MakeRequest(id, {1, 1, 5, 1}, 0, 2 << 20));
      ASSERT_TRUE(WriteFull(fd, req.data(), req.size()).ok());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    close(fd);  // unread megabytes in flight: the server's next send hits a closed socket
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ExpectServerStillServes();
}

TEST_F(TcpTransportTest, FetchesWholeAndPartialBlocks) {
  auto client = NewTcpTransport(options_);
  std::string buf(2 << 20, '\0');
  FetchInfo info;
  ASSERT_TRUE(client->Fetch(peer_, {1, 1, 5, 1}, 0, 2 << 20, buf.data(), &info).ok());
  EXPECT_TRUE(buf == data_.substr(1 << 20, 2 << 20));
  EXPECT_EQ(info.block_length, 2u << 20);
  EXPECT_EQ(info.block_checksum, BlockChecksum(buf.data(), buf.size()));
  // The client hashed the bytes as they arrived: the same checksum as hashing them after.
  ASSERT_TRUE(info.received_checksum.has_value());
  EXPECT_EQ(*info.received_checksum, BlockChecksum(buf.data(), buf.size()));
  // A range inside a block, on the pooled connection.
  std::string part(1000, '\0');
  ASSERT_TRUE(client->Fetch(peer_, {1, 1, 5, 1}, 12345, 1000, part.data(), nullptr).ok());
  EXPECT_TRUE(part == data_.substr((1 << 20) + 12345, 1000));
  EXPECT_EQ(server_->GetStats().requests, 2u);
  // The server counts bytes once they are sent, which may be a moment after the client has them.
  EXPECT_TRUE(testing::WaitFor([&] { return server_->GetStats().bytes == (2u << 20) + 1000; }))
      << server_->GetStats().bytes;
}

// Many small blocks in one round trip: every request goes out at once and the answers come back
// in order, each with its own status; a block the peer lacks, or asked past its end, costs the
// others nothing, and the connection stays in step for the next call.
TEST_F(TcpTransportTest, FetchManyPipelinesRequestsEachWithItsOwnStatus) {
  for (uint64_t i = 0; i < 300; i++) {
    const uint64_t off = i * 3001;
    source_->Add({2, 1, i, 0}, off, 2000 + i, BlockChecksum(data_.data() + off, 2000 + i));
  }
  auto client = NewTcpTransport(options_);
  std::vector<std::string> bufs(302);
  std::vector<FetchPiece> pieces(302);
  for (uint64_t i = 0; i < 302; i++) {
    bufs[i].assign(4000, '\0');
    pieces[i].addr = {2, 1, i, 0};
    pieces[i].length = i < 300 ? 2000 + i : 10;  // 300, 301: not held
    pieces[i].buf = bufs[i].data();
  }
  pieces[100].length = 3000;  // past the end of block 100
  // A large block amid the small ones (sent on its own, after the answers before it).
  std::string big(2 << 20, '\0');
  pieces.insert(pieces.begin() + 150,
                FetchPiece{.addr = {1, 1, 5, 1}, .length = 2 << 20, .buf = big.data()});
  client->FetchMany(peer_, pieces);
  ASSERT_TRUE(pieces[150].status.ok()) << pieces[150].status;
  EXPECT_EQ(big, data_.substr(1 << 20, 2 << 20));
  pieces.erase(pieces.begin() + 150);
  for (uint64_t i = 0; i < 302; i++) {
    if (i == 100) {
      EXPECT_EQ(pieces[i].status.code(), absl::StatusCode::kInvalidArgument);
    } else if (i >= 300) {
      EXPECT_EQ(pieces[i].status.code(), absl::StatusCode::kNotFound) << i;
    } else {
      ASSERT_TRUE(pieces[i].status.ok()) << i << ": " << pieces[i].status;
      EXPECT_EQ(bufs[i].substr(0, 2000 + i), data_.substr(i * 3001, 2000 + i)) << i;
      ASSERT_TRUE(pieces[i].info.received_checksum.has_value());
      EXPECT_EQ(*pieces[i].info.received_checksum, pieces[i].info.block_checksum);
    }
  }
  EXPECT_EQ(server_->GetStats().requests, 303u);
  // The same pooled connection serves a plain fetch next.
  ExpectServerStillServes();
  // Nobody listening: every piece says so.
  std::vector<FetchPiece> two(2);
  two[0] = {.addr = {2, 1, 0, 0}, .length = 2000, .buf = bufs[0].data()};
  two[1] = {.addr = {2, 1, 1, 0}, .length = 2001, .buf = bufs[1].data()};
  client->FetchMany(absl::StrCat("127.0.0.1:", testing::FreePort()), two);
  EXPECT_EQ(two[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(two[1].status.code(), absl::StatusCode::kUnavailable);
}

// Small bodies in cache files are read together when their answers go: one that cannot be read
// (its file is shorter than the block) ends the batch there: the answers before it arrive whole,
// it and the pieces after it fail, no wrong bytes are taken, and the server goes on serving.
TEST_F(TcpTransportTest, ABodyThatCannotBeReadFailsItAndWhatFollowsNothingBefore) {
  for (uint64_t i = 0; i < 40; i++) {
    const uint64_t off = i * 5003;
    source_->Add({4, 1, i, 0}, off, 3000, BlockChecksum(data_.data() + off, 3000));
  }
  source_->Add({4, 1, 20, 0}, data_.size() - 1000, 3000, 42);  // runs past the file's end
  auto client = NewTcpTransport(options_);
  std::vector<std::string> bufs(40, std::string(3000, '\0'));
  std::vector<FetchPiece> pieces(40);
  for (uint64_t i = 0; i < 40; i++) {
    pieces[i] = {.addr = {4, 1, i, 0}, .length = 3000, .buf = bufs[i].data()};
  }
  client->FetchMany(peer_, pieces);
  for (uint64_t i = 0; i < 20; i++) {
    ASSERT_TRUE(pieces[i].status.ok()) << i << ": " << pieces[i].status;
    EXPECT_EQ(bufs[i], data_.substr(i * 5003, 3000)) << i;
  }
  for (uint64_t i = 20; i < 40; i++) EXPECT_FALSE(pieces[i].status.ok()) << i;
  ExpectServerStillServes();
}

// A peer that answers a pipelined batch with garbage: the pieces not yet answered fail, nothing
// hangs, and no bytes are taken for a block.
TEST_F(TcpTransportTest, FetchManyFromAPeerSendingGarbageFailsCleanly) {
  int port = 0;
  auto listener = ListenTcp("127.0.0.1:0", &port);
  ASSERT_TRUE(listener.ok());
  std::thread fake([&] {
    int c = accept(*listener, nullptr, nullptr);
    if (c < 0) return;
    Hello h;
    h.nonce.fill(7);
    std::string hf = EncodeHello(h);
    (void)WriteFull(c, hf.data(), hf.size());
    std::string auth(kAuthSize, '\0');
    (void)ReadFull(c, auth.data(), auth.size());
    AuthReply ok;
    std::string rf = EncodeAuthReply(ok);
    (void)WriteFull(c, rf.data(), rf.size());
    std::string junk(kResponseSize * 3, '\x5a');
    (void)WriteFull(c, junk.data(), junk.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    close(c);
  });
  auto client = NewTcpTransport(options_);
  std::vector<std::string> bufs(3, std::string(100, '\0'));
  std::vector<FetchPiece> pieces(3);
  for (uint64_t i = 0; i < 3; i++) {
    pieces[i] = {.addr = {1, 1, i, 0}, .length = 100, .buf = bufs[i].data()};
  }
  client->FetchMany(absl::StrCat("127.0.0.1:", port), pieces);
  fake.join();
  close(*listener);
  for (const FetchPiece& p : pieces) {
    EXPECT_FALSE(p.status.ok());
    EXPECT_FALSE(p.info.received_checksum.has_value());
  }
}

// A source may hand over a block in memory (a block just filled): TCP sends it from there. What
// arrives is hashed as received, so bytes that do not match the block's checksum show in
// received_checksum for the caller to refuse.
TEST_F(TcpTransportTest, BlocksInMemoryAreSentFromMemory) {
  class MemorySource : public BlockSource {
   public:
    explicit MemorySource(std::string bytes) : bytes_(std::move(bytes)) {}
    std::optional<Block> Get(const BlockAddr&) override {
      Block b;
      b.data = bytes_.data();
      b.length = static_cast<uint32_t>(bytes_.size());
      b.checksum = 42;  // what the holder claims; not the bytes' checksum
      return b;
    }

   private:
    std::string bytes_;
  };
  std::string bytes = data_.substr(0, 1 << 20);
  MemorySource source(bytes);
  auto server = StartBlockServer("127.0.0.1:0", &source, options_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = NewTcpTransport(options_);
  std::string buf(1 << 20, '\0');
  FetchInfo info;
  ASSERT_TRUE(client
                  ->Fetch(absl::StrCat("127.0.0.1:", (*server)->port()), {1, 1, 9, 0}, 0, 1 << 20,
                          buf.data(), &info)
                  .ok());
  EXPECT_TRUE(buf == bytes);
  EXPECT_EQ(info.block_checksum, 42u);
  EXPECT_EQ(*info.received_checksum, BlockChecksum(bytes.data(), bytes.size()));
  EXPECT_NE(*info.received_checksum, info.block_checksum);
  (*server)->Stop();
}

TEST_F(TcpTransportTest, CleanErrors) {
  auto client = NewTcpTransport(options_);
  std::string buf(4 << 20, '\0');
  // Unknown block.
  EXPECT_EQ(client->Fetch(peer_, {9, 9, 9, 9}, 0, 10, buf.data(), nullptr).code(),
            absl::StatusCode::kNotFound);
  // Past the end of the block.
  EXPECT_EQ(client->Fetch(peer_, {1, 1, 5, 0}, 0, 2 << 20, buf.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // Wrong token.
  TransportOptions wrong = options_;
  wrong.token = "guess";
  EXPECT_EQ(NewTcpTransport(wrong)->Fetch(peer_, {1, 1, 5, 0}, 0, 10, buf.data(), nullptr).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(server_->GetStats().refused, 1u);
  // Nobody listening.
  EXPECT_EQ(client
                ->Fetch(absl::StrCat("127.0.0.1:", testing::FreePort()), {1, 1, 5, 0}, 0, 10,
                        buf.data(), nullptr)
                .code(),
            absl::StatusCode::kUnavailable);
  ExpectServerStillServes();
}

TEST_F(TcpTransportTest, GarbageFromAPeerIsRefusedAndServingGoesOn) {
  // Bad magic.
  int fd = RawConnection(options_.token);
  std::string junk(kRequestSize, 'Z');
  ASSERT_TRUE(WriteFull(fd, junk.data(), junk.size()).ok());
  std::string resp(kResponseSize, '\0');
  ASSERT_TRUE(ReadFull(fd, resp.data(), resp.size()).ok());
  EXPECT_EQ(DecodeResponse(resp)->status, WireStatus::kBadRequest);
  char c;
  EXPECT_LE(recv(fd, &c, 1, 0), 0);  // then closed (EOF, or reset: it did not read the rest)
  close(fd);
  // Oversized length in an otherwise valid frame.
  fd = RawConnection(options_.token);
  Request q;
  q.addr = {1, 1, 5, 0};
  q.id = MakeBlockId(q.addr);
  q.length = kMaxLength + 1;
  std::string f = EncodeRequest(q);
  ASSERT_TRUE(WriteFull(fd, f.data(), f.size()).ok());
  ASSERT_TRUE(ReadFull(fd, resp.data(), resp.size()).ok());
  EXPECT_EQ(DecodeResponse(resp)->status, WireStatus::kBadRequest);
  close(fd);
  // A truncated frame, then the peer goes away.
  fd = RawConnection(options_.token);
  q.length = 100;
  f = EncodeRequest(q);
  ASSERT_TRUE(WriteFull(fd, f.data(), 20).ok());
  close(fd);
  // No token at all: a client that sends a request instead of Auth.
  auto raw = ConnectTcp(peer_, std::chrono::seconds(1), std::chrono::seconds(2));
  ASSERT_TRUE(raw.ok());
  std::string hello(kHelloSize, '\0');
  ASSERT_TRUE(ReadFull(*raw, hello.data(), hello.size()).ok());
  ASSERT_TRUE(WriteFull(*raw, f.data(), kAuthSize).ok());
  std::string reply(kAuthReplySize, '\0');
  EXPECT_FALSE(ReadFull(*raw, reply.data(), reply.size()).ok() &&
               DecodeAuthReply(reply)->status == WireStatus::kOk);
  close(*raw);
  EXPECT_TRUE(testing::WaitFor([&] { return server_->GetStats().bad_frames >= 3; }));
  ExpectServerStillServes();
}

TEST_F(TcpTransportTest, StalledPeerTimesOutInsteadOfHanging) {
  // A listener that accepts (the kernel does) but never says hello.
  int port = 0;
  auto lfd = ListenTcp("127.0.0.1:0", &port);
  ASSERT_TRUE(lfd.ok());
  auto client = NewTcpTransport(options_);
  std::string buf(100, '\0');
  auto start = std::chrono::steady_clock::now();
  absl::Status s =
      client->Fetch(absl::StrCat("127.0.0.1:", port), {1, 1, 5, 0}, 0, 100, buf.data(), nullptr);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(took, std::chrono::seconds(5));
  close(*lfd);
}

TEST_F(TcpTransportTest, ConcurrentClientsAndStop) {
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  auto client = NewTcpTransport(options_);
  for (int t = 0; t < 8; t++) {
    threads.emplace_back([&] {
      std::string buf(2 << 20, '\0');
      for (int i = 0; i < 10; i++) {
        if (!client->Fetch(peer_, {1, 1, 5, 1}, 0, 2 << 20, buf.data(), nullptr).ok() ||
            buf != data_.substr(1 << 20, 2 << 20)) {
          bad++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad, 0);
  server_->Stop();
  std::string buf(10, '\0');
  EXPECT_EQ(client->Fetch(peer_, {1, 1, 5, 0}, 0, 10, buf.data(), nullptr).code(),
            absl::StatusCode::kUnavailable);
}

// Stands in for RDMA in one process: "remote memory" is this process's, so a writer can pread the
// block straight to remote_addr. Exercises the server's side of the seam (qp_responder.h).
class LoopbackWriter : public BlockWriter {
 public:
  absl::Status Write(const BlockSource::Block& block, uint64_t offset, uint32_t length,
                     uint64_t remote_addr, uint32_t rkey,
                     std::chrono::milliseconds timeout) override {
    if (rkey != 77) return absl::UnavailableError("wrong rkey");
    ssize_t n = pread(block.fd, reinterpret_cast<char*>(remote_addr), length,
                      static_cast<off_t>(block.offset + offset));
    return n == static_cast<ssize_t>(length) ? absl::OkStatus() : absl::DataLossError("short");
  }
};

class LoopbackResponder : public QpResponder {
 public:
  absl::StatusOr<std::unique_ptr<BlockWriter>> Accept(const QpInfo& remote,
                                                      const std::string& local_ip,
                                                      QpInfo* local) override {
    accepted_qp = remote.qp_num;
    local->qp_num = remote.qp_num + 1;
    local->mtu = remote.mtu;
    local->rkey = 5;
    return std::make_unique<LoopbackWriter>();
  }
  std::atomic<uint32_t> accepted_qp{0};
};

TEST_F(TcpTransportTest, QueuePairsGoThroughTheResponderGivenAtStart) {
  auto owned = std::make_unique<LoopbackResponder>();
  LoopbackResponder* responder = owned.get();
  auto server = StartTcpBlockServer("127.0.0.1:0", source_.get(), options_, std::move(owned));
  ASSERT_TRUE(server.ok()) << server.status();
  std::string peer = absl::StrCat("127.0.0.1:", (*server)->port());
  std::string buf(2 << 20, '\0');
  std::string resp(kResponseSize, '\0');

  // A one-sided request before any handshake: unsupported on this connection.
  int fd = RawConnectionTo(peer, options_.token);
  Request q = MakeRequest(1, {1, 1, 5, 1}, 0, 2 << 20);
  q.remote_addr = reinterpret_cast<uint64_t>(buf.data());
  q.rkey = 77;
  std::string f = EncodeRequest(q);
  ASSERT_TRUE(WriteFull(fd, f.data(), f.size()).ok());
  ASSERT_TRUE(ReadFull(fd, resp.data(), resp.size()).ok());
  EXPECT_EQ(DecodeResponse(resp)->status, WireStatus::kUnsupported);
  close(fd);

  // The handshake: the responder's answer goes back, then the writer serves requests.
  fd = RawConnectionTo(peer, options_.token);
  QpInfo mine;
  mine.qp_num = 41;
  mine.mtu = 3;
  f = EncodeQpInfo(mine);
  ASSERT_TRUE(WriteFull(fd, f.data(), f.size()).ok());
  std::string theirs(kQpInfoSize, '\0');
  ASSERT_TRUE(ReadFull(fd, theirs.data(), theirs.size()).ok());
  ASSERT_TRUE(DecodeQpInfo(theirs));
  EXPECT_EQ(DecodeQpInfo(theirs)->qp_num, 42u);
  EXPECT_EQ(responder->accepted_qp, 41u);
  f = EncodeRequest(q);
  ASSERT_TRUE(WriteFull(fd, f.data(), f.size()).ok());
  ASSERT_TRUE(ReadFull(fd, resp.data(), resp.size()).ok());
  auto r = DecodeResponse(resp);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, WireStatus::kOk);
  EXPECT_EQ(r->length, 2u << 20);
  EXPECT_EQ(r->block_checksum, BlockChecksum(data_.data() + (1 << 20), 2 << 20));
  EXPECT_TRUE(buf == data_.substr(1 << 20, 2 << 20));
  // A failed write is an internal error with no payload, and the connection ends (the queue pair
  // went down with the write; the client builds a new one).
  q.request_id = 2;
  q.rkey = 78;
  f = EncodeRequest(q);
  ASSERT_TRUE(WriteFull(fd, f.data(), f.size()).ok());
  ASSERT_TRUE(ReadFull(fd, resp.data(), resp.size()).ok());
  EXPECT_EQ(DecodeResponse(resp)->status, WireStatus::kInternal);
  EXPECT_EQ(DecodeResponse(resp)->length, 0u);
  char c;
  EXPECT_LE(recv(fd, &c, 1, 0), 0);
  close(fd);
  EXPECT_EQ((*server)->GetStats().bytes, 2u << 20);
}

TEST_F(TcpTransportTest, WithoutAResponderQueuePairsAreRefused) {
  auto server = StartTcpBlockServer("127.0.0.1:0", source_.get(), options_, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  int fd = RawConnectionTo(absl::StrCat("127.0.0.1:", (*server)->port()), options_.token);
  QpInfo mine;
  mine.qp_num = 41;
  mine.mtu = 3;
  std::string f = EncodeQpInfo(mine);
  ASSERT_TRUE(WriteFull(fd, f.data(), f.size()).ok());
  std::string resp(kResponseSize, '\0');
  ASSERT_TRUE(ReadFull(fd, resp.data(), resp.size()).ok());
  EXPECT_EQ(DecodeResponse(resp)->status, WireStatus::kUnsupported);
  char c;
  EXPECT_LE(recv(fd, &c, 1, 0), 0);  // then closed
  close(fd);
}

TEST_F(TcpTransportTest, CallsReachTheSourceAndCarryItsAnswer) {
  auto client = NewTcpTransport(options_);
  std::string big(200'000, 'x');
  big[7] = 'y';
  // An answer slower than the server's I/O timeout: the call's own limit is what counts.
  source_->call_delay = std::chrono::milliseconds(1200);
  auto answer = client->Call(peer_, big, std::chrono::seconds(10));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(*answer, std::string(big.rbegin(), big.rend()));
  // A slower answer than the caller waits for: Unavailable, not a hang.
  source_->call_delay = std::chrono::milliseconds(1500);
  auto late = client->Call(peer_, "abc", std::chrono::milliseconds(300));
  EXPECT_TRUE(absl::IsUnavailable(late.status())) << late.status();
  source_->call_delay = std::chrono::milliseconds(0);
  // The source's failures and a source that takes no calls.
  auto failed = client->Call(peer_, "fail", std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  auto untaken = client->Call(peer_, "", std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(untaken.status())) << untaken.status();
  EXPECT_NE(untaken.status().message().find("unsupported"), std::string::npos) << untaken.status();
  // Over the limit: refused before it is sent.
  auto huge = client->Call(peer_, std::string(kMaxCallLength + 1, 'z'), std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsInvalidArgument(huge.status())) << huge.status();
  // A wrong token.
  TransportOptions other = options_;
  other.token = "wrong";
  auto refused = NewTcpTransport(other)->Call(peer_, "abc", std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsPermissionDenied(refused.status())) << refused.status();
  ExpectServerStillServes();
}

TEST_F(TcpTransportTest, ACallFrameClaimingTooMuchIsRefused) {
  int fd = RawConnection(options_.token);
  transport::Call c;
  c.request_id = 9;
  c.length = 4;
  std::string f = EncodeCall(c);
  f[kCallSize - 1] = static_cast<char>(0x7f);  // length ~2 GiB
  ASSERT_TRUE(WriteFull(fd, f.data(), f.size()).ok());
  std::string pf(kResponseSize, '\0');
  ASSERT_TRUE(ReadFull(fd, pf.data(), pf.size()).ok());
  auto resp = DecodeResponse(pf);
  ASSERT_TRUE(resp.has_value());
  EXPECT_EQ(resp->status, WireStatus::kBadRequest);
  close(fd);
  ExpectServerStillServes();
}

}  // namespace
}  // namespace ember::transport
