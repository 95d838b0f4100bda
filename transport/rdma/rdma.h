// transport/rdma/: moving blocks over RDMA. Internal to transport/: select.cc (and the tests and
// rdma_bench) include this header.
//
// How a block moves over RDMA: the client opens the usual authenticated TCP connection; a server
// that can answer queue pairs says so in its Hello (kHelloRdma). The client sends its QpInfo
// (queue pair number, LID or GID, PSN, link layer), gets the server's, and both move their QPs
// INIT -> RTR -> RTS. For each block the client sends a Request carrying a registered buffer's
// address and rkey over TCP; the server reads the block into a registered buffer of its own,
// RDMA-WRITEs it into the client's, waits for that WR's completion, and answers over TCP. The TCP
// channel keeps framing, errors and timeouts the same as the TCP transport.
//
// Per process (an RdmaHub): one device context and protection domain per device, opened once;
// two pools of page-aligned registered buffers of block sizes (the client's take remote writes,
// the server's grant nothing), bounded by --rdma-memory; ibv_fork_init before any registration.
// Per peer: a pool of sessions (a TCP connection and its QP), as the TCP transport pools
// connections, so fetches to different peers, or several to one, never wait for each other. A
// peer that does not offer RDMA, or whose setup fails (mismatched link layers, no usable port),
// is fetched from over TCP, said once in the log, and asked again after kRetryRdmaAfter. Any error
// (an error completion, a timed-out write, a lost control channel) ends the session: its QP is
// destroyed before its buffer is used again (a timed-out WRITE is moved to ERR and drained to its
// flush completion on the server, or its buffer is never reused), and the next fetch builds a new
// one; a fetch that fails on a session retries once on a fresh one.
//
// Owns: the sessions, handshake and recovery (rdma_transport.cc); the hub, its buffer pools and
// the setup steps both sides share (rdma_hub.h, internal); the verbs seam
// (verbs.h; libibverbs in verbs_ibv.cc, the only file that includes it; verbs_off.cc when
// cmake -DEMBER_RDMA=OFF); port and GID choice (verbs_choice.cc). Must not touch: the TCP
// server's connections and framing (it is handed a handshake, never a socket to serve), files
// beyond the block a BlockSource hands over, anything outside transport/.
//
// This machine's kernel has no InfiniBand: the transport runs in tests against a fake device that
// keeps verbs semantics (fake_verbs.h); the real data path runs where a device exists
// (docs/architecture.md says how).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/block_transport.h"
#include "transport/qp_responder.h"
#include "transport/rdma/verbs.h"

namespace ember::transport {

inline constexpr auto kRetryRdmaAfter = std::chrono::minutes(5);

// One process's RDMA state on a verbs library: contexts, buffer pools, the probed devices.
class RdmaHub;

struct RdmaHubStats {
  uint64_t contexts_opened = 0;
  uint64_t registered_bytes = 0;  // now, both pools
  uint64_t registrations = 0;     // ibv_reg_mr calls so far
  uint64_t quarantined = 0;       // buffers never reused (a WRITE from them was not drained)
  uint64_t sessions_opened = 0;   // client sessions set up
  uint64_t tcp_fallbacks = 0;     // fetches that went over TCP (peer without RDMA, no buffer)
  std::string last_error;         // the last setup or registration error said in the log
};

// `why` gets the chosen port, or why there is none (then the hub is null). `verbs` null: none.
std::shared_ptr<RdmaHub> NewRdmaHub(std::shared_ptr<Verbs> verbs, const TransportOptions& options,
                                    std::string* why);
RdmaHubStats GetRdmaHubStats(RdmaHub& hub);

std::unique_ptr<BlockTransport> NewRdmaTransport(std::shared_ptr<RdmaHub> hub,
                                                 const TransportOptions& options);
std::unique_ptr<QpResponder> NewRdmaResponder(std::shared_ptr<RdmaHub> hub);

// On the system's verbs (libibverbs): a client transport or a responder when a usable port
// exists, else nullptr; `why` says which port, or why none. Both share one hub per process.
std::unique_ptr<BlockTransport> NewRdmaTransportIfActive(const TransportOptions& options,
                                                         std::string* why);
std::unique_ptr<QpResponder> NewRdmaResponderIfActive(const TransportOptions& options,
                                                      std::string* why);

}  // namespace ember::transport
