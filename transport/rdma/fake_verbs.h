// A fake verbs device for tests and rdma_bench (never linked into the agent): hosts on one fake
// fabric, each a Verbs with one device and port, so the real RDMA transport (sessions, pools,
// handshake over real TCP, fallback, recovery) runs in one process without a NIC.
//
// It keeps the verbs semantics the transport depends on:
// - the QP state machine: RESET -> INIT -> RTR -> RTS, any -> ERR; a WRITE posted before RTS
//   fails at post time, one posted in ERR completes as flushed; a WRITE reaches a peer QP only
//   in RTR or RTS, connected back;
// - completions in posting order, with the wr_id posted; an error completion moves the QP to ERR
//   and every later WR completes as flushed; ToError flushes what is outstanding;
// - addressing: RoCE routes by the GRH (the sender's sgid_index must name a GID of its table,
//   the destination GID a host's); on a routed fabric RoCE v1 GIDs and hop limits below the hop
//   count do not arrive (the WR fails with "retry exceeded", as a NIC's would); IB routes by LID;
// - memory: registration counts against a locked-memory limit; a WRITE needs a live rkey of the
//   target host, within bounds, with REMOTE_WRITE, on a QP that grants REMOTE_WRITE;
// - DMA: a WRITE reads its source when it executes (at its due time, posting time plus the
//   host's latency), so a source buffer changed while the WRITE is outstanding is caught
//   (FakeFabric::stats().source_changed_in_flight) and the changed bytes are what arrive.
// Faults: delay or lose the next completion, fail the next WRITE, move every QP to ERR ("flap":
// harsher than a real link flap, after which QPs in RTS retry and may survive).
// Not modelled: PSNs, path MTU, the retry time before "retry exceeded" (real NICs take 0.5 s or
// more; the fake answers at once), the completion channel's events (a condition variable here).
//
// Thread-safe: one mutex per fabric.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/rdma/verbs.h"

namespace ember::transport {

class FakeFabric;

struct FakeHostConfig {
  std::string device = "fake0";
  LinkLayer link = LinkLayer::kEthernet;
  bool active = true;
  bool iwarp = false;
  uint16_t lid = 0;            // InfiniBand
  std::vector<GidEntry> gids;  // RoCE: the GID table
  uint32_t mtu = 5;            // 4096
  size_t memlock_limit = 1ull << 40;
  std::chrono::microseconds latency{20};  // from post to completion
};

// An mlx5-like RoCE GID table for an IPv4 address: 0 RoCE v1 link-local, 1 RoCE v2 link-local,
// 2 RoCE v1 ::ffff:ip, 3 RoCE v2 ::ffff:ip.
std::vector<GidEntry> MlxStyleGidTable(const std::string& ipv4);

struct FakeFabricStats {
  uint64_t writes = 0;                    // WRITEs that arrived
  uint64_t failed_writes = 0;             // error completions other than flushes
  uint64_t flushed = 0;                   // flush completions
  uint64_t source_changed_in_flight = 0;  // a source buffer written while its WRITE was pending
  uint64_t qps_created = 0;
  uint64_t contexts_opened = 0;
  uint64_t registrations = 0;
  uint64_t fork_inits = 0;
  uint64_t registered_before_fork_init = 0;
  uint64_t remote_write_grants = 0;  // QPs or MRs that granted REMOTE_WRITE
  // The last RoCE path a QP was given.
  uint8_t last_sgid_index = 0;
  uint8_t last_hop_limit = 0;
  uint8_t last_traffic_class = 0;
};

class FakeHost;

class FakeFabric : public std::enable_shared_from_this<FakeFabric> {
 public:
  // `routed`: RoCE crosses routers (`hops` of them): v1 GIDs and short hop limits fail.
  static std::shared_ptr<FakeFabric> Create(bool routed = true, uint8_t hops = 2);
  ~FakeFabric();
  // A host on this fabric, as its Verbs.
  std::shared_ptr<Verbs> AddHost(const FakeHostConfig& config);
  FakeFabricStats stats();
  // Every QP of every host to ERR (a link flap).
  void Flap();
  // Faults on the next WRITE posted by a QP of host `device` (applies once each).
  void DelayNextWrite(const std::string& device, std::chrono::milliseconds delay);
  void LoseNextCompletion(const std::string& device);
  void FailNextWrite(const std::string& device);
  // Whether WRITEs hash their source at post and at execution (on by default; off for speed).
  void SetCheckSources(bool check);
  // Registered bytes of a host now.
  size_t Registered(const std::string& device);

  struct State;  // fake_verbs.cc
  State& state() { return *state_; }

 private:
  FakeFabric(bool routed, uint8_t hops);
  std::unique_ptr<State> state_;
};

}  // namespace ember::transport
