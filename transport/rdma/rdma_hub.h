// Internal to transport/rdma/: what the RDMA client transport and the server's responder share
// per process (RdmaHub: one context per device, the registered buffer pools, the probed devices)
// and the steps of a queue pair's setup and completion wait both sides take. rdma.h is the front
// door; this header is for rdma_transport.cc and rdma_hub.cc only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/block_transport.h"
#include "transport/rdma/rdma.h"
#include "transport/rdma/verbs.h"
#include "transport/wire.h"

namespace ember::transport {

inline constexpr size_t kMinBuffer = 1u << 20;  // buffers come in powers of two from 1 MiB
inline constexpr int kMaxSendWr = 4;
inline constexpr auto kSpin = std::chrono::microseconds(50);  // poll this long before sleeping
inline constexpr auto kDrainWait = std::chrono::milliseconds(1000);  // for a flush after ERR

// The buffer size class for `len` bytes: a power of two from kMinBuffer.
size_t SizeClass(size_t len);
uint32_t RandomPsn();

// Registered buffers of one kind on one context, bounded by `budget` bytes. Thread-safe.
class BufferPool {
 public:
  BufferPool(VerbsContext* ctx, bool remote_write, size_t budget)
      : ctx_(ctx), remote_write_(remote_write), budget_(budget) {}

  // A buffer of at least `len` bytes, waiting up to `wait` for one to come back when the budget
  // is spent. Returns: ResourceExhausted (budget spent, or the locked-memory limit, named).
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Acquire(size_t len, std::chrono::milliseconds wait)
      ABSL_LOCKS_EXCLUDED(mu_) {
    const size_t size = SizeClass(len);
    if (size > budget_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a ", size >> 20, " MiB RDMA buffer is over --rdma-memory (", budget_ >> 20, " MiB)"));
    }
    const absl::Time deadline = absl::Now() + absl::FromChrono(wait);
    absl::MutexLock lock(&mu_);
    while (true) {
      auto& free = free_[size];
      if (!free.empty()) {
        auto mr = std::move(free.back());
        free.pop_back();
        return mr;
      }
      // Room for a new one, after giving back idle buffers of other sizes if need be.
      for (auto& [s, v] : free_) {
        while (registered_ + size > budget_ && !v.empty()) {
          registered_ -= v.back()->size();
          v.pop_back();
        }
      }
      if (registered_ + size <= budget_) {
        registered_ += size;
        registrations_++;
        mu_.Unlock();
        auto mr = ctx_->Register(size, remote_write_);
        mu_.Lock();
        if (mr.ok()) return mr;
        registered_ -= size;
        if (absl::IsResourceExhausted(mr.status())) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "cannot register ", size >> 20, " MiB of RDMA memory (", mr.status().message(),
              "): raise RLIMIT_MEMLOCK (ulimit -l; systemd LimitMEMLOCK=infinity) or lower "
              "--rdma-memory"));
        }
        return mr.status();
      }
      if (mu_.AwaitWithDeadline(absl::Condition(this, &BufferPool::AnyFree), deadline)) continue;
      return absl::ResourceExhaustedError(
          absl::StrCat("RDMA buffers all in use (", budget_ >> 20, " MiB, --rdma-memory)"));
    }
  }

  void Release(std::unique_ptr<MemoryRegion> mr) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    free_[mr->size()].push_back(std::move(mr));
  }

  // A WRITE from a buffer was never drained (its owner keeps it until its QP is destroyed).
  void CountQuarantined() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    quarantined_++;
  }

  void AddStats(RdmaHubStats* s) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    s->registered_bytes += registered_;
    s->registrations += registrations_;
    s->quarantined += quarantined_;
  }

 private:
  bool AnyFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [s, v] : free_) {
      if (!v.empty()) return true;
    }
    return false;
  }

  VerbsContext* const ctx_;
  const bool remote_write_;
  const size_t budget_;
  absl::Mutex mu_;
  std::map<size_t, std::vector<std::unique_ptr<MemoryRegion>>> free_ ABSL_GUARDED_BY(mu_);
  uint64_t quarantined_ ABSL_GUARDED_BY(mu_) = 0;
  size_t registered_ ABSL_GUARDED_BY(mu_) = 0;  // free and lent
  uint64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
};

// Waits for the completion of `wr_id` on `qp` until `deadline`: polls for kSpin, then sleeps on
// the completion channel. Returns: the completion, or nullopt at the deadline.
std::optional<Completion> AwaitCompletion(QueuePair& qp, uint64_t wr_id,
                                          std::chrono::steady_clock::time_point deadline);

// One process's RDMA state (rdma.h). Thread-safe.
class RdmaHub {
 public:
  // Calls ibv_fork_init (through the seam) before anything is registered: the agent forks
  // fusermount3.
  RdmaHub(std::shared_ptr<Verbs> verbs, const TransportOptions& options,
          std::vector<DeviceInfo> devices);

  const TransportOptions& options() const { return options_; }

  // The port for a connection whose local address is `local_ip`. Returns: FailedPrecondition.
  // The port for a connection whose local address is `local_ip`, from device tables at most
  // kReprobe old (GID indices move when addresses or VLANs change, LIDs when the subnet manager
  // reassigns them). Returns: FailedPrecondition.
  absl::StatusOr<PortChoice> Choose(const std::string& local_ip) ABSL_LOCKS_EXCLUDED(mu_);

  struct Device {
    std::unique_ptr<VerbsContext> ctx;
    std::unique_ptr<BufferPool> client_pool;  // targets of peers' writes
    std::unique_ptr<BufferPool> server_pool;  // sources of this node's writes: no remote access
  };
  // The device's one context and its pools, opened on first use.
  absl::StatusOr<Device*> Open(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = devices_open_.find(name);
    if (it != devices_open_.end()) return it->second.get();
    auto ctx = verbs_->Open(name);
    if (!ctx.ok()) return ctx.status();
    auto d = std::make_unique<Device>();
    d->ctx = std::move(*ctx);
    d->client_pool = std::make_unique<BufferPool>(d->ctx.get(), true, options_.rdma_memory);
    d->server_pool = std::make_unique<BufferPool>(d->ctx.get(), false, options_.rdma_memory);
    contexts_opened_++;
    return devices_open_.emplace(name, std::move(d)).first->second.get();
  }

  void CountSession() { sessions_opened_++; }
  void CountFallback() { tcp_fallbacks_++; }
  void NoteError(const std::string& e) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    last_error_ = e;
  }

  RdmaHubStats Stats() ABSL_LOCKS_EXCLUDED(mu_) {
    RdmaHubStats s;
    s.sessions_opened = sessions_opened_;
    s.tcp_fallbacks = tcp_fallbacks_;
    absl::MutexLock lock(&mu_);
    s.contexts_opened = contexts_opened_;
    s.last_error = last_error_;
    for (auto& [name, d] : devices_open_) {
      d->client_pool->AddStats(&s);
      d->server_pool->AddStats(&s);
    }
    return s;
  }

 private:
  const std::shared_ptr<Verbs> verbs_;
  const TransportOptions options_;
  std::vector<DeviceInfo> devices_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point probed_ ABSL_GUARDED_BY(mu_);
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Device>> devices_open_ ABSL_GUARDED_BY(mu_);
  uint64_t contexts_opened_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> sessions_opened_{0};
  std::atomic<uint64_t> tcp_fallbacks_{0};
};

// This side's QpInfo for a QP set up on port choice `c`.
QpInfo LocalQpInfo(const QueuePair& qp, const PortChoice& c, uint32_t psn);
// Checks the other side's parameters against this side's port. Returns: FailedPrecondition.
absl::Status CheckRemote(const QpInfo& remote, const PortChoice& c);
// Moves a QP in INIT to RTS against `remote`.
absl::Status Connect(QueuePair& qp, const PortChoice& c, const QpInfo& remote, uint32_t psn,
                     uint8_t traffic_class);
// The process's hub on the system's verbs (libibverbs), made once; null with why when none.
std::shared_ptr<RdmaHub> SystemHub(const TransportOptions& options, std::string* why);

}  // namespace ember::transport
