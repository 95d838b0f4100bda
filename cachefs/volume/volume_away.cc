// VolumeFs's calls to meta (volume_fs.h), and what it answers while meta is away: every inode,
// name and directory listing meta gave is remembered, so lookups, attributes and listings go on
// (a node keeps reading the files it holds); changes, and copies (they need meta's checksums),
// fail with EIO until meta is back.
#include "absl/strings/str_cat.h"
#include "cachefs/volume/volume_fs.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {

// Meta did not answer at all (as opposed to answering no).
bool Away(const absl::Status& st) {
  return CarriedErrno(st) == 0 && (absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st));
}

}  // namespace

absl::StatusOr<rpc::VolumeOpReply> VolumeFs::Op(const Ref& at, rpc::VolumeOpRequest req) {
  req.set_volume(at.volume);
  absl::StatusOr<rpc::VolumeOpReply> r = meta_->VolumeOp(req);
  if (r.ok()) {
    Remember(at.vol_id, req, *r);
    return r;
  }
  if (Away(r.status())) {
    if (std::optional<rpc::VolumeOpReply> last = Recall(at.vol_id, req)) return *last;
  }
  return VolumeErrno(r.status());
}

void VolumeFs::RememberLocked(uint32_t vol, const rpc::VolumeInode& n) {
  if (n.ino() == 0) return;
  if (inodes_.size() >= kRemembered) {  // a bound, not a cache policy: start again
    inodes_.clear();
    names_.clear();
    listings_.clear();
  }
  inodes_[{vol, n.ino()}] = n;
  if (n.parent() != 0) names_[{vol, n.parent(), n.name()}] = n.ino();
}

void VolumeFs::Remember(uint32_t vol, const rpc::VolumeOpRequest& req,
                        const rpc::VolumeOpReply& r) {
  absl::MutexLock lock(&mu_);
  if (req.has_rename()) {
    names_.erase({vol, req.rename().parent(), req.rename().name()});
    listings_.erase({vol, req.rename().parent()});
    listings_.erase({vol, req.rename().new_parent()});
  } else if (req.has_unlink() || req.has_rmdir()) {
    const rpc::VolumeRemove& rm = req.has_unlink() ? req.unlink() : req.rmdir();
    names_.erase({vol, rm.parent(), rm.name()});
    listings_.erase({vol, rm.parent()});
  } else if (req.has_create() || req.has_mkdir()) {
    listings_.erase({vol, req.has_create() ? req.create().parent() : req.mkdir().parent()});
  }
  if (r.has_inode()) RememberLocked(vol, r.inode());
  for (const auto& e : r.entries()) RememberLocked(vol, e);
  if (req.has_readdir() && req.readdir().after().empty() && !r.more()) {
    // Only a listing meta gave whole in one answer (a checkpoint directory's): a listing of
    // many pages, half of which were seen, would be a guess.
    listings_[{vol, req.readdir().ino()}].assign(r.entries().begin(), r.entries().end());
  }
}

std::optional<rpc::VolumeOpReply> VolumeFs::Recall(uint32_t vol, const rpc::VolumeOpRequest& req) {
  absl::MutexLock lock(&mu_);
  rpc::VolumeOpReply out;
  uint64_t ino = 0;
  if (req.has_lookup()) {
    auto it = names_.find({vol, req.lookup().parent(), req.lookup().name()});
    if (it == names_.end()) return std::nullopt;
    ino = it->second;
  } else if (req.has_getattr()) {
    ino = req.getattr().ino();
  } else if (req.has_readdir()) {
    ino = req.readdir().ino();
    auto list = listings_.find({vol, ino});
    if (list == listings_.end()) return std::nullopt;
    for (const auto& e : list->second) {
      if (e.name() > req.readdir().after()) *out.add_entries() = e;  // one page: all of it
    }
  } else {
    return std::nullopt;  // changes need meta
  }
  auto it = inodes_.find({vol, ino});
  if (it == inodes_.end()) return std::nullopt;
  *out.mutable_inode() = it->second;
  for (const auto& v : volumes_) {
    if (v.id() == vol) out.set_block_size(v.block_size());
  }
  if (out.block_size() == 0) return std::nullopt;
  return out;
}

}  // namespace ember::cachefs
