// transport/: moving blocks between nodes. This is the front door other folders include.
//
// Owns: moving a block's bytes from the node that holds it to the node that asks, with the
// cluster-token challenge, framing, timeouts, connection pooling and the choice of transport. It
// knows blocks (BlockAddr) and peers ("HOST:PORT"), never files: a BlockSource hands it an fd and
// an offset. Must not touch: the cache, files and paths, meta, which peer holds a block (the
// caller says), checksum verification (it reports the server's checksum; the caller checks).
// Depends only on common/.
//
// A node runs a BlockServer that sends resident blocks to peers, and fetches blocks from peers
// through a BlockTransport. Two implementations share one protocol (wire.h): TCP (the server
// sends straight from the cache file with sendfile, the client receives straight into the
// caller's buffer) and RDMA (libibverbs RC queue pairs set up over the TCP channel; the server
// RDMA-WRITEs the block into the client's registered buffer). SelectTransport picks one at start.
//
// Inside: wire.h (the protocol), socket_util.h (blocking sockets with timeouts), tcp_transport.cc
// (the server for both transports), tcp_client.cc (the TCP client), select.cc (SelectTransport,
// StartBlockServer), rdma/ (the RDMA unit, front door rdma/rdma.h: sessions, buffer pools and
// recovery over a verbs seam; libibverbs only with cmake -DEMBER_RDMA=ON, the default; it plugs
// into the server through qp_responder.h).
//
// Everything here is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/ids.h"

namespace ember::transport {

// What a server needs from the node's cache.
class BlockSource {
 public:
  struct Block {
    const char* data = nullptr;  // the block's bytes in memory, or null: read them from fd
    int fd = -1;                 // readable; the block's bytes are at [offset, offset+length)
    uint64_t offset = 0;
    uint32_t length = 0;
    uint64_t checksum = 0;             // XXH3-64 of the whole block
    std::shared_ptr<const void> hold;  // keeps fd and bytes valid until released
  };
  virtual ~BlockSource() = default;
  // nullopt when the block is not resident. The block may come as bytes in memory (data) or as a
  // file range; both transports send either.
  virtual std::optional<Block> Get(const BlockAddr& addr) = 0;
  // A call from a peer (BlockTransport::Call): the node's request and answer, opaque here (a
  // node asks another to copy a volume file from it, say). May take long: the connection waits.
  // Returns: the answer (at most kMaxCallLength bytes); Unimplemented when the node takes none.
  virtual absl::StatusOr<std::string> Call(std::string_view /*request*/) {
    return absl::UnimplementedError("this node takes no calls");
  }
};

struct TransportOptions {
  std::string token;  // the cluster token both ends must know
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds io_timeout{5000};  // no progress this long on a read or write: fail
  size_t max_idle_per_peer = 32;               // pooled connections kept per peer
  size_t max_connections = 256;                // server side
  bool serve_rdma = true;                      // server side: accept RDMA queue pairs if able
  uint8_t rdma_traffic_class = 0;              // RoCE: the GRH traffic class (DSCP << 2)
  size_t rdma_memory = 512u << 20;             // registered buffers per pool (client, server)
  // Server side: a socket already listening on the server's address (handed over by the agent
  // this one succeeds) to serve on instead of binding anew; the server owns it (a socket on
  // another address is closed).
  int listen_fd = -1;
};

struct FetchInfo {
  uint64_t block_checksum = 0;  // the server's checksum of the whole block
  uint32_t block_length = 0;
  // BlockChecksum of the bytes received, when the transport hashed them as they arrived (TCP
  // does); the caller checks it against what it trusts.
  std::optional<uint64_t> received_checksum;
};

// One block of a FetchMany: the first `length` bytes of block `addr` into buf.
struct FetchPiece {
  BlockAddr addr;
  uint32_t length = 0;
  char* buf = nullptr;
  FetchInfo info;       // out
  absl::Status status;  // out: as Fetch's
};

class BlockTransport {
 public:
  virtual ~BlockTransport() = default;
  virtual const char* name() const = 0;
  // Reads [offset, offset+length) of block `addr` from `peer` ("HOST:PORT") into buf.
  // Returns: Ok; NotFound (the peer does not hold it); PermissionDenied (token refused);
  // Unavailable (connect, I/O, timeout, peer busy); DataLoss (a malformed or short answer).
  // Never waits longer than the connect timeout plus the I/O timeout per step.
  virtual absl::Status Fetch(const std::string& peer, const BlockAddr& addr, uint64_t offset,
                             uint32_t length, char* buf, FetchInfo* info) = 0;
  // Many blocks from one peer (small files: one round trip for all instead of one each). Each
  // piece gets its own status; a piece the peer does not hold costs the others nothing. TCP
  // pipelines the requests on one connection; the default fetches them one by one.
  virtual void FetchMany(const std::string& peer, std::span<FetchPiece> pieces) {
    for (FetchPiece& p : pieces) p.status = Fetch(peer, p.addr, 0, p.length, p.buf, &p.info);
  }
  // Sends `request` (at most 1 MiB) to the peer's BlockSource::Call and waits up to `timeout`
  // for its answer. Always over TCP. Returns: the answer; Unavailable (connect, I/O, timeout,
  // the peer's handler failed or takes no calls); PermissionDenied (token); InvalidArgument (a
  // request over the limit, or a peer too old to know calls).
  virtual absl::StatusOr<std::string> Call(const std::string& peer, std::string_view request,
                                           std::chrono::milliseconds timeout) = 0;
};

class BlockServer {
 public:
  struct Stats {
    uint64_t requests = 0;
    uint64_t bytes = 0;
    uint64_t not_found = 0;
    uint64_t refused = 0;     // failed the token challenge
    uint64_t bad_frames = 0;  // malformed input; the connection was closed
  };
  virtual ~BlockServer() = default;
  virtual int port() const = 0;
  // The listening socket (owned by the server; -1 once released or stopped).
  virtual int listener() const = 0;
  virtual Stats GetStats() = 0;
  // Stops accepting and closes every connection. Idempotent.
  virtual void Stop() = 0;
  // Stops accepting and gives up the listening socket, still listening: connections that arrive
  // from now on wait in its backlog for the server it is handed to. Then Stop() as usual.
  // Returns: the socket, or -1 if stopped.
  virtual int ReleaseListener() = 0;
};

// Serves blocks from `source` on `listen` ("HOST:PORT", port 0 picks one), answering RDMA queue
// pairs too when options.serve_rdma and this node has an active verbs device.
// REQUIRES: `source` outlives the server. Returns: Unavailable when the address cannot be bound.
absl::StatusOr<std::unique_ptr<BlockServer>> StartBlockServer(const std::string& listen,
                                                              BlockSource* source,
                                                              const TransportOptions& options);

std::unique_ptr<BlockTransport> NewTcpTransport(const TransportOptions& options);

enum class TransportMode { kAuto, kTcp, kRdma };
// "auto", "tcp" or "rdma". Returns: InvalidArgument otherwise.
absl::StatusOr<TransportMode> ParseTransportMode(const std::string& text);

// Picks the client transport: RDMA when asked for (error if impossible) or, with auto, when a
// verbs device has an active port; TCP otherwise (always, in a build without RDMA). `why` gets
// one line saying which and why.
// Returns: FailedPrecondition (kRdma without an active device, or RDMA not built in).
absl::StatusOr<std::unique_ptr<BlockTransport>> SelectTransport(TransportMode mode,
                                                                const TransportOptions& options,
                                                                std::string* why);

}  // namespace ember::transport
