// The fake verbs device (fake_verbs.h).
#include "transport/rdma/fake_verbs.h"

#include <arpa/inet.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/ids.h"

namespace ember::transport {

namespace {
using Clock = std::chrono::steady_clock;
constexpr Clock::time_point kNever = Clock::time_point::max();

struct HostState {
  FakeHostConfig cfg;
  size_t registered = 0;
  bool fork_init = false;
  std::chrono::milliseconds delay_next{0};
  bool lose_next = false;
  bool fail_next = false;
};

struct FakeMr;
struct FakeQp;

struct Wr {
  uint64_t wr_id = 0;
  uint32_t src_key = 0;
  const char* src = nullptr;
  size_t len = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  Clock::time_point due;
  uint64_t src_hash = 0;
  bool fail = false;
};
}  // namespace

struct FakeFabric::State {
  bool routed = true;
  uint8_t hops = 2;
  bool check_sources = true;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::unique_ptr<HostState>> hosts;
  std::map<uint32_t, FakeQp*> qps;
  std::map<uint32_t, FakeMr*> mrs;  // by key (lkey == rkey here)
  uint32_t next_qpn = 0x100;
  uint32_t next_key = 0x1000;
  FakeFabricStats stats;

  void Process(FakeQp& qp, Clock::time_point now);
  bool Execute(FakeQp& qp, Wr& wr, std::string* error);
  FakeQp* Route(FakeQp& qp, std::string* error);
};

namespace {

struct FakeMr final : public MemoryRegion {
  FakeMr(FakeFabric::State* st, HostState* host, size_t size, uint32_t key, bool remote_write)
      : st(st),
        host(host),
        mem(static_cast<char*>(aligned_alloc(4096, size))),
        size_(size),
        key(key),
        remote_write(remote_write) {
    std::memset(mem, 0, size);
  }
  ~FakeMr() override {
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->mrs.erase(key);
      host->registered -= size_;
    }
    free(mem);
  }
  char* data() override { return mem; }
  size_t size() const override { return size_; }
  uint32_t lkey() const override { return key; }
  uint32_t rkey() const override { return key; }

  FakeFabric::State* st;
  HostState* host;
  char* mem;
  size_t size_;
  uint32_t key;
  bool remote_write;
};

struct FakeQp final : public QueuePair {
  FakeQp(std::shared_ptr<FakeFabric> fabric, HostState* host, uint32_t qpn, int max_wr)
      : fabric(std::move(fabric)),
        st(&this->fabric->state()),
        host(host),
        qpn(qpn),
        max_wr(max_wr) {}
  ~FakeQp() override {
    std::lock_guard<std::mutex> lock(st->mu);
    st->qps.erase(qpn);
  }
  uint32_t qp_num() const override { return qpn; }

  absl::Status ToInit(uint8_t p, bool rw) override {
    std::lock_guard<std::mutex> lock(st->mu);
    if (state != QpState::kReset) return Invalid("INIT");
    if (p != 1) return Invalid("INIT");
    port = p;
    remote_write = rw;
    if (rw) st->stats.remote_write_grants++;
    state = QpState::kInit;
    return absl::OkStatus();
  }
  absl::Status ToRtr(const QpPath& p) override {
    std::lock_guard<std::mutex> lock(st->mu);
    if (state != QpState::kInit) return Invalid("RTR");
    if (host->cfg.link == LinkLayer::kEthernet) {
      bool found = false;
      for (const auto& g : host->cfg.gids) found = found || g.index == p.sgid_index;
      if (!found) return Invalid("RTR");  // no such GID index: EINVAL, as the kernel says
      st->stats.last_sgid_index = p.sgid_index;
      st->stats.last_hop_limit = p.hop_limit;
      st->stats.last_traffic_class = p.traffic_class;
    } else if (p.remote_lid == 0) {
      return Invalid("RTR");
    }
    path = p;
    state = QpState::kRtr;
    return absl::OkStatus();
  }
  absl::Status ToRts(uint32_t) override {
    std::lock_guard<std::mutex> lock(st->mu);
    if (state != QpState::kRtr) return Invalid("RTS");
    state = QpState::kRts;
    return absl::OkStatus();
  }
  absl::Status ToError() override {
    std::lock_guard<std::mutex> lock(st->mu);
    state = QpState::kError;
    st->cv.notify_all();
    return absl::OkStatus();
  }

  absl::Status PostWrite(uint64_t wr_id, MemoryRegion& mr, size_t offset, size_t len,
                         uint64_t remote_addr, uint32_t rkey) override {
    std::lock_guard<std::mutex> lock(st->mu);
    // ibv_post_send returns the error (EINVAL: the QP cannot send yet; ENOMEM: queue full). A QP
    // the hardware moved to ERR still takes WRs; they complete as flushed.
    if (state != QpState::kRts && state != QpState::kError) {
      return absl::UnavailableError("ibv_post_send: Invalid argument");
    }
    if (static_cast<int>(sq.size()) >= max_wr) {
      return absl::UnavailableError("ibv_post_send: Cannot allocate memory");
    }
    Wr w;
    w.wr_id = wr_id;
    w.src_key = mr.lkey();
    w.src = mr.data() + offset;
    w.len = len;
    w.remote_addr = remote_addr;
    w.rkey = rkey;
    auto now = Clock::now();
    w.due = now + host->cfg.latency + host->delay_next;
    host->delay_next = std::chrono::milliseconds(0);
    if (host->lose_next) w.due = kNever;
    host->lose_next = false;
    w.fail = host->fail_next;
    host->fail_next = false;
    if (!sq.empty()) w.due = std::max(w.due, sq.back().due);  // in order
    if (st->check_sources) w.src_hash = BlockChecksum(w.src, len);
    sq.push_back(w);
    st->cv.notify_all();
    return absl::OkStatus();
  }

  absl::StatusOr<int> Poll(Completion* out) override {
    std::lock_guard<std::mutex> lock(st->mu);
    st->Process(*this, Clock::now());
    if (cq.empty()) return 0;
    *out = cq.front();
    cq.pop_front();
    return 1;
  }

  bool WaitForCompletion(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(st->mu);
    const auto deadline = Clock::now() + timeout;
    while (true) {
      auto now = Clock::now();
      st->Process(*this, now);
      if (!cq.empty()) return true;
      if (now >= deadline) return false;
      auto until = deadline;
      if (!sq.empty() && sq.front().due != kNever) until = std::min(until, sq.front().due);
      st->cv.wait_until(lock, until);
    }
  }

  static absl::Status Invalid(const char* to) {
    return absl::UnavailableError(absl::StrCat("RDMA QP to ", to, ": Invalid argument"));
  }

  std::shared_ptr<FakeFabric> fabric;
  FakeFabric::State* st;
  HostState* host;
  const uint32_t qpn;
  const int max_wr;
  QpState state = QpState::kReset;
  bool remote_write = false;
  uint8_t port = 0;
  QpPath path;
  std::deque<Wr> sq;
  std::deque<Completion> cq;
};

class FakeContext final : public VerbsContext {
 public:
  FakeContext(std::shared_ptr<FakeFabric> fabric, HostState* host, DeviceInfo info)
      : fabric_(std::move(fabric)), host_(host), info_(std::move(info)) {}
  const DeviceInfo& device() const override { return info_; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(size_t bytes, bool remote_write) override {
    FakeFabric::State& st = fabric_->state();
    size_t size = (bytes + 4095) / 4096 * 4096;
    std::lock_guard<std::mutex> lock(st.mu);
    if (host_->registered + size > host_->cfg.memlock_limit) {
      return absl::ResourceExhaustedError("ibv_reg_mr: Cannot allocate memory (errno 12)");
    }
    st.stats.registrations++;
    if (!host_->fork_init) st.stats.registered_before_fork_init++;
    if (remote_write) st.stats.remote_write_grants++;
    host_->registered += size;
    auto mr = std::make_unique<FakeMr>(&st, host_, size, st.next_key++, remote_write);
    st.mrs[mr->key] = mr.get();
    return mr;
  }

  absl::StatusOr<std::unique_ptr<QueuePair>> CreateQp(int max_send_wr) override {
    FakeFabric::State& st = fabric_->state();
    std::lock_guard<std::mutex> lock(st.mu);
    auto qp = std::make_unique<FakeQp>(fabric_, host_, st.next_qpn++, max_send_wr);
    st.qps[qp->qpn] = qp.get();
    st.stats.qps_created++;
    return qp;
  }

 private:
  std::shared_ptr<FakeFabric> fabric_;
  HostState* host_;
  DeviceInfo info_;
};

class FakeVerbs final : public Verbs {
 public:
  FakeVerbs(std::shared_ptr<FakeFabric> fabric, HostState* host)
      : fabric_(std::move(fabric)), host_(host) {}

  std::vector<DeviceInfo> Devices(std::string* error) override { return {Info()}; }
  absl::StatusOr<std::unique_ptr<VerbsContext>> Open(const std::string& name) override {
    if (name != host_->cfg.device) return absl::UnavailableError("no RDMA device " + name);
    {
      std::lock_guard<std::mutex> lock(fabric_->state().mu);
      fabric_->state().stats.contexts_opened++;
    }
    return std::make_unique<FakeContext>(fabric_, host_, Info());
  }
  std::string ForkInit() override {
    std::lock_guard<std::mutex> lock(fabric_->state().mu);
    host_->fork_init = true;
    fabric_->state().stats.fork_inits++;
    return "";
  }

 private:
  DeviceInfo Info() const {
    DeviceInfo d;
    d.name = host_->cfg.device;
    d.iwarp = host_->cfg.iwarp;
    PortInfo p;
    p.port = 1;
    p.active = host_->cfg.active;
    p.link = host_->cfg.link;
    p.lid = host_->cfg.lid;
    p.mtu = host_->cfg.mtu;
    p.gids = host_->cfg.gids;
    d.ports.push_back(p);
    return d;
  }
  std::shared_ptr<FakeFabric> fabric_;
  HostState* host_;
};

const GidEntry* FindGid(const HostState& h, uint32_t index) {
  for (const auto& g : h.cfg.gids) {
    if (g.index == index) return &g;
  }
  return nullptr;
}

}  // namespace

FakeQp* FakeFabric::State::Route(FakeQp& qp, std::string* error) {
  const QpPath& p = qp.path;
  HostState* target = nullptr;
  if (qp.host->cfg.link == LinkLayer::kEthernet) {
    const GidEntry* sgid = FindGid(*qp.host, p.sgid_index);
    if (sgid == nullptr || (routed && (sgid->type != GidType::kRoceV2 || p.hop_limit < hops))) {
      *error = "transport retry counter exceeded";  // the packets never arrive
      return nullptr;
    }
    for (auto& [name, h] : hosts) {
      if (h->cfg.link != LinkLayer::kEthernet) continue;
      for (const auto& g : h->cfg.gids) {
        if (g.gid == p.remote_gid && g.type == sgid->type) target = h.get();
      }
    }
  } else {
    for (auto& [name, h] : hosts) {
      if (h->cfg.link == LinkLayer::kInfiniBand && h->cfg.lid != 0 && h->cfg.lid == p.remote_lid)
        target = h.get();
    }
  }
  auto it = qps.find(p.remote_qp_num);
  if (target == nullptr || it == qps.end() || it->second->host != target ||
      (it->second->state != QpState::kRtr && it->second->state != QpState::kRts) ||
      it->second->path.remote_qp_num != qp.qpn) {
    *error = "transport retry counter exceeded";
    return nullptr;
  }
  return it->second;
}

bool FakeFabric::State::Execute(FakeQp& qp, Wr& w, std::string* error) {
  if (w.fail) {
    *error = "remote operation error";
    return false;
  }
  auto src = mrs.find(w.src_key);
  if (src == mrs.end()) {
    *error = "local protection error";
    return false;
  }
  FakeQp* target = Route(qp, error);
  if (target == nullptr) return false;
  auto mr = mrs.find(w.rkey);
  if (mr == mrs.end() || mr->second->host != target->host || !mr->second->remote_write ||
      !target->remote_write) {
    *error = "remote access error";
    return false;
  }
  const char* base = mr->second->mem;
  const auto addr = reinterpret_cast<const char*>(w.remote_addr);
  if (addr < base || addr + w.len > base + mr->second->size_) {
    *error = "remote access error";
    return false;
  }
  if (check_sources && BlockChecksum(w.src, w.len) != w.src_hash) stats.source_changed_in_flight++;
  std::memcpy(mr->second->mem + (addr - base), w.src, w.len);
  stats.writes++;
  return true;
}

void FakeFabric::State::Process(FakeQp& qp, Clock::time_point now) {
  while (!qp.sq.empty() && (qp.state == QpState::kError || qp.sq.front().due <= now)) {
    Wr w = qp.sq.front();
    qp.sq.pop_front();
    Completion c;
    c.wr_id = w.wr_id;
    if (qp.state == QpState::kError) {
      c.flushed = true;
      c.status = "Work Request Flushed Error";
      stats.flushed++;
    } else {
      std::string error;
      c.ok = Execute(qp, w, &error);
      c.status = c.ok ? "success" : error;
      if (!c.ok) {
        stats.failed_writes++;
        qp.state = QpState::kError;  // an error completion takes the QP down
      }
    }
    qp.cq.push_back(c);
  }
}

std::vector<GidEntry> MlxStyleGidTable(const std::string& ipv4) {
  Gid link_local{};
  link_local[0] = 0xfe;
  link_local[1] = 0x80;
  link_local[15] = static_cast<uint8_t>(std::hash<std::string>{}(ipv4) | 1);
  Gid mapped = Ipv4MappedGid(ipv4).value_or(Gid{});
  return {{0, link_local, GidType::kRoceV1},
          {1, link_local, GidType::kRoceV2},
          {2, mapped, GidType::kRoceV1},
          {3, mapped, GidType::kRoceV2}};
}

FakeFabric::FakeFabric(bool routed, uint8_t hops) : state_(std::make_unique<State>()) {
  state_->routed = routed;
  state_->hops = hops;
}
FakeFabric::~FakeFabric() = default;

std::shared_ptr<FakeFabric> FakeFabric::Create(bool routed, uint8_t hops) {
  return std::shared_ptr<FakeFabric>(new FakeFabric(routed, hops));
}

std::shared_ptr<Verbs> FakeFabric::AddHost(const FakeHostConfig& config) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto host = std::make_unique<HostState>();
  host->cfg = config;
  HostState* h = host.get();
  state_->hosts[config.device] = std::move(host);
  return std::make_shared<FakeVerbs>(shared_from_this(), h);
}

FakeFabricStats FakeFabric::stats() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

void FakeFabric::Flap() {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (auto& [n, qp] : state_->qps) qp->state = QpState::kError;
  state_->cv.notify_all();
}

void FakeFabric::SetCheckSources(bool check) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->check_sources = check;
}

void FakeFabric::DelayNextWrite(const std::string& device, std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->hosts.at(device)->delay_next = delay;
}
void FakeFabric::LoseNextCompletion(const std::string& device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->hosts.at(device)->lose_next = true;
}
void FakeFabric::FailNextWrite(const std::string& device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->hosts.at(device)->fail_next = true;
}
size_t FakeFabric::Registered(const std::string& device) {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->hosts.at(device)->registered;
}

}  // namespace ember::transport
