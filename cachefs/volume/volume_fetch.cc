// VolumeFs's reads and its copies of a file's contents from the nodes holding them (volume_fs.h):
// an open of contents this node lacks starts a copy in the background (StartCopy) and reads take
// each block as soon as it is checked and written, so the copy and the reads overlap.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachefs/volume/volume_file.h"
#include "cachefs/volume/volume_fs.h"
#include "common/file_io.h"
#include "common/metrics.h"
#include "common/status.h"
#include "origin/writable.h"

namespace ember::cachefs {
namespace {
constexpr uint32_t kChecksumBatch = 10'000;
// A copier named by meta that answers, but has added no block for this long, or could not be
// reached: another node (the next caller) becomes the copier, this many times at most.
// A copier that adds no block this long (while it says it copies) is given up on; one that
// says it neither copies nor holds the contents at once. It is asked every kCopierProbe while
// nothing new comes.
constexpr absl::Duration kCopierStall = absl::Seconds(30);
constexpr absl::Duration kCopierProbe = absl::Milliseconds(500);
constexpr int kCopierRounds = 3;
}  // namespace

absl::Status VolumeErrno(const absl::Status& st) {
  if (st.ok() || CarriedErrno(st) != 0) return st;
  if (absl::IsNotFound(st)) return ErrnoStatus(ENOENT, std::string(st.message()));
  return ErrnoStatus(EIO, std::string(st.message()));
}

absl::StatusOr<std::string> VolumeFs::PeerAddress(const std::string& node_id) {
  for (int pass = 0; pass < 2; ++pass) {
    {
      absl::MutexLock lock(&mu_);
      if (auto it = peers_.find(node_id); it != peers_.end()) return it->second;
    }
    if (pass == 1) break;
    ASSIGN_OR_RETURN(std::vector<rpc::Node> nodes, meta_->ListNodes());
    absl::MutexLock lock(&mu_);
    for (const auto& n : nodes) peers_[n.id()] = n.address();
  }
  return absl::NotFoundError(absl::StrCat("node ", node_id, " is not registered"));
}

absl::StatusOr<VolumeFs::CopyPlan> VolumeFs::PlanCopy(uint32_t vol, const rpc::VolumeInode& n,
                                                      uint64_t block_size) {
  if (block_size == 0) return ErrnoStatus(EIO, "no block size known for the volume");
  CopyPlan plan;
  const uint64_t blocks = (n.size() + block_size - 1) / block_size;
  const std::pair<uint32_t, uint64_t> key{vol, n.file_id()};
  {
    absl::MutexLock lock(&mu_);
    if (auto it = sums_.find(key); it != sums_.end() && it->second.size() == blocks) {
      plan.sums = it->second;
    }
  }
  for (uint64_t first = plan.sums.empty() ? 0 : blocks; first < blocks; first += kChecksumBatch) {
    rpc::GetChecksumsRequest req;
    for (uint64_t i = first; i < std::min<uint64_t>(blocks, first + kChecksumBatch); ++i) {
      *req.add_blocks() = meta::ToProto(BlockAddr{vol, meta::kVolumeDataVersion, n.file_id(), i});
    }
    absl::StatusOr<rpc::GetChecksumsResponse> got = meta_->GetChecksums(req);
    if (!got.ok()) return VolumeErrno(got.status());
    for (int i = 0; i < got->checksums_size(); ++i) {
      if (!got->present(i)) {
        return ErrnoStatus(EIO, absl::StrCat("meta has no checksum of block ", first + i,
                                             " of contents ", n.file_id()));
      }
      plan.sums.push_back(got->checksums(i));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (sums_.size() >= kSumsKept) sums_.erase(sums_.begin());
    sums_[key] = plan.sums;
  }
  // Holders meta knows are dead are not asked: with none left, the contents come from the
  // origin, read once for all the nodes restoring them (RunCopy), not by each one's reads.
  absl::StatusOr<std::vector<rpc::Node>> nodes = meta_->ListNodes();
  for (const auto& h : n.holders()) {
    if (h == node_id_) continue;  // our copy is gone (dropped as corrupt): others only
    if (nodes.ok() && std::any_of(nodes->begin(), nodes->end(), [&h](const rpc::Node& x) {
          return x.id() == h && x.state() == rpc::Node::DEAD;
        })) {
      continue;
    }
    if (auto addr = PeerAddress(h); addr.ok()) plan.peers.push_back(*addr);
  }
  std::string origin;
  for (const auto& v : Volumes()) {
    if (v.id() == vol) origin = v.origin();
  }
  if (n.state() == rpc::VolumeInode::PERSISTED && !n.persisted_path().empty() && !origin.empty()) {
    plan.origin = origin;
    plan.origin_path = n.persisted_path();
  }
  if (plan.peers.empty() && plan.origin_path.empty()) {
    return ErrnoStatus(
        EIO, absl::StrCat("'", n.name(), "': no other node holding its contents is known"));
  }
  return plan;
}

absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> VolumeFs::RunCopy(
    uint32_t vol, const rpc::VolumeInode& n, uint64_t block_size, const CopyPlan& plan,
    const std::function<void(uint64_t)>& written, const std::function<void()>& restart) {
  absl::Status st = ErrnoStatus(
      EIO, absl::StrCat("'", n.name(), "': no other node holding its contents is known"));
  bool fresh = true;  // no attempt has written to the copy's file yet
  auto again = [&] {
    if (!fresh && restart) restart();  // the last attempt's file was dropped
    fresh = false;
  };
  if (!plan.peers.empty()) {
    again();
    auto whole = store_->Fetch(vol, n.file_id(), n.size(), block_size, plan.sums,
                               FromPeers(vol, n.file_id(), plan.peers), false, written);
    if (whole.ok()) return whole;
    spdlog::warn("volume: contents of '{}' could not be copied from {}: {}", n.name(),
                 plan.peers.front(), std::string(whole.status().message()));
    st = ErrnoStatus(EIO, std::string(whole.status().message()));
  }
  // No holder could give them: the origin's copy, read by one node (meta names it: the
  // copier); other nodes restoring the file at once copy the copier's copy as it lands.
  if (plan.origin_path.empty()) return st;
  std::vector<std::string> unreachable;
  for (int round = 0; round < kCopierRounds; ++round) {
    const std::string copier = Copier(vol, n, unreachable);
    if (copier.empty()) break;  // this node
    if (absl::StatusOr<std::string> addr = PeerAddress(copier); addr.ok()) {
      again();
      auto whole = store_->Fetch(vol, n.file_id(), n.size(), block_size, plan.sums,
                                 FromCopier(vol, n.file_id(), copier, *addr), false, written);
      if (whole.ok()) return whole;
      spdlog::warn(
          "volume: contents of '{}' could not be copied from node {}, which reads "
          "them from the origin: {}",
          n.name(), copier, std::string(whole.status().message()));
    }
    unreachable.push_back(copier);
  }
  again();
  const std::string where = absl::StrCat(plan.origin, "/", plan.origin_path);
  auto whole = store_->Fetch(vol, n.file_id(), n.size(), block_size, plan.sums,
                             FromOrigin(plan.origin, plan.origin_path, block_size), false, written);
  if (!whole.ok()) {
    spdlog::warn("volume: contents of '{}' could not be read from the origin '{}': {}", n.name(),
                 where, std::string(whole.status().message()));
    return ErrnoStatus(EIO, absl::StrCat(st.message(), "; and the origin's copy '", where,
                                         "': ", whole.status().message()));
  }
  return whole;
}

std::string VolumeFs::Copier(uint32_t vol, const rpc::VolumeInode& n,
                             const std::vector<std::string>& unreachable) {
  rpc::VolumeOpRequest req;
  for (const auto& v : Volumes()) {
    if (v.id() == vol) req.set_volume(v.name());
  }
  auto* c = req.mutable_copying();
  c->set_ino(n.ino());
  c->set_file_id(n.file_id());
  c->set_node(node_id_);
  for (const auto& u : unreachable) c->add_unreachable(u);
  absl::StatusOr<rpc::VolumeOpReply> r = meta_->VolumeOp(req);
  // Meta away (or the file changed meanwhile): this node reads the origin; the copy is
  // checked against the checksums of the contents it was asked for either way.
  if (!r.ok() || r->inode().file_id() != n.file_id() || r->inode().copiers_size() == 0) return "";
  return r->inode().copiers(0) == node_id_ ? "" : r->inode().copiers(0);
}

VolumeStore::BatchReader VolumeFs::FromCopier(uint32_t vol, uint64_t file_id, std::string node,
                                              std::string peer) {
  // The copier serves each block once it is in (VolumeStore::GetBlock): a block it does not
  // have yet is asked for again, as long as the copier says it is copying and gets further.
  return [this, vol, file_id, node = std::move(node),
          peer = std::move(peer)](std::vector<VolumeStore::Piece>& pieces) -> absl::Status {
    std::vector<transport::FetchPiece> want = Wanted(vol, file_id, pieces);
    rpc::NodeCall probe;
    probe.mutable_copy_state()->set_volume(vol);
    probe.mutable_copy_state()->set_file_id(file_id);
    const std::string ask = probe.SerializeAsString();
    absl::Time progress = absl::Now();
    absl::Time probed = absl::InfinitePast();
    uint64_t copier_in = 0;  // blocks in at the copier when last asked
    absl::Duration pause = absl::Milliseconds(2);
    for (;;) {
      const bool got = FetchMissing(peer, want) > 0;
      bool missing = false;
      for (const auto& w : want) {
        if (w.status.ok()) continue;
        if (!absl::IsNotFound(w.status)) return w.status;
        missing = true;
      }
      if (!missing) break;
      const absl::Time now = absl::Now();
      if (got) {
        progress = now;
        pause = absl::Milliseconds(2);
        continue;
      }
      if (now - probed >= kCopierProbe) {  // nothing new: is it still at it?
        probed = now;
        absl::StatusOr<std::string> answer = transport_->Call(peer, ask, std::chrono::seconds(5));
        rpc::NodeCallReply state;
        if (answer.ok() && state.ParseFromString(*answer) && state.error().empty() &&
            !state.copying() && !state.whole()) {
          return absl::UnavailableError(
              absl::StrCat("node ", node, " neither copies nor holds contents ", file_id,
                           " (its read of the origin failed, or it dropped its copy)"));
        }
        // No answer (it answered the fetch just now: a node too old to be asked): the stall
        // alone decides.
        if (state.copying() && state.blocks_in() > copier_in) {
          copier_in = state.blocks_in();
          progress = now;
        }
      }
      if (now - progress > kCopierStall) {
        return absl::UnavailableError(
            absl::StrCat("node ", node, " has copied no block of contents ", file_id,
                         " from the origin for ", absl::FormatDuration(kCopierStall)));
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(50));
    }
    for (size_t i = 0; i < want.size(); ++i)
      pieces[i].received_sum = want[i].info.received_checksum;
    return absl::OkStatus();
  };
}

VolumeStore::BatchReader VolumeFs::FromOrigin(std::string origin, std::string path,
                                              uint64_t block_size) {
  static metrics::Counter* const read = metrics::Global().GetCounter(
      "ember_volume_origin_read_bytes_total",
      "Bytes of volume files read from their volume's origin (restores no node could serve).");
  if (path.empty()) return nullptr;
  return [origin = std::move(origin), path = std::move(path),
          block_size](std::vector<VolumeStore::Piece>& pieces) -> absl::Status {
    if (pieces.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::shared_ptr<origin::WritableOrigin> from,
                     origin::SharedWritableOrigin(origin));
    for (const auto& p : pieces) {
      absl::Status st = from->Read(path, p.index * block_size, p.len, p.buf);
      if (!st.ok()) {
        return absl::UnavailableError(absl::StrCat("cannot read the origin's copy '", origin, "/",
                                                   path, "': ", st.message()));
      }
      read->Inc(p.len);
    }
    return absl::OkStatus();
  };
}

absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> VolumeFs::Local(uint32_t vol,
                                                                          const rpc::VolumeInode& n,
                                                                          uint64_t block_size) {
  if (auto have = store_->Open(vol, n.file_id()); have.ok()) return have;
  ASSIGN_OR_RETURN(CopyPlan plan, PlanCopy(vol, n, block_size));
  // Joins a copy of the same contents under way (a reader's), never runs a second one beside
  // it: two would each ask meta for the copier and could end up following each other.
  ASSIGN_OR_RETURN(std::shared_ptr<Copy> c, StartCopy(vol, n, block_size, std::move(plan)));
  absl::MutexLock lock(&c->mu);
  c->mu.Await(absl::Condition(&c->done));
  if (!c->status.ok()) return c->status;
  return c->whole;
}

absl::StatusOr<std::shared_ptr<VolumeFs::Copy>> VolumeFs::StartCopy(uint32_t vol,
                                                                    const rpc::VolumeInode& n,
                                                                    uint64_t block_size,
                                                                    CopyPlan plan) {
  const std::pair<uint32_t, uint64_t> key{vol, n.file_id()};
  {
    absl::MutexLock lock(&mu_);
    if (auto it = copies_.find(key); it != copies_.end()) {
      if (auto c = it->second.lock()) return c;
    }
  }
  auto c = std::make_shared<Copy>();
  {
    absl::MutexLock lock(&c->mu);
    c->have.assign(plan.sums.size(), false);
  }
  absl::MutexLock lock(&mu_);
  if (auto running = copies_[key].lock()) return running;  // started meanwhile
  copies_[key] = c;
  std::erase_if(copying_, [](std::future<void>& f) {
    return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  });
  copying_.push_back(
      std::async(std::launch::async, [this, c, vol, n, block_size, plan = std::move(plan), key] {
        absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> whole = RunCopy(
            vol, n, block_size, plan,
            [&c](uint64_t i) {
              absl::MutexLock lock(&c->mu);
              if (i < c->have.size()) c->have[i] = true;
            },
            [&c] {
              absl::MutexLock lock(&c->mu);
              c->have.assign(c->have.size(), false);
              c->attempt++;
            });
        {
          absl::MutexLock lock(&c->mu);
          c->done = true;
          c->status = whole.status();
          if (whole.ok()) c->whole = *whole;
        }
        absl::MutexLock lock(&mu_);
        if (auto it = copies_.find(key); it != copies_.end() && it->second.lock() == c) {
          copies_.erase(it);
        }
      }));
  return c;
}

VolumeFs::~VolumeFs() {
  std::vector<std::future<void>> running;
  {
    absl::MutexLock lock(&mu_);
    running.swap(copying_);
  }
  for (auto& f : running) f.wait();
}

absl::StatusOr<ReadResult> VolumeFs::Read(uint64_t ino, FileSystem::FileHandle* handle,
                                          uint64_t offset, size_t size, char* buf) {
  std::unique_ptr<FileSystem::FileHandle> own;
  if (handle == nullptr) {  // opened before a restart: open it again for this read
    ASSIGN_OR_RETURN(own, Open(ino, O_RDONLY));
    handle = own.get();
  }
  File* f = static_cast<File*>(handle);
  ReadResult out;
  if (f->stream_ != nullptr) {  // not here: from the holders' blocks, in memory
    RETURN_IF_ERROR(f->stream_->Read(offset, size, &out));
    return out;
  }
  absl::MutexLock lock(&f->mu_);
  int fd = f->fd_;
  uint64_t file_size = f->SizeLocked();
  if (fd < 0 && f->whole_ == nullptr && f->copy_ != nullptr) {
    // Being copied: wait for the blocks asked for (or the copy's end), read them from the
    // copy's file (each was checked as it was written).
    const uint64_t end = std::min<uint64_t>(offset + size, file_size);
    if (offset >= end) return out;
    const uint64_t first = offset / f->block_size_, last = (end - 1) / f->block_size_;
    Copy& c = *f->copy_;
    absl::MutexLock copy_lock(&c.mu);
    auto ready = [&c, first, last]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c.mu) {
      if (c.done) return true;
      for (uint64_t b = first; b <= last; ++b) {
        if (b >= c.have.size() || !c.have[b]) return false;
      }
      return true;
    };
    c.mu.Await(absl::Condition(&ready));
    if (c.done && !c.status.ok()) return VolumeErrno(c.status);
    if (c.done) {
      f->whole_ = c.whole;
      f->checked_.assign(f->whole_->sums.size(), f->whole_->verified);
    } else {
      if (f->copy_fd_ >= 0 && f->copy_attempt_ != c.attempt) {  // the file was made anew
        close(f->copy_fd_);
        f->copy_fd_ = -1;
      }
      f->copy_attempt_ = c.attempt;
      if (f->copy_fd_ < 0) {
        f->copy_fd_ =
            open(store_->PathOf(f->at_.vol_id, f->whole_id_).c_str(), O_RDONLY | O_CLOEXEC);
      }
      if (f->copy_fd_ < 0) return ErrnoStatus(EIO, absl::StrCat("volume read: ", strerror(errno)));
      fd = f->copy_fd_;
    }
  }
  if (fd < 0 && f->whole_ != nullptr) {
    fd = f->whole_->fd;
    // Bytes on disk are not trusted: each block is checked once by this handle.
    const uint64_t bs = f->whole_->block_size;
    const uint64_t end = std::min<uint64_t>(offset + size, file_size);
    for (uint64_t b = offset / bs; offset < end && b * bs < end; ++b) {
      if (b < f->checked_.size() && !f->checked_[b]) {
        RETURN_IF_ERROR(
            VolumeErrno(store_->CheckBlock(*f->whole_, f->at_.vol_id, f->whole_id_, b)));
        f->checked_[b] = true;
      }
    }
  }
  if (fd < 0 || offset >= file_size) return out;
  const size_t len = static_cast<size_t>(std::min<uint64_t>(size, file_size - offset));
  if (!PreadFull(fd, offset, len, buf)) {
    return ErrnoStatus(EIO, absl::StrCat("volume read: ", strerror(errno)));
  }
  out.segments.push_back({buf, len});
  out.total = len;
  return out;
}

}  // namespace ember::cachefs
