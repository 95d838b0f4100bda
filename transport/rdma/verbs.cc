#include "transport/rdma/verbs.h"

#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ember::transport {

std::vector<RdmaDeviceInfo> ProbeRdmaDevices(std::string* error) {
  std::vector<RdmaDeviceInfo> out;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    *error = absl::StrCat("ibv_get_device_list: ", strerror(errno));
    return out;
  }
  for (int i = 0; i < n; i++) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) continue;
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) == 0) {
      for (uint8_t p = 1; p <= attr.phys_port_cnt; p++) {
        ibv_port_attr pa{};
        if (ibv_query_port(ctx, p, &pa) != 0) continue;
        RdmaDeviceInfo d;
        d.name = ibv_get_device_name(list[i]);
        d.port = p;
        d.active = pa.state == IBV_PORT_ACTIVE;
        d.ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        out.push_back(d);
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  if (out.empty() && error->empty()) *error = "no RDMA devices";
  return out;
}

std::optional<RdmaDeviceInfo> ChooseRdmaDevice(const std::vector<RdmaDeviceInfo>& devices,
                                               std::string* why) {
  for (const auto& d : devices) {
    if (d.active) {
      *why = absl::StrCat("RDMA device ", d.name, " port ", d.port, " is active (",
                          d.ethernet ? "RoCE" : "InfiniBand", ")");
      return d;
    }
  }
  *why = devices.empty() ? "no RDMA device found"
                         : absl::StrCat(devices.size(), " RDMA port(s) found, none active");
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<RdmaEndpoint>> RdmaEndpoint::Create(const RdmaDeviceInfo& device,
                                                                   size_t buffer_bytes) {
  std::unique_ptr<RdmaEndpoint> e(new RdmaEndpoint());
  e->device_ = device;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list != nullptr && i < n && e->ctx_ == nullptr; i++) {
    if (device.name == ibv_get_device_name(list[i])) e->ctx_ = ibv_open_device(list[i]);
  }
  if (list != nullptr) ibv_free_device_list(list);
  if (e->ctx_ == nullptr) return absl::UnavailableError("cannot open RDMA device " + device.name);
  e->pd_ = ibv_alloc_pd(e->ctx_);
  e->cq_ = e->pd_ ? ibv_create_cq(e->ctx_, 16, nullptr, nullptr, 0) : nullptr;
  if (e->cq_ == nullptr) return absl::UnavailableError("cannot create RDMA PD/CQ");
  e->size_ = buffer_bytes;
  e->buffer_.reset(new char[buffer_bytes]);
  e->mr_ = ibv_reg_mr(e->pd_, e->buffer_.get(), buffer_bytes,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (e->mr_ == nullptr) return absl::UnavailableError("cannot register RDMA buffer");
  ibv_qp_init_attr qa{};
  qa.send_cq = e->cq_;
  qa.recv_cq = e->cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = 8;
  qa.cap.max_recv_wr = 1;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  e->qp_ = ibv_create_qp(e->pd_, &qa);
  if (e->qp_ == nullptr) return absl::UnavailableError("cannot create RDMA queue pair");
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.pkey_index = 0;
  init.port_num = device.port;
  init.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(e->qp_, &init,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    return absl::UnavailableError("cannot move RDMA queue pair to INIT");
  }
  ibv_port_attr pa{};
  ibv_query_port(e->ctx_, device.port, &pa);
  e->local_.qp_num = e->qp_->qp_num;
  e->local_.lid = pa.lid;
  if (device.ethernet) {
    ibv_gid gid{};
    ibv_query_gid(e->ctx_, device.port, 0, &gid);
    std::memcpy(e->local_.gid.data(), gid.raw, 16);
  }
  e->local_.psn = std::random_device()() & 0xffffff;
  e->local_.addr = reinterpret_cast<uint64_t>(e->buffer_.get());
  e->local_.rkey = e->mr_->rkey;
  e->local_.mtu = pa.active_mtu;
  return e;
}

RdmaEndpoint::~RdmaEndpoint() {
  if (qp_) ibv_destroy_qp(qp_);
  if (mr_) ibv_dereg_mr(mr_);
  if (cq_) ibv_destroy_cq(cq_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
}

absl::Status RdmaEndpoint::Connect(const QpInfo& remote) {
  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = static_cast<ibv_mtu>(std::min(remote.mtu, local_.mtu));
  rtr.dest_qp_num = remote.qp_num;
  rtr.rq_psn = remote.psn;
  rtr.max_dest_rd_atomic = 1;
  rtr.min_rnr_timer = 12;
  rtr.ah_attr.port_num = device_.port;
  rtr.ah_attr.dlid = remote.lid;
  if (device_.ethernet) {
    rtr.ah_attr.is_global = 1;
    std::memcpy(rtr.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
    rtr.ah_attr.grh.hop_limit = 1;
    rtr.ah_attr.grh.sgid_index = 0;
  }
  if (ibv_modify_qp(qp_, &rtr,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    return absl::UnavailableError(absl::StrCat("RDMA QP to RTR: ", strerror(errno)));
  }
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = 14;
  rts.retry_cnt = 7;
  rts.rnr_retry = 7;
  rts.sq_psn = local_.psn;
  rts.max_rd_atomic = 1;
  if (ibv_modify_qp(qp_, &rts,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    return absl::UnavailableError(absl::StrCat("RDMA QP to RTS: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status RdmaEndpoint::WriteTo(size_t len, uint64_t remote_addr, uint32_t rkey,
                                   std::chrono::milliseconds timeout) {
  if (len > size_) return absl::InvalidArgumentError("RDMA write larger than the buffer");
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(buffer_.get());
  sge.length = static_cast<uint32_t>(len);
  sge.lkey = mr_->lkey;
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = next_wr_++;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  if (ibv_post_send(qp_, &wr, &bad) != 0) {
    return absl::UnavailableError(absl::StrCat("RDMA post: ", strerror(errno)));
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    ibv_wc wc{};
    int n = ibv_poll_cq(cq_, 1, &wc);
    if (n < 0) return absl::UnavailableError("RDMA poll failed");
    if (n == 1) {
      if (wc.status != IBV_WC_SUCCESS) {
        return absl::UnavailableError(absl::StrCat("RDMA write: ", ibv_wc_status_str(wc.status)));
      }
      return absl::OkStatus();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::UnavailableError("RDMA write timed out");
    }
    std::this_thread::yield();
  }
}

}  // namespace ember::transport
