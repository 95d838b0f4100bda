// RdmaHub and the shared setup steps (rdma_hub.h).
#include "transport/rdma/rdma_hub.h"

#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ember::transport {

size_t SizeClass(size_t len) {
  size_t s = kMinBuffer;
  while (s < len) s <<= 1;
  return s;
}

uint32_t RandomPsn() {
  static thread_local std::mt19937 rng{std::random_device{}()};
  return rng() & 0xffffff;
}

// Waits for the completion of `wr_id` on `qp` until `deadline`: polls for kSpin, then sleeps on
// the completion channel. Returns: the completion, or nullopt at the deadline.
std::optional<Completion> AwaitCompletion(QueuePair& qp, uint64_t wr_id,
                                          std::chrono::steady_clock::time_point deadline) {
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  while (true) {
    Completion c;
    auto n = qp.Poll(&c);
    // The CQ cannot be read: as good as a timeout (the caller stops the QP and drains it, and
    // never reuses a buffer a WRITE may still read).
    if (!n.ok()) return std::nullopt;
    if (*n == 1) {
      if (c.wr_id == wr_id) return c;
      // An older WR's completion: only possible after a drain that gave up; never ours.
      spdlog::warn("RDMA: completion of WR {} while waiting for WR {}: ignored", c.wr_id, wr_id);
      continue;
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return std::nullopt;
    if (now < spin_until) continue;
    qp.WaitForCompletion(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                         std::chrono::milliseconds(1));
  }
}

RdmaHub::RdmaHub(std::shared_ptr<Verbs> verbs, const TransportOptions& options,
                 std::vector<DeviceInfo> devices)
    : verbs_(std::move(verbs)),
      options_(options),
      devices_(std::move(devices)),
      probed_(std::chrono::steady_clock::now()) {
  std::string warning = verbs_->ForkInit();
  if (!warning.empty()) spdlog::warn("RDMA: {}", warning);
}

absl::StatusOr<PortChoice> RdmaHub::Choose(const std::string& local_ip) {
  constexpr auto kReprobe = std::chrono::seconds(60);
  std::vector<DeviceInfo> devices;
  {
    absl::MutexLock lock(&mu_);
    if (std::chrono::steady_clock::now() - probed_ < kReprobe) devices = devices_;
  }
  if (devices.empty()) {
    std::string error;
    devices = verbs_->Devices(&error);
    absl::MutexLock lock(&mu_);
    devices_ = devices;
    probed_ = std::chrono::steady_clock::now();
  }
  std::string why;
  auto c = ChoosePort(devices, local_ip, &why);
  if (!c) return absl::FailedPreconditionError(why);
  return *c;
}

std::shared_ptr<RdmaHub> NewRdmaHub(std::shared_ptr<Verbs> verbs, const TransportOptions& options,
                                    std::string* why) {
  if (!verbs) return nullptr;
  std::string error;
  std::vector<DeviceInfo> devices = verbs->Devices(&error);
  // Any usable port, whatever the address: the per-connection choice comes later.
  if (!ChoosePort(devices, "", why)) {
    if (!error.empty()) absl::StrAppend(why, " (", error, ")");
    return nullptr;
  }
  return std::make_shared<RdmaHub>(std::move(verbs), options, std::move(devices));
}

RdmaHubStats GetRdmaHubStats(RdmaHub& hub) { return hub.Stats(); }

QpInfo LocalQpInfo(const QueuePair& qp, const PortChoice& c, uint32_t psn) {
  QpInfo q;
  q.qp_num = qp.qp_num();
  q.lid = c.port.lid;
  q.gid = c.gid;
  q.psn = psn;
  q.mtu = c.port.mtu;
  q.link = static_cast<uint32_t>(c.port.link);
  return q;
}

// Checks the other side's parameters against this side's port. Returns: FailedPrecondition.
absl::Status CheckRemote(const QpInfo& remote, const PortChoice& c) {
  const auto link = static_cast<LinkLayer>(remote.link);
  if (link != c.port.link) {
    return absl::FailedPreconditionError(absl::StrCat("link layers differ: the peer's is ",
                                                      LinkLayerName(link), ", this node's ",
                                                      LinkLayerName(c.port.link)));
  }
  if (link == LinkLayer::kInfiniBand && remote.lid == 0) {
    return absl::FailedPreconditionError("the peer's LID is 0");
  }
  if (link == LinkLayer::kEthernet && IsZeroGid(remote.gid)) {
    return absl::FailedPreconditionError("the peer's GID is zero");
  }
  return absl::OkStatus();
}

// Moves a QP in INIT to RTS against `remote`.
absl::Status Connect(QueuePair& qp, const PortChoice& c, const QpInfo& remote, uint32_t psn,
                     uint8_t traffic_class) {
  QpPath p;
  p.port = c.port.port;
  p.link = c.port.link;
  p.mtu = std::min(remote.mtu, c.port.mtu);
  p.remote_qp_num = remote.qp_num;
  p.remote_psn = remote.psn;
  p.remote_lid = remote.lid;
  p.remote_gid = remote.gid;
  p.sgid_index = c.gid_index;
  p.hop_limit = 64;
  p.traffic_class = traffic_class;
  absl::Status s = qp.ToRtr(p);
  if (s.ok()) s = qp.ToRts(psn);
  return s;
}

// The process's hub on the system's verbs, made once.
std::shared_ptr<RdmaHub> SystemHub(const TransportOptions& options, std::string* why) {
  static absl::Mutex mu;
  static std::shared_ptr<RdmaHub> hub ABSL_GUARDED_BY(mu);
  static std::string hub_why ABSL_GUARDED_BY(mu);
  static bool made ABSL_GUARDED_BY(mu) = false;
  absl::MutexLock lock(&mu);
  if (!made) {
    made = true;
    auto verbs = SystemVerbs(&hub_why);
    if (verbs) hub = NewRdmaHub(std::move(verbs), options, &hub_why);
  }
  *why = hub_why;
  return hub;
}

}  // namespace ember::transport
