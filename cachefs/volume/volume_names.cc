// VolumeFs's names (volume_fs.h): lookups, attributes and listings, changes of names (mkdir,
// unlink, rmdir, rename) and the extended attribute: each one operation in meta.
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "cachefs/volume/volume_fs.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {
constexpr uint32_t kRenameNoreplace = 1;  // RENAME_NOREPLACE (linux/fs.h)
}  // namespace

absl::StatusOr<Entry> VolumeFs::Lookup(uint64_t parent, const std::string& name) {
  ASSIGN_OR_RETURN(Ref at, Resolve(parent));
  rpc::VolumeOpRequest req;
  req.mutable_lookup()->set_parent(at.ino);
  req.mutable_lookup()->set_name(name);
  ASSIGN_OR_RETURN(rpc::VolumeOpReply r, Op(at, req));
  return EntryOf(at, r.inode());
}

absl::StatusOr<Entry> VolumeFs::GetAttr(uint64_t ino) {
  ASSIGN_OR_RETURN(Ref at, Resolve(ino));
  rpc::VolumeOpRequest req;
  req.mutable_getattr()->set_ino(at.ino);
  ASSIGN_OR_RETURN(rpc::VolumeOpReply r, Op(at, req));
  return EntryOf(at, r.inode());
}

absl::Status VolumeFs::ReadDir(
    uint64_t ino, uint64_t offset,
    const std::function<bool(const std::string&, const Attr&, uint64_t)>& fn) {
  ASSIGN_OR_RETURN(Ref at, Resolve(ino));
  // Offsets: 1 after ".", 2 after "..", 2 + i after the i-th entry of the listing (a checkpoint
  // directory is small: the whole listing is read for each call).
  std::vector<rpc::VolumeInode> entries;
  rpc::VolumeInode self;
  rpc::VolumeOpRequest req;
  req.mutable_readdir()->set_ino(at.ino);
  for (bool more = true; more;) {
    ASSIGN_OR_RETURN(rpc::VolumeOpReply r, Op(at, req));
    self = r.inode();
    more = r.more();
    for (auto& e : *r.mutable_entries()) {
      req.mutable_readdir()->set_after(e.name());
      entries.push_back(std::move(e));
    }
  }
  Attr me = EntryOf(at, self).attr, up = me;
  if (offset < 1 && !fn(".", me, 1)) return absl::OkStatus();
  if (offset < 2 && !fn("..", up, 2)) return absl::OkStatus();
  for (uint64_t i = offset < 2 ? 0 : offset - 2; i < entries.size(); ++i) {
    if (!fn(entries[i].name(), EntryOf(at, entries[i]).attr, i + 3)) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<Entry> VolumeFs::MkDir(uint64_t parent, const std::string& name, uint32_t mode,
                                      uint32_t uid, uint32_t gid) {
  ASSIGN_OR_RETURN(Ref at, Resolve(parent));
  rpc::VolumeOpRequest req;
  auto* m = req.mutable_mkdir();
  m->set_parent(at.ino);
  m->set_name(name);
  m->set_mode(mode);
  m->set_uid(uid);
  m->set_gid(gid);
  ASSIGN_OR_RETURN(rpc::VolumeOpReply r, Op(at, req));
  return EntryOf(at, r.inode());
}

absl::Status VolumeFs::Unlink(uint64_t parent, const std::string& name) {
  ASSIGN_OR_RETURN(Ref at, Resolve(parent));
  rpc::VolumeOpRequest req;
  req.mutable_unlink()->set_parent(at.ino);
  req.mutable_unlink()->set_name(name);
  return Op(at, req).status();
}

absl::Status VolumeFs::RmDir(uint64_t parent, const std::string& name) {
  ASSIGN_OR_RETURN(Ref at, Resolve(parent));
  rpc::VolumeOpRequest req;
  req.mutable_rmdir()->set_parent(at.ino);
  req.mutable_rmdir()->set_name(name);
  return Op(at, req).status();
}

absl::Status VolumeFs::Rename(uint64_t parent, const std::string& name, uint64_t new_parent,
                              const std::string& new_name, uint32_t flags) {
  if ((flags & ~static_cast<uint32_t>(kRenameNoreplace)) != 0) {
    return ErrnoStatus(EINVAL, "only RENAME_NOREPLACE is supported");
  }
  ASSIGN_OR_RETURN(Ref from, Resolve(parent));
  ASSIGN_OR_RETURN(Ref to, Resolve(new_parent));
  if (from.vol_id != to.vol_id) return ErrnoStatus(EXDEV, "rename across volumes");
  rpc::VolumeOpRequest req;
  auto* m = req.mutable_rename();
  m->set_parent(from.ino);
  m->set_name(name);
  m->set_new_parent(to.ino);
  m->set_new_name(new_name);
  m->set_noreplace((flags & kRenameNoreplace) != 0);
  return Op(from, req).status();
}

absl::StatusOr<std::string> VolumeFs::GetXattr(uint64_t ino, const std::string& name) {
  if (name != "user.ember.state") return ErrnoStatus(ENODATA, "no such attribute");
  ASSIGN_OR_RETURN(Ref at, Resolve(ino));
  rpc::VolumeOpRequest req;
  req.mutable_getattr()->set_ino(at.ino);
  ASSIGN_OR_RETURN(rpc::VolumeOpReply r, Op(at, req));
  if (r.inode().type() == rpc::FileEntry::DIR) return ErrnoStatus(ENODATA, "a directory");
  return std::string(meta::VolumeStateName(r.inode().state()));
}

}  // namespace ember::cachefs
