// The seam between the TCP block server and a one-sided data path (RDMA). Internal to transport/.
//
// The TCP server owns every connection: framing, the token challenge, requests, responses, errors
// and timeouts. When a client sends its half of a queue-pair handshake (a kQpInfo frame, wire.h),
// the server hands it to the QpResponder it was given at start (none: the server answers
// kUnsupported). The responder sets up this node's half and returns a BlockWriter for that one
// connection. A later Request carrying an rkey is served by that writer putting the bytes straight
// into the client's registered memory; the TCP server then sends the Response as usual.
//
// A server with a responder says so in its Hello (kHelloRdma), so clients ask only servers that
// can answer. The TCP server knows only these two interfaces; the RDMA unit (transport/rdma/)
// implements them and transport/select.cc plugs one in, so tcp_transport.cc builds without RDMA.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/block_transport.h"
#include "transport/wire.h"

namespace ember::transport {

// One connection's one-sided data path. Not thread-safe: the connection's thread is its one user.
class BlockWriter {
 public:
  virtual ~BlockWriter() = default;
  // Copies [offset, offset+length) of `block` (its bytes in memory, or its file) into the
  // client's memory at (remote_addr, rkey) and returns once the write has completed or `timeout`
  // passed. Returns: Ok; InvalidArgument (longer than a block); DataLoss (short read of the
  // file); Unavailable (the write failed or timed out: the queue pair is gone, and the server
  // ends the connection, so the client builds a new one).
  virtual absl::Status Write(const BlockSource::Block& block, uint64_t offset, uint32_t length,
                             uint64_t remote_addr, uint32_t rkey,
                             std::chrono::milliseconds timeout) = 0;
};

// Answers queue-pair handshakes for a server. Thread-safe: connection threads call it at once.
class QpResponder {
 public:
  virtual ~QpResponder() = default;
  // Sets up this node's side of a queue pair connected to the client's `remote`; `*local` gets
  // this side's parameters to send back. `local_ip`: the connection's local IPv4 address (RoCE
  // picks the GID that carries it).
  // Returns: the connection's writer; Unavailable (no device, mismatched link layers, or the
  // queue pair failed).
  virtual absl::StatusOr<std::unique_ptr<BlockWriter>> Accept(const QpInfo& remote,
                                                              const std::string& local_ip,
                                                              QpInfo* local) = 0;
};

}  // namespace ember::transport
