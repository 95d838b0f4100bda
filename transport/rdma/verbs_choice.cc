// The choices of verbs.h (ports and GIDs), pure functions of what a device reports: built with
// or without libibverbs, and tested against described devices.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/rdma/verbs.h"

namespace ember::transport {

const char* LinkLayerName(LinkLayer l) {
  switch (l) {
    case LinkLayer::kInfiniBand:
      return "InfiniBand";
    case LinkLayer::kEthernet:
      return "RoCE";
    default:
      return "unknown link layer";
  }
}

bool IsZeroGid(const Gid& g) {
  return std::all_of(g.begin(), g.end(), [](uint8_t b) { return b == 0; });
}

std::optional<Gid> Ipv4MappedGid(const std::string& ipv4) {
  in_addr a{};
  if (ipv4.empty() || inet_pton(AF_INET, ipv4.c_str(), &a) != 1) return std::nullopt;
  Gid g{};
  g[10] = 0xff;
  g[11] = 0xff;
  std::memcpy(g.data() + 12, &a.s_addr, 4);
  return g;
}

namespace {
bool IsIpv4Mapped(const Gid& g) {
  return std::all_of(g.begin(), g.begin() + 10, [](uint8_t b) { return b == 0; }) &&
         g[10] == 0xff && g[11] == 0xff;
}
}  // namespace

std::optional<PortChoice> ChoosePort(const std::vector<DeviceInfo>& devices,
                                     const std::string& local_ipv4, std::string* why) {
  const std::optional<Gid> mine = Ipv4MappedGid(local_ipv4);
  std::optional<PortChoice> best;
  int best_rank = 99;  // 0: RoCE v2 GID of our address; 1: InfiniBand; 2: another RoCE v2 IPv4
  std::vector<std::string> skipped;
  for (const DeviceInfo& d : devices) {
    if (d.iwarp) {
      skipped.push_back(absl::StrCat(d.name, ": iWARP"));
      continue;
    }
    for (const PortInfo& p : d.ports) {
      const std::string at = absl::StrCat(d.name, " port ", p.port);
      if (!p.active) {
        skipped.push_back(at + ": not active");
        continue;
      }
      PortChoice c{d.name, p};
      int rank = 99;
      if (p.link == LinkLayer::kEthernet) {
        for (const GidEntry& g : p.gids) {
          if (g.type != GidType::kRoceV2 || IsZeroGid(g.gid) || !IsIpv4Mapped(g.gid)) continue;
          int r = mine && g.gid == *mine ? 0 : 2;
          if (r < rank) {
            rank = r;
            c.gid_index = static_cast<uint8_t>(g.index);
            c.gid = g.gid;
          }
        }
        if (rank == 99) skipped.push_back(at + ": no RoCE v2 IPv4 GID");
      } else if (p.link == LinkLayer::kInfiniBand) {
        if (p.lid == 0) {
          skipped.push_back(at + ": LID 0 (no subnet manager?)");
        } else {
          rank = 1;
          if (!p.gids.empty()) c.gid = p.gids.front().gid;
        }
      } else {
        skipped.push_back(at + ": unknown link layer");
      }
      if (rank < best_rank) {
        best_rank = rank;
        best = c;
      }
    }
  }
  if (best) {
    *why = absl::StrCat("RDMA device ", best->device, " port ", best->port.port, " (",
                        LinkLayerName(best->port.link));
    if (best->port.link == LinkLayer::kEthernet) {
      absl::StrAppend(why, ", RoCE v2 GID index ", best->gid_index,
                      best_rank == 0
                          ? absl::StrCat(" for ", local_ipv4)
                          : absl::StrCat(", none for ", local_ipv4.empty() ? "?" : local_ipv4));
    } else {
      absl::StrAppend(why, ", LID ", best->port.lid);
    }
    absl::StrAppend(why, ")");
    return best;
  }
  *why = devices.empty() ? "no RDMA device found"
                         : absl::StrCat("no usable RDMA port (", absl::StrJoin(skipped, "; "), ")");
  return std::nullopt;
}

}  // namespace ember::transport
