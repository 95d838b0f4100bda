// The verbs seam of transport/rdma/: the few verbs operations the RDMA transport makes, behind a
// narrow interface, so the transport's sessions, pools, fallback and recovery run the same code
// against libibverbs (verbs_ibv.cc, the one file that includes <infiniband/verbs.h>) and against a
// faithful fake device in tests (fake_verbs.h). Internal to transport/rdma/ (and its tests).
//
// The names follow verbs: a Verbs lists devices and opens one (ibv_open_device + ibv_alloc_pd:
// a VerbsContext, one per process and device); a context registers page-aligned memory
// (ibv_reg_mr: a MemoryRegion) and creates reliable-connected queue pairs, each with its own
// completion queue and completion channel (a QueuePair). Semantics the transport relies on, and
// the fake keeps: a WRITE posted before RTS fails (in ERR it completes as flushed); completions
// come in posting order with
// the wr_id they were posted with; an error completion moves the QP to ERR and every WR after it
// completes as flushed; a QP moved to ERR flushes what is outstanding; registration fails beyond
// the locked-memory limit; a WRITE needs the target's rkey, bounds and REMOTE_WRITE.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::transport {

using Gid = std::array<uint8_t, 16>;

enum class LinkLayer : uint8_t { kUnknown = 0, kInfiniBand = 1, kEthernet = 2 };
enum class GidType : uint8_t { kIb = 0, kRoceV1 = 1, kRoceV2 = 2 };
const char* LinkLayerName(LinkLayer l);

struct GidEntry {
  uint32_t index = 0;
  Gid gid{};
  GidType type = GidType::kIb;
};

struct PortInfo {
  uint8_t port = 1;
  bool active = false;  // IBV_PORT_ACTIVE
  LinkLayer link = LinkLayer::kUnknown;
  uint16_t lid = 0;            // InfiniBand only
  uint32_t mtu = 0;            // the active MTU, enum ibv_mtu (1 = 256 ... 5 = 4096)
  std::vector<GidEntry> gids;  // the valid entries of the GID table
};

struct DeviceInfo {
  std::string name;
  bool iwarp = false;  // iWARP RNICs speak another connection model: never chosen
  std::vector<PortInfo> ports;
};

// Where a queue pair sends: what ibv_modify_qp(RTR) needs.
struct QpPath {
  uint8_t port = 1;
  LinkLayer link = LinkLayer::kUnknown;
  uint32_t mtu = 0;  // enum ibv_mtu
  uint32_t remote_qp_num = 0;
  uint32_t remote_psn = 0;
  uint16_t remote_lid = 0;  // InfiniBand
  Gid remote_gid{};         // RoCE: the GRH's destination
  uint8_t sgid_index = 0;   // RoCE: this side's GID
  uint8_t hop_limit = 64;
  uint8_t traffic_class = 0;
};

enum class QpState : uint8_t { kReset, kInit, kRtr, kRts, kError };

struct Completion {
  uint64_t wr_id = 0;
  bool ok = false;
  bool flushed = false;  // completed in error because the QP was (or went) in ERR
  std::string status;    // ibv_wc_status_str
};

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;  // deregisters and frees the memory
  virtual char* data() = 0;
  virtual size_t size() const = 0;
  virtual uint32_t lkey() const = 0;
  virtual uint32_t rkey() const = 0;
};

// Not thread-safe: one user at a time (a session).
class QueuePair {
 public:
  virtual ~QueuePair() = default;  // destroys the QP, its CQ and channel
  virtual uint32_t qp_num() const = 0;
  // RESET -> INIT on `port`; `remote_write`: peers may RDMA-WRITE into this side's memory.
  virtual absl::Status ToInit(uint8_t port, bool remote_write) = 0;
  virtual absl::Status ToRtr(const QpPath& path) = 0;
  virtual absl::Status ToRts(uint32_t psn) = 0;
  // Any state -> ERR: outstanding WRs complete as flushed.
  virtual absl::Status ToError() = 0;
  // Posts a signaled RDMA WRITE of mr[offset, offset+len) to (remote_addr, rkey).
  // Returns: Unavailable with ibv_post_send's error (e.g. the QP is not in RTS yet).
  virtual absl::Status PostWrite(uint64_t wr_id, MemoryRegion& mr, size_t offset, size_t len,
                                 uint64_t remote_addr, uint32_t rkey) = 0;
  // Takes up to one completion. Returns: 1, 0 (none yet) or Unavailable.
  virtual absl::StatusOr<int> Poll(Completion* out) = 0;
  // Sleeps on the completion channel until a completion may be there or `timeout` passes:
  // arms the CQ, then re-polls before sleeping (a completion that came in between is not lost).
  // Returns: whether one is ready to Poll.
  virtual bool WaitForCompletion(std::chrono::milliseconds timeout) = 0;
};

// One opened device and its protection domain. Thread-safe.
class VerbsContext {
 public:
  virtual ~VerbsContext() = default;
  virtual const DeviceInfo& device() const = 0;
  // Allocates `bytes` of page-aligned memory and registers it; `remote_write`: peers may write
  // into it (implies local write). Returns: ResourceExhausted naming RLIMIT_MEMLOCK when the
  // locked-memory limit refuses it; Unavailable otherwise.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(size_t bytes,
                                                                 bool remote_write) = 0;
  // An RC queue pair in RESET with room for `max_send_wr` outstanding WRs.
  virtual absl::StatusOr<std::unique_ptr<QueuePair>> CreateQp(int max_send_wr) = 0;
};

// The verbs library. Thread-safe.
class Verbs {
 public:
  virtual ~Verbs() = default;
  // Every device with its ports and GID tables. `error` says why the list is empty, if it is.
  virtual std::vector<DeviceInfo> Devices(std::string* error) = 0;
  // Returns: Unavailable with the open error's errno text (e.g. a device cgroup refusing it).
  virtual absl::StatusOr<std::unique_ptr<VerbsContext>> Open(const std::string& name) = 0;
  // Makes registered memory fork-safe (ibv_fork_init) before any registration: the agent forks
  // fusermount3. Returns: a warning to log, or empty.
  virtual std::string ForkInit() = 0;
};

// libibverbs, or nullptr (with why) when RDMA is not built in.
std::shared_ptr<Verbs> SystemVerbs(std::string* why);

// ---- choices, pure functions of what Devices() reports ----

// A port that can carry a session whose control connection's local address is `local_ipv4`
// (dotted, may be empty): RoCE ports with a RoCE v2 GID for that address first, then any other
// RoCE port with a RoCE v2 IPv4 GID, then InfiniBand ports with a LID. iWARP, inactive ports,
// zero GIDs and LID 0 are never chosen. `why` says which and why, or why none.
struct PortChoice {
  std::string device;
  PortInfo port;
  uint8_t gid_index = 0;  // RoCE
  Gid gid{};              // RoCE: the chosen GID; InfiniBand: the port's first GID
};
std::optional<PortChoice> ChoosePort(const std::vector<DeviceInfo>& devices,
                                     const std::string& local_ipv4, std::string* why);

// The IPv4-mapped GID (::ffff:a.b.c.d) of an address, or nullopt.
std::optional<Gid> Ipv4MappedGid(const std::string& ipv4);
bool IsZeroGid(const Gid& g);

}  // namespace ember::transport
