// The TCP transport's server start, for select.cc. Internal to transport/ (others call
// StartBlockServer in block_transport.h; the TCP client is NewTcpTransport there).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport/block_transport.h"
#include "transport/qp_responder.h"

namespace ember::transport {

// Serves blocks from `source` on `listen` ("HOST:PORT", port 0 picks one), one thread per
// connection. Queue-pair handshakes go to `responder`; null refuses them (kUnsupported).
// REQUIRES: `source` outlives the server.
// Returns: Unavailable when the address cannot be bound.
absl::StatusOr<std::unique_ptr<BlockServer>> StartTcpBlockServer(
    const std::string& listen, BlockSource* source, const TransportOptions& options,
    std::unique_ptr<QpResponder> responder);

}  // namespace ember::transport
