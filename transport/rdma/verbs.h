// The libibverbs layer of transport/rdma/: device discovery and choice, and one reliable-connected
// queue pair with a registered buffer. Every verbs call in Ember is in verbs.cc. Internal to
// transport/rdma/ (and its test).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/wire.h"

struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_qp;
struct ibv_mr;

namespace ember::transport {

struct RdmaDeviceInfo {
  std::string name;
  uint8_t port = 1;
  bool active = false;    // port state ACTIVE
  bool ethernet = false;  // RoCE (needs a GID) rather than InfiniBand (LID)
};

// Every device and port libibverbs sees. `error` says why the list is empty, if it is.
std::vector<RdmaDeviceInfo> ProbeRdmaDevices(std::string* error);
// The first device with an active port. `why` explains the choice or its absence.
std::optional<RdmaDeviceInfo> ChooseRdmaDevice(const std::vector<RdmaDeviceInfo>& devices,
                                               std::string* why);

// One RC queue pair, its completion queue and a registered buffer. Not thread-safe: one user.
class RdmaEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<RdmaEndpoint>> Create(const RdmaDeviceInfo& device,
                                                              size_t buffer_bytes);
  ~RdmaEndpoint();
  QpInfo local() const { return local_; }
  // Moves the QP to RTS against the remote's parameters.
  absl::Status Connect(const QpInfo& remote);
  char* buffer() { return buffer_.get(); }
  size_t buffer_size() const { return size_; }
  // RDMA-WRITEs buffer()[0, len) to (remote_addr, rkey) and waits for its completion.
  absl::Status WriteTo(size_t len, uint64_t remote_addr, uint32_t rkey,
                       std::chrono::milliseconds timeout);

 private:
  RdmaEndpoint() = default;
  RdmaDeviceInfo device_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::unique_ptr<char[]> buffer_;
  size_t size_ = 0;
  QpInfo local_;
  uint64_t next_wr_ = 1;
};

}  // namespace ember::transport
