// Transport selection: which client transport a node uses, and whether its server answers RDMA
// queue pairs. The one place that knows both the TCP transport and the RDMA unit (rdma/rdma.h).
#include "absl/strings/str_cat.h"
#include "transport/block_transport.h"
#include "transport/rdma/rdma.h"
#include "transport/tcp_transport.h"

namespace ember::transport {

absl::StatusOr<TransportMode> ParseTransportMode(const std::string& text) {
  if (text == "auto") return TransportMode::kAuto;
  if (text == "tcp") return TransportMode::kTcp;
  if (text == "rdma") return TransportMode::kRdma;
  return absl::InvalidArgumentError(
      absl::StrCat("--transport '", text, "' must be auto, tcp or rdma"));
}

absl::StatusOr<std::unique_ptr<BlockTransport>> SelectTransport(TransportMode mode,
                                                                const TransportOptions& options,
                                                                std::string* why) {
  if (mode == TransportMode::kTcp) {
    *why = "transport tcp (asked for with --transport tcp)";
    return NewTcpTransport(options);
  }
  std::string reason;
  std::unique_ptr<BlockTransport> rdma = NewRdmaTransportIfActive(options, &reason);
  if (rdma) {
    *why = absl::StrCat("transport rdma: ", reason);
    return rdma;
  }
  if (mode == TransportMode::kRdma) {
    return absl::FailedPreconditionError(absl::StrCat("--transport rdma: ", reason));
  }
  *why = absl::StrCat("transport tcp: ", reason);
  return NewTcpTransport(options);
}

absl::StatusOr<std::unique_ptr<BlockServer>> StartBlockServer(const std::string& listen,
                                                              BlockSource* source,
                                                              const TransportOptions& options) {
  // Peers may ask for RDMA; answer them when this node has an active device.
  std::unique_ptr<QpResponder> responder;
  if (options.serve_rdma) {
    std::string why;  // a node without RDMA serves TCP only; nothing to report
    responder = NewRdmaResponderIfActive(options, &why);
  }
  return StartTcpBlockServer(listen, source, options, std::move(responder));
}

}  // namespace ember::transport
