// VolumeCatalog's changes that move or remove entries, set attributes and upload state, and the
// status walk (volumes.h).
#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "meta/volume_keys.h"
#include "meta/volumes.h"

namespace ember::meta {

using volume_keys::CheckName;
using volume_keys::Discard;
using volume_keys::EntryKey;
using volume_keys::Err;
using volume_keys::GarbageKey;
using volume_keys::InodeKey;
using volume_keys::InoValue;
using volume_keys::IsDir;
using volume_keys::Put;

absl::Status VolumeCatalog::Rename(const rpc::Volume& vol, const rpc::VolumeRename& op,
                                   rpc::VolumeOpReply* reply) {
  const uint32_t id = vol.id();
  RETURN_IF_ERROR(CheckName(op.new_name()));
  ASSIGN_OR_RETURN(rpc::VolumeInode src, LookupIn(id, op.parent(), op.name()));
  ASSIGN_OR_RETURN(rpc::VolumeInode to_dir, Inode(id, op.new_parent()));
  if (!IsDir(to_dir)) {
    return Err(ENOTDIR, absl::StrCat("inode ", op.new_parent(), " is not a directory"));
  }
  if (op.parent() == op.new_parent() && op.name() == op.new_name()) {
    *reply->mutable_inode() = std::move(src);
    return absl::OkStatus();
  }
  if (IsDir(src)) {
    // Not into itself or below itself: walk up from the new parent to the root.
    for (uint64_t at = op.new_parent(); at != 0;) {
      if (at == src.ino()) {
        return Err(EINVAL, absl::StrCat("cannot move directory '", op.name(), "' into itself"));
      }
      ASSIGN_OR_RETURN(rpc::VolumeInode up, Inode(id, at));
      at = up.parent();
    }
  }
  const int64_t now_ns = NowMs() * 1'000'000;
  MetaStore::VolumeChange c;
  int replaced_children = 0;
  absl::StatusOr<rpc::VolumeInode> target = LookupIn(id, op.new_parent(), op.new_name());
  if (target.ok()) {
    if (target->ino() == src.ino()) {  // a hard link to itself cannot happen; nothing to do
      *reply->mutable_inode() = std::move(src);
      return absl::OkStatus();
    }
    if (op.noreplace()) return Err(EEXIST, absl::StrCat("'", op.new_name(), "' exists"));
    if (IsDir(*target) && !IsDir(src)) {
      return Err(EISDIR, absl::StrCat("'", op.new_name(), "' is a directory"));
    }
    if (!IsDir(*target) && IsDir(src)) {
      return Err(ENOTDIR, absl::StrCat("'", op.new_name(), "' is not a directory"));
    }
    if (IsDir(*target) && target->children() > 0) {
      return Err(ENOTEMPTY, absl::StrCat("'", op.new_name(), "' is not empty"));
    }
    Discard(&c, id, *target);
    c.erase.push_back(InodeKey(id, target->ino()));
    replaced_children = 1;
  } else if (CarriedErrno(target.status()) != ENOENT) {
    return target.status();
  }
  c.erase.push_back(EntryKey(id, op.parent(), op.name()));
  c.put.emplace_back(EntryKey(id, op.new_parent(), op.new_name()), InoValue(src.ino()));
  src.set_parent(op.new_parent());
  src.set_name(op.new_name());
  src.set_ctime_ns(now_ns);
  Put(&c, id, src);
  if (op.parent() == op.new_parent()) {
    to_dir.set_children(to_dir.children() - replaced_children);
    to_dir.set_mtime_ns(now_ns);
    to_dir.set_ctime_ns(now_ns);
    Put(&c, id, to_dir);
  } else {
    ASSIGN_OR_RETURN(rpc::VolumeInode from_dir, Inode(id, op.parent()));
    from_dir.set_children(from_dir.children() - 1);
    to_dir.set_children(to_dir.children() + 1 - replaced_children);
    for (rpc::VolumeInode* d : {&from_dir, &to_dir}) {
      d->set_mtime_ns(now_ns);
      d->set_ctime_ns(now_ns);
      Put(&c, id, *d);
    }
  }
  RETURN_IF_ERROR(store_->ApplyVolumeChange(c));
  *reply->mutable_inode() = std::move(src);
  return absl::OkStatus();
}

absl::Status VolumeCatalog::Remove(const rpc::Volume& vol, const rpc::VolumeRemove& op, bool dir,
                                   rpc::VolumeOpReply* reply) {
  const uint32_t id = vol.id();
  ASSIGN_OR_RETURN(rpc::VolumeInode n, LookupIn(id, op.parent(), op.name()));
  if (dir && !IsDir(n)) return Err(ENOTDIR, absl::StrCat("'", op.name(), "' is not a directory"));
  if (!dir && IsDir(n)) return Err(EISDIR, absl::StrCat("'", op.name(), "' is a directory"));
  if (dir && n.children() > 0)
    return Err(ENOTEMPTY, absl::StrCat("'", op.name(), "' is not empty"));
  ASSIGN_OR_RETURN(rpc::VolumeInode parent, Inode(id, op.parent()));
  const int64_t now_ns = NowMs() * 1'000'000;
  parent.set_children(parent.children() - 1);
  parent.set_mtime_ns(now_ns);
  parent.set_ctime_ns(now_ns);
  MetaStore::VolumeChange c;
  Discard(&c, id, n);
  c.erase.push_back(EntryKey(id, op.parent(), op.name()));
  c.erase.push_back(InodeKey(id, n.ino()));
  Put(&c, id, parent);
  RETURN_IF_ERROR(store_->ApplyVolumeChange(c));
  *reply->mutable_inode() = std::move(n);
  return absl::OkStatus();
}

absl::Status VolumeCatalog::SetAttr(const rpc::Volume& vol, const rpc::VolumeSetAttr& op,
                                    rpc::VolumeOpReply* reply) {
  ASSIGN_OR_RETURN(rpc::VolumeInode n, Inode(vol.id(), op.ino()));
  if (op.set_mode()) n.set_mode((n.mode() & S_IFMT) | (op.mode() & 07777));
  if (op.set_mtime()) n.set_mtime_ns(op.mtime_ns());
  if (op.set_owner()) {
    n.set_uid(op.uid());
    n.set_gid(op.gid());
  }
  n.set_ctime_ns(NowMs() * 1'000'000);
  MetaStore::VolumeChange c;
  Put(&c, vol.id(), n);
  RETURN_IF_ERROR(store_->ApplyVolumeChange(c));
  *reply->mutable_inode() = std::move(n);
  return absl::OkStatus();
}

absl::Status VolumeCatalog::Persisted(const rpc::Volume& vol, const rpc::VolumePersisted& op,
                                      rpc::VolumeOpReply* reply) {
  absl::StatusOr<rpc::VolumeInode> n = Inode(vol.id(), op.ino());
  if (!n.ok() && CarriedErrno(n.status()) != ENOENT) return n.status();
  // An empty file (no contents id) is uploaded as an empty file.
  const bool empty_file = n.ok() && op.file_id() == 0 && n->file_id() == 0 && n->size() == 0 &&
                          !IsDir(*n) && n->state() != rpc::VolumeInode::EMPTY;
  if (!n.ok() || n->file_id() != op.file_id() || (op.file_id() == 0 && !empty_file)) {
    // Removed or replaced while it was uploaded: what the upload put in the origin is discarded
    // contents, to be deleted there like those of an unlink.
    if (!op.path().empty()) {
      rpc::VolumeInode gone;
      gone.set_file_id(op.file_id() != 0 ? op.file_id() : volume_keys::EmptyContentsId(op.ino()));
      gone.set_size(op.size());
      gone.set_state(rpc::VolumeInode::PERSISTED);
      gone.set_persisted_path(op.path());
      gone.set_origin_copy(op.origin_copy());
      if (!op.node().empty()) gone.add_holders(op.node());
      MetaStore::VolumeChange c;
      Discard(&c, vol.id(), gone);
      if (n.ok() && n->state() == rpc::VolumeInode::PERSISTED && n->persisted_path() == op.path()) {
        // That late upload went where the file's own copy is, maybe over it: the file is
        // uploaded again (after the deletion: uploads wait for it).
        n->set_state(volume_keys::StateFor(vol, static_cast<size_t>(n->holders_size())));
        n->clear_persisted_path();
        n->clear_origin_copy();
        Put(&c, vol.id(), *n);
      }
      RETURN_IF_ERROR(store_->ApplyVolumeChange(c));
    }
    if (!n.ok()) return n.status();
  } else if (n->state() != rpc::VolumeInode::PERSISTED || n->persisted_path() != op.path() ||
             n->origin_copy() != op.origin_copy()) {
    n->set_state(rpc::VolumeInode::PERSISTED);
    n->set_persisted_path(op.path());
    n->set_origin_copy(op.origin_copy());
    MetaStore::VolumeChange c;
    Put(&c, vol.id(), *n);
    RETURN_IF_ERROR(store_->ApplyVolumeChange(c));
  }
  *reply->mutable_inode() = std::move(*n);
  return absl::OkStatus();
}

absl::Status VolumeCatalog::OriginDeleted(const rpc::Volume& vol,
                                          const rpc::VolumeOriginDeleted& op) {
  MetaStore::VolumeChange c;
  c.erase.push_back(GarbageKey(vol.id(), op.file_id()));
  return store_->ApplyVolumeChange(c);
}

absl::Status VolumeCatalog::Copying(const rpc::Volume& vol, const rpc::VolumeCopying& op,
                                    rpc::VolumeOpReply* reply) {
  ASSIGN_OR_RETURN(rpc::VolumeInode n, Inode(vol.id(), op.ino()));
  if (n.file_id() == op.file_id() && op.file_id() != 0 && !op.node().empty()) {
    const auto& out = op.unreachable();
    const bool keep = n.copiers_size() > 0 && n.copiers(0) != op.node() &&
                      std::find(out.begin(), out.end(), n.copiers(0)) == out.end();
    const bool again = n.copiers_size() == 1 && n.copiers(0) == op.node();
    if (!keep && !again) {  // none, or one that failed: the caller reads the origin
      n.clear_copiers();
      n.add_copiers(op.node());
      MetaStore::VolumeChange c;
      Put(&c, vol.id(), n);
      RETURN_IF_ERROR(store_->ApplyVolumeChange(c));
    }
  }
  *reply->mutable_inode() = std::move(n);
  return absl::OkStatus();
}

absl::StatusOr<rpc::VolumeStatusResponse> VolumeCatalog::Status(const std::string& name) {
  ASSIGN_OR_RETURN(rpc::Volume vol, Get(name));
  rpc::VolumeStatusResponse out;
  *out.mutable_volume() = vol;
  // Breadth first from the root, each directory's entries in name order.
  std::deque<std::pair<uint64_t, std::string>> dirs{{kVolumeRootIno, ""}};
  while (!dirs.empty()) {
    auto [dir, path] = dirs.front();
    dirs.pop_front();
    rpc::VolumeReadDir op;
    op.set_ino(dir);
    for (bool more = true; more;) {
      rpc::VolumeOpReply page;
      RETURN_IF_ERROR(ReadDir(vol.id(), op, &page));
      more = page.more();
      for (rpc::VolumeInode& n : *page.mutable_entries()) {
        const std::string p = path.empty() ? n.name() : absl::StrCat(path, "/", n.name());
        op.set_after(n.name());
        if (IsDir(n)) {
          dirs.emplace_back(n.ino(), p);
          continue;
        }
        if (n.state() != rpc::VolumeInode::PERSISTED) {
          out.set_bytes_unpersisted(out.bytes_unpersisted() + n.size());
        }
        n.set_name(p);
        *out.add_files() = std::move(n);
      }
    }
  }
  const std::string discarded = volume_keys::VolPrefix(vol.id()) + "g";
  absl::Status parsed;
  RETURN_IF_ERROR(
      store_->ScanVolumeKeys(discarded, "", [&](const std::string&, const std::string& value) {
        rpc::VolumeInode g;
        if (!g.ParseFromString(value)) {
          parsed = absl::DataLossError("a discarded contents record does not parse");
          return false;
        }
        if (!g.persisted_path().empty()) *out.add_discarded() = std::move(g);
        return true;
      }));
  RETURN_IF_ERROR(parsed);
  return out;
}

}  // namespace ember::meta
