// The RDMA unit: port and GID choice, and the real transport (sessions, pools, the handshake over
// real TCP on 127.0.0.x, fallback, recovery) against the fake device (fake_verbs.h), one test per
// defect a verbs review found (docs/architecture.md, "RDMA"). The real data path runs in
// RdmaDeviceTest where a verbs device exists.
#include "transport/rdma/rdma.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "tests/testing/testing.h"
#include "transport/block_transport.h"
#include "transport/rdma/fake_verbs.h"
#include "transport/rdma/verbs.h"
#include "transport/socket_util.h"
#include "transport/tcp_transport.h"

namespace ember::transport {
namespace {

constexpr uint32_t kBlock = 4 << 20;

// ---- choices ----

TEST(RdmaChoiceTest, RoceTakesTheV2GidOfTheConnectionsAddress) {
  DeviceInfo d{"mlx5_0", false, {}};
  PortInfo p;
  p.active = true;
  p.link = LinkLayer::kEthernet;
  p.mtu = 5;
  p.gids = MlxStyleGidTable("10.0.0.7");
  d.ports.push_back(p);
  std::string why;
  auto c = ChoosePort({d}, "10.0.0.7", &why);
  ASSERT_TRUE(c) << why;
  EXPECT_EQ(c->gid_index, 3);  // not 0, the RoCE v1 link-local GID
  EXPECT_EQ(c->gid, *Ipv4MappedGid("10.0.0.7"));
  EXPECT_NE(why.find("GID index 3 for 10.0.0.7"), std::string::npos) << why;
  // Another address: still a RoCE v2 IPv4 GID, and the log says it is not this address's.
  c = ChoosePort({d}, "192.168.1.1", &why);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->gid_index, 3);
  EXPECT_NE(why.find("none for 192.168.1.1"), std::string::npos) << why;
  // Only v1 GIDs: not usable.
  d.ports[0].gids = {{0, *Ipv4MappedGid("10.0.0.7"), GidType::kRoceV1}};
  EXPECT_FALSE(ChoosePort({d}, "10.0.0.7", &why));
  EXPECT_NE(why.find("no RoCE v2 IPv4 GID"), std::string::npos) << why;
}

TEST(RdmaChoiceTest, IwarpInactivePortsAndLidZeroAreNeverChosen) {
  PortInfo ib;
  ib.active = true;
  ib.link = LinkLayer::kInfiniBand;
  ib.lid = 0;
  DeviceInfo no_sm{"mlx5_0", false, {ib}};
  PortInfo roce;
  roce.active = true;
  roce.link = LinkLayer::kEthernet;
  roce.gids = MlxStyleGidTable("10.0.0.7");
  DeviceInfo iwarp{"iw_cxgb4", true, {roce}};
  PortInfo down = roce;
  down.active = false;
  DeviceInfo cable_out{"mlx5_1", false, {down}};
  std::string why;
  EXPECT_FALSE(ChoosePort({no_sm, iwarp, cable_out}, "10.0.0.7", &why));
  EXPECT_NE(why.find("LID 0"), std::string::npos) << why;
  EXPECT_NE(why.find("iWARP"), std::string::npos) << why;
  EXPECT_NE(why.find("not active"), std::string::npos) << why;
  // The RoCE port carrying the connection's address beats an InfiniBand port.
  ib.lid = 9;
  DeviceInfo ib_ok{"mlx5_2", false, {ib}};
  DeviceInfo roce_ok{"mlx5_3", false, {roce}};
  auto c = ChoosePort({ib_ok, roce_ok}, "10.0.0.7", &why);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->device, "mlx5_3");
  c = ChoosePort({ib_ok, roce_ok}, "172.16.0.1", &why);  // not RoCE's network: InfiniBand
  ASSERT_TRUE(c);
  EXPECT_EQ(c->device, "mlx5_2");
  EXPECT_NE(why.find("LID 9"), std::string::npos);
}

// ---- the transport on the fake device ----

// Blocks of one file; Get can be held up (a stalled peer).
class FileSource : public BlockSource {
 public:
  FileSource(const std::string& path, const std::string& data)
      : fd_(open(path.c_str(), O_RDONLY)), data_(data) {}
  ~FileSource() override { close(fd_); }
  std::optional<Block> Get(const BlockAddr& a) override {
    if (hold_ != nullptr) hold_->WaitForNotification();
    if (a.index * kBlock >= data_.size()) return std::nullopt;
    Block b;
    b.fd = fd_;
    b.offset = a.index * kBlock;
    b.length = kBlock;
    b.checksum = BlockChecksum(data_.data() + b.offset, kBlock);
    return b;
  }
  void HoldUntil(absl::Notification* n) { hold_ = n; }

 private:
  int fd_;
  const std::string& data_;
  absl::Notification* hold_ = nullptr;
};

FakeHostConfig Roce(const std::string& device, const std::string& ip) {
  FakeHostConfig c;
  c.device = device;
  c.link = LinkLayer::kEthernet;
  c.gids = MlxStyleGidTable(ip);
  return c;
}

FakeHostConfig Ib(const std::string& device, uint16_t lid) {
  FakeHostConfig c;
  c.device = device;
  c.link = LinkLayer::kInfiniBand;
  c.lid = lid;
  Gid g{};
  g[0] = 0xfe;
  g[1] = 0x80;
  g[15] = static_cast<uint8_t>(lid);
  c.gids = {{0, g, GidType::kIb}};
  return c;
}

class RdmaTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_.resize(4 * kBlock);
    for (size_t i = 0; i < data_.size(); i++) data_[i] = static_cast<char>(i * 131 + i / 8191);
    testing::WriteFile(dir_.Sub("cache"), data_);
    options_.token = "cluster-secret";
    options_.io_timeout = std::chrono::milliseconds(1000);
    options_.rdma_traffic_class = 96;
  }

  struct Server {
    std::shared_ptr<RdmaHub> hub;
    std::unique_ptr<FileSource> source;
    std::unique_ptr<BlockServer> server;
    std::string peer;
  };
  // A block server on 127.0.0.2 (`port` 0: any), answering queue pairs on `host` (null: none).
  Server StartServer(std::shared_ptr<Verbs> host, int port = 0) {
    Server s;
    std::unique_ptr<QpResponder> responder;
    if (host) {
      std::string why;
      s.hub = NewRdmaHub(host, options_, &why);
      EXPECT_TRUE(s.hub) << why;
      responder = NewRdmaResponder(s.hub);
    }
    s.source = std::make_unique<FileSource>(dir_.Sub("cache"), data_);
    auto server = StartTcpBlockServer(absl::StrCat("127.0.0.2:", port), s.source.get(), options_,
                                      std::move(responder));
    EXPECT_TRUE(server.ok()) << server.status();
    s.server = std::move(*server);
    s.peer = absl::StrCat("127.0.0.2:", s.server->port());
    return s;
  }
  std::unique_ptr<BlockTransport> Client(std::shared_ptr<Verbs> host) {
    std::string why;
    client_hub_ = NewRdmaHub(host, options_, &why);
    EXPECT_TRUE(client_hub_) << why;
    return NewRdmaTransport(client_hub_, options_);
  }
  // A RoCE server (srv0 on 127.0.0.2) and a client (cli0 on 127.0.0.1) on `fabric`.
  std::pair<Server, std::unique_ptr<BlockTransport>> RocePair(FakeFabric& fabric) {
    Server server = StartServer(fabric.AddHost(Roce("srv0", "127.0.0.2")));
    return {std::move(server), Client(fabric.AddHost(Roce("cli0", "127.0.0.1")))};
  }
  // Fetches [offset, offset+length) of block `index` and checks every byte.
  absl::Status FetchAndCheck(BlockTransport& t, const std::string& peer, uint64_t index,
                             uint32_t offset = 0, uint32_t length = kBlock) {
    std::string buf(length, '\0');
    FetchInfo info;
    absl::Status s = t.Fetch(peer, {1, 1, 5, index}, offset, length, buf.data(), &info);
    if (!s.ok()) return s;
    if (buf != data_.substr(index * kBlock + offset, length)) {
      return absl::DataLossError("wrong bytes");
    }
    if (!info.received_checksum || *info.received_checksum != BlockChecksum(buf.data(), length)) {
      return absl::DataLossError("received checksum missing or wrong");
    }
    return absl::OkStatus();
  }

  testing::TempDir dir_;
  std::string data_;
  TransportOptions options_;
  std::shared_ptr<RdmaHub> client_hub_;
};

// Defect 1: sgid_index 0 (RoCE v1 link-local on mlx5) and hop limit 1 never arrive across a
// routed RoCE fabric; the v2 GID of the connection's address and hop limit 64 do.
TEST_F(RdmaTransportTest, RoceUsesTheV2GidOfTheControlAddressAcrossRouters) {
  auto fabric = FakeFabric::Create(/*routed=*/true, /*hops=*/3);
  auto [server, client] = RocePair(*fabric);
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 0).ok());
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 1, 4096, 1 << 20).ok());
  FakeFabricStats st = fabric->stats();
  EXPECT_EQ(st.writes, 2u);  // over RDMA, not TCP
  EXPECT_EQ(st.last_sgid_index, 3);
  EXPECT_GE(st.last_hop_limit, 64);
  EXPECT_EQ(st.last_traffic_class, 96);  // --rdma-tclass
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).tcp_fallbacks, 0u);
}

TEST_F(RdmaTransportTest, InfiniBandRoutesByLid) {
  auto fabric = FakeFabric::Create();
  auto server = StartServer(fabric->AddHost(Ib("srv0", 7)));
  auto client = Client(fabric->AddHost(Ib("cli0", 8)));
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 2).ok());
  EXPECT_EQ(fabric->stats().writes, 1u);
  // A port with LID 0 (no subnet manager) is no RDMA port at all.
  std::string why;
  EXPECT_FALSE(NewRdmaHub(fabric->AddHost(Ib("nosm0", 0)), options_, &why));
  EXPECT_NE(why.find("LID 0"), std::string::npos) << why;
}

// Defect 2: a peer without RDMA says so in its Hello; the client uses TCP for it without
// setting anything up, and says so once.
TEST_F(RdmaTransportTest, APeerWithoutRdmaIsFetchedOverTcpWithoutSetup) {
  auto fabric = FakeFabric::Create();
  auto plain = StartServer(nullptr);
  auto rdma = StartServer(fabric->AddHost(Roce("srv0", "127.0.0.2")));
  // The Hello says which server answers queue pairs.
  for (auto* s : {&plain, &rdma}) {
    auto fd = ConnectTcp(s->peer, std::chrono::seconds(1), std::chrono::seconds(1));
    ASSERT_TRUE(fd.ok());
    uint32_t flags = 99;
    ASSERT_TRUE(ClientHandshake(*fd, s->peer, options_.token, &flags).ok());
    EXPECT_EQ(flags & kHelloRdma, s == &rdma ? kHelloRdma : 0u);
    close(*fd);
  }
  auto client = Client(fabric->AddHost(Roce("cli0", "127.0.0.1")));
  for (int i = 0; i < 5; i++) ASSERT_TRUE(FetchAndCheck(*client, plain.peer, i % 4).ok());
  RdmaHubStats hs = GetRdmaHubStats(*client_hub_);
  EXPECT_EQ(hs.tcp_fallbacks, 5u);
  EXPECT_EQ(hs.sessions_opened, 0u);
  EXPECT_EQ(fabric->stats().qps_created, 0u);  // no QP, no 64 MiB pin, per fetch or at all
  EXPECT_EQ(fabric->Registered("cli0"), 0u);
  // The RDMA peer is still fetched from over RDMA.
  ASSERT_TRUE(FetchAndCheck(*client, rdma.peer, 0).ok());
  EXPECT_EQ(fabric->stats().writes, 1u);
}

// Defect 12: a refused token stays PermissionDenied (no TCP fallback that would hide it).
TEST_F(RdmaTransportTest, AWrongTokenIsPermissionDeniedNotAFallback) {
  auto fabric = FakeFabric::Create();
  auto [server, client] = RocePair(*fabric);
  TransportOptions wrong = options_;
  wrong.token = "not-the-token";
  auto intruder = NewRdmaTransport(client_hub_, wrong);
  std::string buf(kBlock, '\0');
  absl::Status s = intruder->Fetch(server.peer, {1, 1, 5, 0}, 0, kBlock, buf.data(), nullptr);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).tcp_fallbacks, 0u);
  EXPECT_EQ(fabric->stats().qps_created, 0u);
}

// A path RDMA cannot take (here: more routers than any hop limit) connects its queue pairs but
// no WRITE arrives: the peer is then fetched from over TCP, not failed twice per block.
TEST_F(RdmaTransportTest, AnUnreachableRdmaPathFallsBackToTcp) {
  auto fabric = FakeFabric::Create(/*routed=*/true, /*hops=*/255);
  auto [server, client] = RocePair(*fabric);
  for (int i = 0; i < 3; i++) ASSERT_TRUE(FetchAndCheck(*client, server.peer, i).ok());
  EXPECT_EQ(fabric->stats().writes, 0u);
  EXPECT_EQ(fabric->stats().failed_writes, 1u);  // one attempt, then TCP for this peer
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).tcp_fallbacks, 3u);
}

// Defects 2 and 10: mismatched link layers are refused by the server, and the client falls back
// to TCP for that peer after one attempt.
TEST_F(RdmaTransportTest, MismatchedLinkLayersAreRefusedAndFallBackToTcpOnce) {
  auto fabric = FakeFabric::Create();
  auto server = StartServer(fabric->AddHost(Ib("srv0", 7)));
  auto client = Client(fabric->AddHost(Roce("cli0", "127.0.0.1")));
  for (int i = 0; i < 3; i++) ASSERT_TRUE(FetchAndCheck(*client, server.peer, i).ok());
  EXPECT_EQ(fabric->stats().qps_created, 1u);  // the one attempt
  EXPECT_EQ(fabric->stats().writes, 0u);
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).tcp_fallbacks, 3u);
}

// Defect 4: an error completion takes the QP to ERR; the session is rebuilt, not reused.
TEST_F(RdmaTransportTest, AnErrorCompletionEndsTheSessionAndTheFetchGoesOnANewOne) {
  auto fabric = FakeFabric::Create();
  auto [server, client] = RocePair(*fabric);
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 0).ok());
  fabric->FailNextWrite("srv0");
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 1).ok());  // retried on a fresh session
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 2).ok());
  EXPECT_EQ(fabric->stats().failed_writes, 1u);
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).sessions_opened, 2u);
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).tcp_fallbacks, 0u);
}

// Defect 4: a link flap puts every QP in ERR; fetches go on at once on new sessions.
TEST_F(RdmaTransportTest, ALinkFlapIsRecoveredFromAtOnce) {
  auto fabric = FakeFabric::Create();
  auto [server, client] = RocePair(*fabric);
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 0).ok());
  fabric->Flap();
  for (int i = 0; i < 4; i++) ASSERT_TRUE(FetchAndCheck(*client, server.peer, i).ok());
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).sessions_opened, 2u);
}

// Defect 5: after a timed-out WRITE the QP goes to ERR and is drained to the flush before the
// buffer is used again; no stale completion is taken for a later WRITE, and no late WRITE lands.
TEST_F(RdmaTransportTest, ATimedOutWriteIsDrainedBeforeItsBufferIsUsedAgain) {
  options_.io_timeout = std::chrono::milliseconds(300);
  auto fabric = FakeFabric::Create();
  auto [server, client] = RocePair(*fabric);
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 2).ok());  // a session that has worked
  fabric->DelayNextWrite("srv0", std::chrono::milliseconds(900));
  absl::Status first = FetchAndCheck(*client, server.peer, 0, 0, 1 << 20);
  EXPECT_TRUE(first.ok() || absl::IsUnavailable(first)) << first;  // never wrong bytes
  for (int i = 0; i < 4; i++) {
    ASSERT_TRUE(FetchAndCheck(*client, server.peer, i).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // past the delayed WRITE's time
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 3).ok());
  FakeFabricStats st = fabric->stats();
  EXPECT_EQ(st.source_changed_in_flight, 0u);
  EXPECT_GE(st.flushed, 1u);
  EXPECT_EQ(GetRdmaHubStats(*server.hub).quarantined, 0u);
}

// A completion that never comes: the fetch ends within its timeouts, the rest go on.
TEST_F(RdmaTransportTest, ALostCompletionNeverHangsAFetch) {
  options_.io_timeout = std::chrono::milliseconds(300);
  auto fabric = FakeFabric::Create();
  auto [server, client] = RocePair(*fabric);
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 0).ok());  // a session that has worked
  fabric->LoseNextCompletion("srv0");
  auto t0 = std::chrono::steady_clock::now();
  absl::Status first = FetchAndCheck(*client, server.peer, 1);
  EXPECT_TRUE(first.ok() || absl::IsUnavailable(first)) << first;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 2).ok());
  EXPECT_EQ(fabric->stats().source_changed_in_flight, 0u);
}

// Defect 6: fetches to one peer never wait for another's; several to one peer run at once.
TEST_F(RdmaTransportTest, FetchesToOnePeerDoNotWaitForAnother) {
  auto fabric = FakeFabric::Create();
  options_.io_timeout = std::chrono::seconds(5);
  auto stalled = StartServer(fabric->AddHost(Roce("srv0", "127.0.0.2")));
  auto live = StartServer(fabric->AddHost(Roce("srv1", "127.0.0.3")));  // its own GID
  auto client = Client(fabric->AddHost(Roce("cli0", "127.0.0.1")));
  absl::Notification release;
  stalled.source->HoldUntil(&release);
  std::thread slow([&] {
    absl::Status s = FetchAndCheck(*client, stalled.peer, 0);
    EXPECT_TRUE(s.ok() || absl::IsUnavailable(s)) << s;  // never wrong bytes
  });
  // The stalled fetch is in its round trip (its session set up) before the others start.
  while (GetRdmaHubStats(*client_hub_).sessions_opened == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::atomic<int> done{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; r++) {
    readers.emplace_back([&, r] {
      for (int i = 0; i < 4; i++) {
        if (FetchAndCheck(*client, live.peer, (r + i) % 4).ok()) done++;
      }
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(done, 16);  // all while the other peer was stalled
  EXPECT_FALSE(release.HasBeenNotified());
  release.Notify();
  slow.join();
}

// Defect 7: one context per process and device, registered memory within --rdma-memory, and the
// locked-memory limit named when it refuses (those fetches go over TCP, still right).
TEST_F(RdmaTransportTest, RegisteredMemoryIsBoundedAndTheMemlockLimitIsNamed) {
  options_.rdma_memory = 8 << 20;  // two 4 MiB buffers per pool
  auto fabric = FakeFabric::Create();
  auto [server, client] = RocePair(*fabric);
  std::atomic<int> ok{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 6; r++) {
    readers.emplace_back([&, r] {
      for (int i = 0; i < 5; i++) {
        if (FetchAndCheck(*client, server.peer, (r + i) % 4).ok()) ok++;
      }
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(ok, 30);
  EXPECT_LE(fabric->Registered("cli0"), 8u << 20);
  EXPECT_LE(fabric->Registered("srv0"), 8u << 20);
  EXPECT_EQ(fabric->stats().contexts_opened, 2u);  // one per host, whatever the sessions

  // A locked-memory limit below one buffer: refused, named, and the fetch still arrives.
  FakeHostConfig small = Roce("cli1", "127.0.0.1");
  small.memlock_limit = 1 << 20;
  auto fabric2 = FakeFabric::Create();
  auto server2 = StartServer(fabric2->AddHost(Roce("srv0", "127.0.0.2")));
  auto client2 = Client(fabric2->AddHost(small));
  ASSERT_TRUE(FetchAndCheck(*client2, server2.peer, 0).ok());
  RdmaHubStats hs = GetRdmaHubStats(*client_hub_);
  EXPECT_EQ(hs.tcp_fallbacks, 1u);
  EXPECT_NE(hs.last_error.find("RLIMIT_MEMLOCK"), std::string::npos) << hs.last_error;
}

// A server whose RDMA buffers are all in use answers busy and keeps the connection; the client
// takes that block over TCP.
TEST_F(RdmaTransportTest, ABusyServerSendsTheBlockOverTcpInstead) {
  options_.rdma_memory = 4 << 20;                 // one buffer per pool
  options_.io_timeout = std::chrono::seconds(3);  // the server waits 750 ms for a buffer
  auto fabric = FakeFabric::Create();
  auto server = StartServer(fabric->AddHost(Roce("srv0", "127.0.0.2")));
  auto first = Client(fabric->AddHost(Roce("cli0", "127.0.0.1")));
  auto first_hub = client_hub_;
  auto second = Client(fabric->AddHost(Roce("cli1", "127.0.0.9")));  // its own GID
  fabric->DelayNextWrite("srv0", std::chrono::milliseconds(1500));   // holds the server's buffer
  std::thread slow([&] { EXPECT_TRUE(FetchAndCheck(*first, server.peer, 0).ok()); });
  ASSERT_TRUE(testing::WaitFor([&] { return fabric->Registered("srv0") > 0; }));
  ASSERT_TRUE(FetchAndCheck(*second, server.peer, 1).ok());
  slow.join();
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).tcp_fallbacks, 1u);  // the busy one
  EXPECT_EQ(GetRdmaHubStats(*first_hub).tcp_fallbacks, 0u);
  // The connection stayed: the next fetch is RDMA on the same session.
  ASSERT_TRUE(FetchAndCheck(*second, server.peer, 2).ok());
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).sessions_opened, 1u);
  EXPECT_EQ(fabric->stats().writes, 2u);
}

// Defect 8: a pooled session whose server went away while it was idle is retried once on a
// fresh one.
TEST_F(RdmaTransportTest, AnIdleClosedSessionIsRetriedOnAFreshOne) {
  auto fabric = FakeFabric::Create();
  auto srv_host = fabric->AddHost(Roce("srv0", "127.0.0.2"));
  auto server = StartServer(srv_host);
  auto client = Client(fabric->AddHost(Roce("cli0", "127.0.0.1")));
  // Several idle sessions, all of which the restart below ends.
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; r++) {
    readers.emplace_back([&, r] { EXPECT_TRUE(FetchAndCheck(*client, server.peer, r).ok()); });
  }
  for (auto& t : readers) t.join();
  const uint64_t before = GetRdmaHubStats(*client_hub_).sessions_opened;
  ASSERT_GE(before, 1u);
  const int port = server.server->port();
  server.server->Stop();  // closes every connection, as an idle timeout or a restart does
  server.server.reset();
  auto again = StartServer(srv_host, port);
  // The retry builds a new session rather than taking another dead idle one.
  ASSERT_TRUE(FetchAndCheck(*client, again.peer, 1).ok());
  ASSERT_TRUE(FetchAndCheck(*client, again.peer, 2).ok());
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).sessions_opened, before + 1);
  EXPECT_EQ(GetRdmaHubStats(*client_hub_).tcp_fallbacks, 0u);
}

// Defects 9 and 11: ibv_fork_init before any registration; the server grants no remote access
// (only the client's QP and buffers take WRITEs).
TEST_F(RdmaTransportTest, ForkInitComesFirstAndTheServerGrantsNoRemoteWrite) {
  auto fabric = FakeFabric::Create();
  auto [server, client] = RocePair(*fabric);
  ASSERT_TRUE(FetchAndCheck(*client, server.peer, 0).ok());
  FakeFabricStats st = fabric->stats();
  EXPECT_EQ(st.fork_inits, 2u);
  EXPECT_EQ(st.registered_before_fork_init, 0u);
  EXPECT_EQ(st.registrations, 2u);        // one buffer each side
  EXPECT_EQ(st.remote_write_grants, 2u);  // the client's QP and buffer; nothing of the server's
}

// A block the holder has in memory (just filled) is written from there.
TEST_F(RdmaTransportTest, BlocksInMemoryAreWrittenFromMemory) {
  class MemorySource : public BlockSource {
   public:
    explicit MemorySource(const std::string& bytes) : bytes_(bytes) {}
    std::optional<Block> Get(const BlockAddr&) override {
      Block b;
      b.data = bytes_.data();
      b.length = static_cast<uint32_t>(bytes_.size());
      return b;
    }

   private:
    const std::string& bytes_;
  };
  auto fabric = FakeFabric::Create();
  std::string why;
  auto hub = NewRdmaHub(fabric->AddHost(Roce("srv0", "127.0.0.2")), options_, &why);
  std::string bytes = data_.substr(kBlock, kBlock);
  MemorySource source(bytes);
  auto server = StartTcpBlockServer("127.0.0.2:0", &source, options_, NewRdmaResponder(hub));
  ASSERT_TRUE(server.ok());
  auto client = Client(fabric->AddHost(Roce("cli0", "127.0.0.1")));
  std::string buf(kBlock, '\0');
  ASSERT_TRUE(client
                  ->Fetch(absl::StrCat("127.0.0.2:", (*server)->port()), {1, 1, 5, 1}, 0, kBlock,
                          buf.data(), nullptr)
                  .ok());
  EXPECT_TRUE(buf == bytes);
  EXPECT_EQ(fabric->stats().writes, 1u);
}

// ---- a real device ----

// Needs a verbs device with an active port (RoCE or InfiniBand; none here: the kernel has no
// InfiniBand). How to run it on hardware: docs/architecture.md, "RDMA".
TEST(RdmaDeviceTest, FetchesThroughTheTransportOnARealDevice) {
  std::string why;
  TransportOptions o;
  o.token = "t";
  auto responder = NewRdmaResponderIfActive(o, &why);
  if (!responder) GTEST_SKIP() << "no RDMA device: " << why;
  testing::TempDir dir;
  std::string data(2 * kBlock, '\0');
  for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<char>(i * 7 + i / 4093);
  testing::WriteFile(dir.Sub("cache"), data);
  FileSource source(dir.Sub("cache"), data);
  auto server = StartTcpBlockServer("127.0.0.1:0", &source, o, std::move(responder));
  ASSERT_TRUE(server.ok());
  auto client = NewRdmaTransportIfActive(o, &why);
  ASSERT_TRUE(client) << why;
  std::string buf(kBlock, '\0');
  FetchInfo info;
  ASSERT_TRUE(client
                  ->Fetch(absl::StrCat("127.0.0.1:", (*server)->port()), {1, 1, 5, 1}, 0, kBlock,
                          buf.data(), &info)
                  .ok());
  EXPECT_TRUE(buf == data.substr(kBlock, kBlock));
  EXPECT_EQ(*info.received_checksum, BlockChecksum(buf.data(), kBlock));
}

TEST(RdmaSelectionTest, AutoFallsBackToTcpWithAReason) {
  std::string why;
  TransportOptions o;
  bool have_device = NewRdmaTransportIfActive(o, &why) != nullptr;
  auto t = SelectTransport(TransportMode::kAuto, o, &why);
  ASSERT_TRUE(t.ok());
  EXPECT_STREQ((*t)->name(), have_device ? "rdma" : "tcp");
  EXPECT_FALSE(why.empty());
  auto tcp = SelectTransport(TransportMode::kTcp, o, &why);
  EXPECT_STREQ((*tcp)->name(), "tcp");
  auto rdma = SelectTransport(TransportMode::kRdma, o, &why);
  EXPECT_EQ(rdma.ok(), have_device);
  if (!have_device) {
    EXPECT_NE(rdma.status().message().find("--transport rdma"), std::string::npos);
  }
}

}  // namespace
}  // namespace ember::transport
