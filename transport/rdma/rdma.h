// transport/rdma/: moving blocks over RDMA, one unit the build includes (cmake -DEMBER_RDMA=ON,
// the default; it needs libibverbs) or leaves out (OFF: rdma_off.cc answers "not built" and
// nothing here links libibverbs). Internal to transport/: only select.cc includes this header.
//
// How a block moves over RDMA: the client opens the usual authenticated TCP connection, sends its
// QpInfo (queue pair number, LID/GID, PSN, buffer address and rkey), gets the server's, and both
// move their QPs INIT -> RTR -> RTS. For each block the client sends a Request carrying its
// buffer's address and rkey over TCP; the server reads the block into its registered buffer,
// RDMA-WRITEs it into the client's buffer, waits for the completion, and answers the Request
// over TCP. The TCP channel keeps framing, errors and timeouts the same as the TCP transport.
//
// Owns: every libibverbs call (verbs.cc: device discovery, queue pairs, registered buffers), the
// RDMA client transport, and the server's QpResponder (qp_responder.h). Must not touch: the TCP
// server's connections and framing (it is handed a handshake, never a socket to serve), files
// beyond the fd a BlockSource hands over, anything outside transport/.
//
// This machine's kernel has no InfiniBand, so only discovery, choice and the handshake encoding
// are exercised by tests here; the data path runs where a device exists (docs/architecture.md).
#pragma once

#include <memory>
#include <string>

#include "transport/block_transport.h"
#include "transport/qp_responder.h"

namespace ember::transport {

// A client transport on the first verbs device with an active port, or nullptr when there is
// none (or RDMA is not built in). `why` gets which device and why, or why none.
std::unique_ptr<BlockTransport> NewRdmaTransportIfActive(const TransportOptions& options,
                                                         std::string* why);

// The server's side: a responder on the first verbs device with an active port, or nullptr when
// there is none (or RDMA is not built in). `why` gets which device, or why none.
std::unique_ptr<QpResponder> NewRdmaResponderIfActive(std::string* why);

}  // namespace ember::transport
