// transport/rdma/ without libibverbs (cmake -DEMBER_RDMA=OFF): no system verbs. Auto selection
// picks TCP and `--transport rdma` fails saying why; servers refuse queue pairs. The transport
// itself is still built (and tested against the fake device).
#include "transport/rdma/verbs.h"

namespace ember::transport {

std::shared_ptr<Verbs> SystemVerbs(std::string* why) {
  *why = "RDMA support is not built in (cmake -DEMBER_RDMA=OFF)";
  return nullptr;
}

}  // namespace ember::transport
