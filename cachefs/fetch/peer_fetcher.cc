#include "cachefs/fetch/peer_fetcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace ember::cachefs {
namespace {
constexpr size_t kMaxLocated = 100'000;
}

PeerFetcher::PeerFetcher(BlockDirectory* directory, transport::BlockTransport* transport,
                         ChecksumBook* checksums, const Options& options)
    : directory_(directory), transport_(transport), checksums_(checksums), options_(options) {
  // Every kind exists from the start, so dashboards see 0 rather than nothing.
  for (const char* kind : {"checksum", "not_found", "timeout", "auth", "connection", "protocol"}) {
    ErrorCounter(kind);
  }
}

absl::Status PeerFetcher::Locate(const std::vector<BlockAddr>& addrs) {
  auto locations = directory_->Locate(addrs);
  if (!locations.ok()) return locations.status();
  const auto now = std::chrono::steady_clock::now();
  // Meta's checksums first: a Fetch that finds the holders below finds the checksum too.
  for (size_t i = 0; i < locations->size(); i++) {
    if ((*locations)[i].checksum) checksums_->Learn(addrs[i], *(*locations)[i].checksum);
  }
  // Whether `loc`'s holders other than this node are `set`, in the same order.
  auto same = [&](const BlockDirectory::Location& loc, const std::vector<Holder>& set) {
    size_t k = 0;
    for (const Holder& h : loc.holders) {
      if (h.id == options_.self_id) continue;
      if (k == set.size() || set[k].id != h.id || set[k].address != h.address ||
          set[k].sw != h.sw || set[k].rack != h.rack) {
        return false;
      }
      k++;
    }
    return k == set.size();
  };
  HolderSet last;  // the set the previous block was located at
  absl::MutexLock lock(&mu_);
  if (located_.size() > kMaxLocated) located_.clear();
  for (size_t i = 0; i < locations->size(); i++) {
    const BlockDirectory::Location& loc = (*locations)[i];
    auto dsv = std::make_pair(addrs[i].dataset_id, addrs[i].version);
    if (loc.dataset_unheld) {
      unheld_[dsv] = now;
    } else {
      unheld_.erase(dsv);  // held here, or some other block of the version is held elsewhere
    }
    if (last == nullptr || !same(loc, *last)) {
      auto set = std::make_shared<std::vector<Holder>>();
      for (const Holder& h : loc.holders) {
        if (h.id != options_.self_id) set->push_back(h);
      }
      last = set->empty() ? nullptr : std::move(set);
    }
    // "Nobody has it" is not kept: Fetch and LocateAhead ask again, since during a prefetch the
    // holders change within moments.
    if (last == nullptr) {
      located_.erase(addrs[i]);
    } else {
      located_[addrs[i]] = Located{last, now};
    }
  }
  return absl::OkStatus();
}

bool PeerFetcher::LikelyUnheld(const BlockAddr& addr) {
  absl::MutexLock lock(&mu_);
  return UnheldLocked(addr, std::chrono::steady_clock::now());
}

bool PeerFetcher::UnheldLocked(const BlockAddr& addr, std::chrono::steady_clock::time_point now) {
  auto it = unheld_.find({addr.dataset_id, addr.version});
  return it != unheld_.end() && now - it->second <= options_.locate_ttl;
}

void PeerFetcher::LocateAhead(const std::vector<BlockAddr>& addrs) {
  std::vector<BlockAddr> missing;
  auto now = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_);
    for (const auto& a : addrs) {
      if (UnheldLocked(a, now)) continue;
      auto it = located_.find(a);
      if (it == located_.end() || now - it->second.at > options_.locate_ttl) missing.push_back(a);
    }
  }
  if (missing.empty()) return;
  // Best effort: when it fails, each fill locates its own block (and meets the same error).
  if (absl::Status st = Locate(missing); !st.ok()) {
    spdlog::debug("peer: locating {} blocks ahead: {}", missing.size(), std::string(st.message()));
  }
}

metrics::Counter* PeerFetcher::ErrorCounter(const char* kind) {
  return metrics::Global().GetCounter("ember_peer_errors_total",
                                      "Failed peer fetches by kind (the reader moved on).",
                                      {{"kind", kind}});
}

bool PeerFetcher::SuspectLocked(const std::string& id) {
  auto it = suspects_.find(id);
  if (it == suspects_.end()) return false;
  if (std::chrono::steady_clock::now() > it->second) {
    suspects_.erase(it);
    return false;
  }
  return true;
}

void PeerFetcher::MarkSuspect(const std::string& id) {
  absl::MutexLock lock(&mu_);
  suspects_[id] = std::chrono::steady_clock::now() + options_.suspect_for;
}

absl::StatusOr<std::vector<bool>> PeerFetcher::Holders(const std::vector<BlockAddr>& addrs) {
  if (absl::Status st = Locate(addrs); !st.ok()) return st;
  std::vector<bool> held(addrs.size(), false);
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < addrs.size(); i++) held[i] = located_.count(addrs[i]) > 0;
  return held;
}

absl::StatusOr<uint64_t> PeerFetcher::Fetch(const BlockAddr& addr, uint32_t length, char* buf,
                                            bool locate) {
  Located l;
  bool cached = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = located_.find(addr);
    if (it != located_.end() &&
        std::chrono::steady_clock::now() - it->second.at <= options_.locate_ttl) {
      l = it->second;
      cached = true;
    }
  }
  if (!cached && !locate) return absl::NotFoundError("no peer is known to hold the block");
  if (!cached) {
    absl::Status s = Locate({addr});
    if (!s.ok()) return absl::NotFoundError(absl::StrCat("cannot locate peers: ", s.message()));
    absl::MutexLock lock(&mu_);
    auto it = located_.find(addr);
    if (it != located_.end()) l = it->second;
  }
  // Without meta's checksum a peer's bytes cannot be checked: use the origin.
  const std::optional<uint64_t> checksum = checksums_->Known(addr);
  if (l.holders == nullptr || !checksum) return absl::NotFoundError("no peer holds the block");

  return TryHolders(Order(*l.holders), addr, length, buf, *checksum);
}

absl::StatusOr<uint64_t> PeerFetcher::TryHolders(std::span<const Holder> order,
                                                 const BlockAddr& addr, uint32_t length, char* buf,
                                                 uint64_t checksum) {
  for (const auto& h : order) {
    {
      absl::MutexLock lock(&mu_);
      inflight_[h.id]++;
    }
    transport::FetchInfo info;
    absl::Status s = transport_->Fetch(h.address, addr, 0, length, buf, &info);
    {
      absl::MutexLock lock(&mu_);
      inflight_[h.id]--;
    }
    // Hashed as it arrived, by a transport that can; else now.
    const uint64_t got = !s.ok()                  ? 0
                         : info.received_checksum ? *info.received_checksum
                                                  : BlockChecksum(buf, length);
    if (s.ok() && got == checksum) {
      fetches_++;
      return checksum;
    }
    Failed(h, addr, s);
  }
  return absl::NotFoundError("no peer could give the block");
}

std::vector<PeerFetcher::Holder> PeerFetcher::Order(const std::vector<Holder>& holders) {
  // Nearest first, then least loaded by this node's own fetches in flight.
  std::vector<Holder> order;
  absl::MutexLock lock(&mu_);
  for (const auto& h : holders) {
    if (!SuspectLocked(h.id)) order.push_back(h);
  }
  auto rank = [&](const Holder& h) {
    mu_.AssertHeld();
    int near = (!options_.self_switch.empty() && h.sw == options_.self_switch) ? 0
               : (!options_.self_rack.empty() && h.rack == options_.self_rack) ? 1
                                                                               : 2;
    return std::make_pair(near, inflight_[h.id]);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](const Holder& a, const Holder& b) { return rank(a) < rank(b); });
  return order;
}

void PeerFetcher::Failed(const Holder& h, const BlockAddr& addr, const absl::Status& s) {
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
    absl::MutexLock lock(&mu_);
    located_.erase(addr);
  } else {
    spdlog::warn("peer: {} ({}): {}; trying the next source", h.id, h.address,
                 std::string(s.message()));
    MarkSuspect(h.id);
  }
}

void PeerFetcher::FetchMany(std::span<Want> wants) {
  // Blocks not located lately are located first, all in one call (best effort: those still
  // unknown after it are not fetched).
  std::vector<BlockAddr> addrs;
  for (const Want& w : wants) addrs.push_back(w.addr);
  LocateAhead(addrs);
  // Each block's holders in order; one FetchMany per first choice, the rest tried one by one.
  // The order is worked out once per set of holders (most blocks of a batch share one; a map's
  // values stay where they are as it grows, and its keys keep the sets alive).
  std::vector<const std::vector<Holder>*> orders(wants.size(), nullptr);
  std::map<HolderSet, std::vector<Holder>> order_of;
  std::vector<uint64_t> checksum(wants.size(), 0);
  std::map<std::string, std::vector<size_t>> by_peer;  // holder address -> wants
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < wants.size(); i++) {
    wants[i].result = absl::NotFoundError("no peer holds the block");
    Located l;
    {
      absl::MutexLock lock(&mu_);
      auto it = located_.find(wants[i].addr);
      if (it != located_.end() && now - it->second.at <= options_.locate_ttl) l = it->second;
    }
    // Without meta's checksum a peer's bytes cannot be checked.
    const std::optional<uint64_t> known = checksums_->Known(wants[i].addr);
    if (l.holders == nullptr || !known) continue;
    checksum[i] = *known;
    auto [at, added] = order_of.try_emplace(l.holders);
    if (added) at->second = Order(*l.holders);
    orders[i] = &at->second;
    if (!orders[i]->empty()) by_peer[orders[i]->front().address].push_back(i);
  }
  for (auto& [address, which] : by_peer) {
    const Holder h = orders[which.front()]->front();
    std::vector<transport::FetchPiece> pieces(which.size());
    for (size_t k = 0; k < which.size(); k++) {
      pieces[k].addr = wants[which[k]].addr;
      pieces[k].length = wants[which[k]].length;
      pieces[k].buf = wants[which[k]].buf;
    }
    {
      absl::MutexLock lock(&mu_);
      inflight_[h.id] += static_cast<int>(pieces.size());
    }
    transport_->FetchMany(address, pieces);
    {
      absl::MutexLock lock(&mu_);
      inflight_[h.id] -= static_cast<int>(pieces.size());
    }
    bool peer_failed = false;  // a connection-level error is counted (and suspected) once
    for (size_t k = 0; k < which.size(); k++) {
      const size_t i = which[k];
      Want& w = wants[i];
      const transport::FetchPiece& p = pieces[k];
      const uint64_t got = !p.status.ok()             ? 0
                           : p.info.received_checksum ? *p.info.received_checksum
                                                      : BlockChecksum(w.buf, w.length);
      if (p.status.ok() && got == checksum[i]) {
        fetches_++;
        w.result = got;
        continue;
      }
      const bool per_block = p.status.ok() || absl::IsNotFound(p.status);
      if (per_block || !peer_failed) Failed(h, w.addr, p.status);
      peer_failed = peer_failed || !per_block;
      // The block's other holders, one by one, as Fetch tries them.
      w.result = TryHolders(std::span<const Holder>(*orders[i]).subspan(1), w.addr, w.length, w.buf,
                            checksum[i]);
    }
  }
}

}  // namespace ember::cachefs
