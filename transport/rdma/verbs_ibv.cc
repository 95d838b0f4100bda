// libibverbs behind the verbs seam (verbs.h): the only file in Ember that includes
// <infiniband/verbs.h>. Built with cmake -DEMBER_RDMA=ON (the default).
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "transport/rdma/verbs.h"

namespace ember::transport {
namespace {

constexpr size_t kPage = 4096;

std::string Errno(int e) { return absl::StrCat(strerror(e), " (errno ", e, ")"); }

class IbvMemoryRegion final : public MemoryRegion {
 public:
  IbvMemoryRegion(ibv_mr* mr, char* mem, size_t size) : mr_(mr), mem_(mem), size_(size) {}
  ~IbvMemoryRegion() override {
    // Memory still registered must not be handed to anyone else: leak it if that fails.
    if (ibv_dereg_mr(mr_) == 0) free(mem_);
  }
  char* data() override { return mem_; }
  size_t size() const override { return size_; }
  uint32_t lkey() const override { return mr_->lkey; }
  uint32_t rkey() const override { return mr_->rkey; }

 private:
  ibv_mr* mr_;
  char* mem_;
  size_t size_;
};

class IbvQueuePair final : public QueuePair {
 public:
  IbvQueuePair(ibv_comp_channel* channel, ibv_cq* cq, ibv_qp* qp)
      : channel_(channel), cq_(cq), qp_(qp) {}
  ~IbvQueuePair() override {
    ibv_destroy_qp(qp_);
    if (unacked_ > 0) ibv_ack_cq_events(cq_, unacked_);
    ibv_destroy_cq(cq_);
    ibv_destroy_comp_channel(channel_);
  }
  uint32_t qp_num() const override { return qp_->qp_num; }

  absl::Status ToInit(uint8_t port, bool remote_write) override {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = port;
    a.qp_access_flags = remote_write ? IBV_ACCESS_REMOTE_WRITE : 0;
    return Modify(&a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
  }

  absl::Status ToRtr(const QpPath& p) override {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(p.mtu);
    a.dest_qp_num = p.remote_qp_num;
    a.rq_psn = p.remote_psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = p.port;
    if (p.link == LinkLayer::kEthernet) {  // RoCE: routed by the GRH, never by LID
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, p.remote_gid.data(), 16);
      a.ah_attr.grh.sgid_index = p.sgid_index;
      a.ah_attr.grh.hop_limit = p.hop_limit;
      a.ah_attr.grh.traffic_class = p.traffic_class;
    } else {
      a.ah_attr.dlid = p.remote_lid;
    }
    return Modify(&a,
                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                  "RTR");
  }

  absl::Status ToRts(uint32_t psn) override {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;  // 4.096 us * 2^14 = 67 ms per try
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = psn;
    a.max_rd_atomic = 1;
    return Modify(&a,
                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                  "RTS");
  }

  absl::Status ToError() override {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    return Modify(&a, IBV_QP_STATE, "ERR");
  }

  absl::Status PostWrite(uint64_t wr_id, MemoryRegion& mr, size_t offset, size_t len,
                         uint64_t remote_addr, uint32_t rkey) override {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uint64_t>(mr.data() + offset);
    sge.length = static_cast<uint32_t>(len);
    sge.lkey = mr.lkey();
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    int rc = ibv_post_send(qp_, &wr, &bad);  // returns the error; errno is not set
    if (rc != 0) return absl::UnavailableError(absl::StrCat("ibv_post_send: ", Errno(rc)));
    return absl::OkStatus();
  }

  absl::StatusOr<int> Poll(Completion* out) override {
    if (pending_) {  // peeked by WaitForCompletion
      *out = kept_;
      pending_ = false;
      return 1;
    }
    ibv_wc wc{};
    int n = ibv_poll_cq(cq_, 1, &wc);
    if (n < 0) return absl::UnavailableError("ibv_poll_cq failed");
    if (n == 0) return 0;
    out->wr_id = wc.wr_id;
    out->ok = wc.status == IBV_WC_SUCCESS;
    out->flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
    out->status = ibv_wc_status_str(wc.status);
    return 1;
  }

  bool WaitForCompletion(std::chrono::milliseconds timeout) override {
    if (pending_) return true;
    if (ibv_req_notify_cq(cq_, 0) != 0) return false;
    ibv_wc wc{};
    // A completion that arrived before the arm raises no event: look once more first. Peeking
    // consumes it, so keep it for the next Poll.
    int n = ibv_poll_cq(cq_, 1, &wc);
    if (n != 0) {
      if (n > 0) Keep(wc);
      return true;
    }
    pollfd p{channel_->fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    if (ibv_get_cq_event(channel_, &ev_cq, &ev_ctx) == 0) {
      // Acked in batches (ibv_ack_cq_events takes a mutex); all before the CQ is destroyed.
      if (++unacked_ >= 64) {
        ibv_ack_cq_events(cq_, unacked_);
        unacked_ = 0;
      }
    }
    return true;
  }

 private:
  absl::Status Modify(ibv_qp_attr* a, int mask, const char* to) {
    int rc = ibv_modify_qp(qp_, a, mask);
    if (rc != 0) return absl::UnavailableError(absl::StrCat("RDMA QP to ", to, ": ", Errno(rc)));
    return absl::OkStatus();
  }
  void Keep(const ibv_wc& wc) {
    pending_ = true;
    kept_.wr_id = wc.wr_id;
    kept_.ok = wc.status == IBV_WC_SUCCESS;
    kept_.flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
    kept_.status = ibv_wc_status_str(wc.status);
  }

 private:
  ibv_comp_channel* channel_;
  ibv_cq* cq_;
  ibv_qp* qp_;
  unsigned unacked_ = 0;
  bool pending_ = false;
  Completion kept_;
};

class IbvContext final : public VerbsContext {
 public:
  IbvContext(ibv_context* ctx, ibv_pd* pd, DeviceInfo info)
      : ctx_(ctx), pd_(pd), info_(std::move(info)) {}
  ~IbvContext() override {
    ibv_dealloc_pd(pd_);
    ibv_close_device(ctx_);
  }
  const DeviceInfo& device() const override { return info_; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(size_t bytes, bool remote_write) override {
    size_t size = (bytes + kPage - 1) / kPage * kPage;
    char* mem = static_cast<char*>(aligned_alloc(kPage, size));
    if (mem == nullptr) return absl::ResourceExhaustedError("out of memory for an RDMA buffer");
    int access = IBV_ACCESS_LOCAL_WRITE | (remote_write ? IBV_ACCESS_REMOTE_WRITE : 0);
    ibv_mr* mr = ibv_reg_mr(pd_, mem, size, access);
    if (mr == nullptr) {
      int e = errno;
      free(mem);
      if (e == ENOMEM || e == EPERM || e == EAGAIN) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot register ", size, " bytes of RDMA memory: ", Errno(e),
            "; raise RLIMIT_MEMLOCK (ulimit -l, systemd LimitMEMLOCK=infinity) or lower "
            "--rdma-memory"));
      }
      return absl::UnavailableError(absl::StrCat("ibv_reg_mr: ", Errno(e)));
    }
    return std::make_unique<IbvMemoryRegion>(mr, mem, size);
  }

  absl::StatusOr<std::unique_ptr<QueuePair>> CreateQp(int max_send_wr) override {
    ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
    if (ch == nullptr) return absl::UnavailableError("ibv_create_comp_channel: " + Errno(errno));
    ibv_cq* cq = ibv_create_cq(ctx_, max_send_wr + 1, nullptr, ch, 0);
    if (cq == nullptr) {
      int e = errno;
      ibv_destroy_comp_channel(ch);
      return absl::UnavailableError("ibv_create_cq: " + Errno(e));
    }
    ibv_qp_init_attr qa{};
    qa.send_cq = cq;
    qa.recv_cq = cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = max_send_wr;
    qa.cap.max_recv_wr = 1;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd_, &qa);
    if (qp == nullptr) {
      int e = errno;
      ibv_destroy_cq(cq);
      ibv_destroy_comp_channel(ch);
      return absl::UnavailableError("ibv_create_qp: " + Errno(e));
    }
    return std::make_unique<IbvQueuePair>(ch, cq, qp);
  }

 private:
  ibv_context* ctx_;
  ibv_pd* pd_;
  DeviceInfo info_;
};

LinkLayer FromIbv(uint8_t l) {
  switch (l) {
    case IBV_LINK_LAYER_INFINIBAND:
      return LinkLayer::kInfiniBand;
    case IBV_LINK_LAYER_ETHERNET:
      return LinkLayer::kEthernet;
    default:
      // Old drivers report "unspecified" for InfiniBand.
      return LinkLayer::kInfiniBand;
  }
}

// Device, ports and GID tables of an opened context. Return codes checked: a port or GID entry
// that cannot be read is left out (and said in `error`).
DeviceInfo Describe(ibv_device* dev, ibv_context* ctx, std::string* error) {
  DeviceInfo d;
  d.name = ibv_get_device_name(dev);
  d.iwarp = dev->transport_type == IBV_TRANSPORT_IWARP;
  ibv_device_attr attr{};
  int rc = ibv_query_device(ctx, &attr);
  if (rc != 0) {
    absl::StrAppend(error, d.name, ": ibv_query_device: ", Errno(rc), "; ");
    return d;
  }
  for (uint8_t p = 1; p <= attr.phys_port_cnt; p++) {
    ibv_port_attr pa{};
    rc = ibv_query_port(ctx, p, &pa);
    if (rc != 0) {
      absl::StrAppend(error, d.name, " port ", p, ": ibv_query_port: ", Errno(rc), "; ");
      continue;
    }
    PortInfo port;
    port.port = p;
    port.active = pa.state == IBV_PORT_ACTIVE;
    port.link = FromIbv(pa.link_layer);
    port.lid = pa.lid;
    port.mtu = pa.active_mtu;
    for (int i = 0; i < pa.gid_tbl_len; i++) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(ctx, p, i, &e, 0) != 0) continue;  // an empty slot: ENODATA
      GidEntry g;
      g.index = e.gid_index;
      std::memcpy(g.gid.data(), e.gid.raw, 16);
      g.type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? GidType::kRoceV2
               : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? GidType::kRoceV1
                                                    : GidType::kIb;
      if (!IsZeroGid(g.gid)) port.gids.push_back(g);
    }
    d.ports.push_back(std::move(port));
  }
  return d;
}

class IbvVerbs final : public Verbs {
 public:
  std::vector<DeviceInfo> Devices(std::string* error) override {
    std::vector<DeviceInfo> out;
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr) {
      *error = absl::StrCat("ibv_get_device_list: ", Errno(errno));
      return out;
    }
    for (int i = 0; i < n; i++) {
      ibv_context* ctx = ibv_open_device(list[i]);
      if (ctx == nullptr) {
        absl::StrAppend(error, ibv_get_device_name(list[i]), ": ibv_open_device: ", Errno(errno),
                        " (a device cgroup must allow char-infiniband_verbs); ");
        continue;
      }
      out.push_back(Describe(list[i], ctx, error));
      ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    if (out.empty() && error->empty()) *error = "no RDMA devices";
    return out;
  }

  absl::StatusOr<std::unique_ptr<VerbsContext>> Open(const std::string& name) override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr) return absl::UnavailableError("ibv_get_device_list: " + Errno(errno));
    std::unique_ptr<VerbsContext> out;
    std::string error;
    for (int i = 0; i < n && !out; i++) {
      if (name != ibv_get_device_name(list[i])) continue;
      ibv_context* ctx = ibv_open_device(list[i]);
      if (ctx == nullptr) {
        error = absl::StrCat("ibv_open_device ", name, ": ", Errno(errno));
        break;
      }
      std::string describe_error;
      DeviceInfo info = Describe(list[i], ctx, &describe_error);
      ibv_pd* pd = ibv_alloc_pd(ctx);
      if (pd == nullptr) {
        error = absl::StrCat("ibv_alloc_pd ", name, ": ", Errno(errno));
        ibv_close_device(ctx);
        break;
      }
      out = std::make_unique<IbvContext>(ctx, pd, std::move(info));
    }
    ibv_free_device_list(list);
    if (out) return out;
    return absl::UnavailableError(error.empty() ? "no RDMA device " + name : error);
  }

  std::string ForkInit() override {
    int rc = ibv_fork_init();
    if (rc == 0) return "";
    if (ibv_is_fork_initialized() == IBV_FORK_UNNEEDED) return "";  // the kernel copes
    return absl::StrCat("ibv_fork_init: ", Errno(rc),
                        "; registered memory is not fork-safe (the agent forks fusermount3)");
  }
};

}  // namespace

std::shared_ptr<Verbs> SystemVerbs(std::string* why) {
  static const std::shared_ptr<Verbs> verbs = std::make_shared<IbvVerbs>();
  return verbs;
}

}  // namespace ember::transport
