#include "cachefs/peer_fetcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace ember::cachefs {
namespace {
constexpr size_t kMaxLocated = 100'000;
}

PeerFetcher::PeerFetcher(meta::MetaClient* meta, transport::BlockTransport* transport,
                         const Options& options)
    : meta_(meta), transport_(transport), options_(options) {
  // Every kind exists from the start, so dashboards see 0 rather than nothing.
  for (const char* kind : {"checksum", "not_found", "timeout", "auth", "connection", "protocol"}) {
    ErrorCounter(kind);
  }
}

absl::Status PeerFetcher::Locate(const std::vector<BlockAddr>& addrs) {
  rpc::LocateRequest req;
  req.set_node_id(options_.self_id);
  for (const auto& a : addrs) {
    auto* b = req.add_blocks();
    b->set_dataset_id(a.dataset_id);
    b->set_version(a.version);
    b->set_file_id(a.file_id);
    b->set_index(a.index);
  }
  auto resp = meta_->Locate(req);
  if (!resp.ok()) return resp.status();
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  if (located_.size() > kMaxLocated) located_.clear();
  for (int i = 0; i < resp->holders_size() && i < static_cast<int>(addrs.size()); i++) {
    const auto& h = resp->holders(i);
    auto dsv = std::make_pair(addrs[i].dataset_id, addrs[i].version);
    if (h.dataset_unheld()) {
      unheld_[dsv] = now;
    } else if (h.node_ids_size() > 0) {
      unheld_.erase(dsv);
    }
    Located l;
    l.at = now;
    l.has_checksum = h.has_checksum();
    l.checksum = h.checksum();
    for (int j = 0; j < h.node_ids_size(); j++) {
      if (h.node_ids(j) == options_.self_id) continue;
      l.holders.push_back({h.node_ids(j), h.addresses(j),
                           j < h.switches_size() ? h.switches(j) : "",
                           j < h.racks_size() ? h.racks(j) : ""});
    }
    // "Nobody has it" is kept only for meta's checksum (KnownChecksum): Fetch and Prefetch ask
    // again, since during a prefetch the holders change within moments.
    if (l.holders.empty() && !l.has_checksum) {
      located_.erase(addrs[i]);
    } else {
      located_[addrs[i]] = std::move(l);
    }
  }
  return absl::OkStatus();
}

bool PeerFetcher::LikelyUnheld(const BlockAddr& addr) {
  std::lock_guard lock(mu_);
  return UnheldLocked(addr, std::chrono::steady_clock::now());
}

bool PeerFetcher::UnheldLocked(const BlockAddr& addr, std::chrono::steady_clock::time_point now) {
  auto it = unheld_.find({addr.dataset_id, addr.version});
  return it != unheld_.end() && now - it->second <= options_.locate_ttl;
}

std::optional<uint64_t> PeerFetcher::KnownChecksum(const BlockAddr& addr) {
  std::lock_guard lock(mu_);
  auto it = located_.find(addr);
  if (it == located_.end() || !it->second.has_checksum ||
      std::chrono::steady_clock::now() - it->second.at > options_.locate_ttl) {
    return std::nullopt;
  }
  return it->second.checksum;
}

void PeerFetcher::Prefetch(const std::vector<BlockAddr>& addrs) {
  std::vector<BlockAddr> missing;
  auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    for (const auto& a : addrs) {
      if (UnheldLocked(a, now)) continue;
      auto it = located_.find(a);
      if (it == located_.end() || it->second.holders.empty() ||
          now - it->second.at > options_.locate_ttl) {
        missing.push_back(a);
      }
    }
  }
  if (!missing.empty()) (void)Locate(missing);
}

metrics::Counter* PeerFetcher::ErrorCounter(const char* kind) {
  return metrics::Global().GetCounter("ember_peer_errors_total",
                                      "Failed peer fetches by kind (the reader moved on).",
                                      {{"kind", kind}});
}

bool PeerFetcher::Suspect(const std::string& id) {
  auto it = suspects_.find(id);
  if (it == suspects_.end()) return false;
  if (std::chrono::steady_clock::now() > it->second) {
    suspects_.erase(it);
    return false;
  }
  return true;
}

void PeerFetcher::MarkSuspect(const std::string& id) {
  std::lock_guard lock(mu_);
  suspects_[id] = std::chrono::steady_clock::now() + options_.suspect_for;
}

absl::StatusOr<uint64_t> PeerFetcher::Fetch(const BlockAddr& addr, uint32_t length, char* buf) {
  Located l;
  bool cached = false;
  {
    std::lock_guard lock(mu_);
    auto it = located_.find(addr);
    if (it != located_.end() && !it->second.holders.empty() &&
        std::chrono::steady_clock::now() - it->second.at <= options_.locate_ttl) {
      l = it->second;
      cached = true;
    }
  }
  if (!cached) {
    absl::Status s = Locate({addr});
    if (!s.ok()) return absl::NotFoundError(absl::StrCat("cannot locate peers: ", s.message()));
    std::lock_guard lock(mu_);
    auto it = located_.find(addr);
    if (it != located_.end()) l = it->second;
  }
  // Without meta's checksum a peer's bytes cannot be checked: use the origin.
  if (l.holders.empty() || !l.has_checksum) return absl::NotFoundError("no peer holds the block");

  // Nearest first, then least loaded by this node's own fetches in flight.
  std::vector<Holder> order;
  {
    std::lock_guard lock(mu_);
    for (const auto& h : l.holders) {
      if (!Suspect(h.id)) order.push_back(h);
    }
    auto rank = [&](const Holder& h) {
      int near = (!options_.self_switch.empty() && h.sw == options_.self_switch) ? 0
                 : (!options_.self_rack.empty() && h.rack == options_.self_rack) ? 1
                                                                                 : 2;
      return std::make_pair(near, inflight_[h.id]);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](const Holder& a, const Holder& b) { return rank(a) < rank(b); });
  }
  for (const auto& h : order) {
    {
      std::lock_guard lock(mu_);
      inflight_[h.id]++;
    }
    transport::FetchInfo info;
    absl::Status s = transport_->Fetch(h.address, addr, 0, length, buf, &info);
    {
      std::lock_guard lock(mu_);
      inflight_[h.id]--;
    }
    if (s.ok() && BlockChecksum(buf, length) == l.checksum) {
      fetches_++;
      return l.checksum;
    }
    errors_++;
    ErrorCounter(s.ok()                        ? "checksum"
                 : absl::IsNotFound(s)         ? "not_found"
                 : absl::IsDeadlineExceeded(s) ? "timeout"
                 : absl::IsPermissionDenied(s) ? "auth"
                 : absl::IsUnavailable(s)      ? "connection"
                                               : "protocol")
        ->Inc();
    if (s.ok()) {
      spdlog::error("peer: block {}/{}/{}/{} from {} ({}) failed its checksum; not used",
                    addr.dataset_id, addr.version, addr.file_id, addr.index, h.id, h.address);
      MarkSuspect(h.id);
    } else if (absl::IsNotFound(s)) {
      // A stale location: that peer evicted the block. Forget the cached answer.
      std::lock_guard lock(mu_);
      located_.erase(addr);
    } else {
      spdlog::warn("peer: {} ({}): {}; trying the next source", h.id, h.address,
                   std::string(s.message()));
      MarkSuspect(h.id);
    }
  }
  return absl::NotFoundError("no peer could give the block");
}

}  // namespace ember::cachefs
