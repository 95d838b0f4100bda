// transport/rdma/ left out of the build (cmake -DEMBER_RDMA=OFF): no libibverbs, no RDMA. Auto
// selection picks TCP and `--transport rdma` fails saying why; servers refuse queue pairs.
#include "transport/rdma/rdma.h"

namespace ember::transport {

namespace {
constexpr char kNotBuilt[] = "RDMA support is not built in (cmake -DEMBER_RDMA=OFF)";
}  // namespace

std::unique_ptr<BlockTransport> NewRdmaTransportIfActive(const TransportOptions& options,
                                                         std::string* why) {
  *why = kNotBuilt;
  return nullptr;
}

std::unique_ptr<QpResponder> NewRdmaResponderIfActive(std::string* why) {
  *why = kNotBuilt;
  return nullptr;
}

}  // namespace ember::transport
