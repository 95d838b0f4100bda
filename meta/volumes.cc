#include "meta/volumes.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <deque>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "meta/volume_keys.h"
#include "origin/writable.h"

namespace ember::meta {
using volume_keys::CheckName;
using volume_keys::DirPrefix;
using volume_keys::Discard;
using volume_keys::EntryKey;
using volume_keys::Err;
using volume_keys::GetBe;
using volume_keys::InodeKey;
using volume_keys::InoValue;
using volume_keys::IsDir;
using volume_keys::kDefaultBlockSize;
using volume_keys::kMaxReplicas;
using volume_keys::NameKey;
using volume_keys::Put;
using volume_keys::StateFor;
using volume_keys::VolPrefix;

VolumeCatalog::VolumeCatalog(MetaStore* store, DatasetCatalog* datasets, Clock clock)
    : store_(store), datasets_(datasets), clock_(std::move(clock)) {}

int64_t VolumeCatalog::NowMs() const {
  if (clock_) return clock_();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::Status VolumeCatalog::Load() {
  std::map<std::string, rpc::Volume> loaded;
  absl::Status parse = absl::OkStatus();
  RETURN_IF_ERROR(
      store_->ScanVolumeKeys("n/", "", [&](const std::string& key, const std::string& value) {
        rpc::Volume v;
        if (!v.ParseFromString(value)) {
          parse = absl::DataLossError(absl::StrCat("volume record '", key, "' is corrupt"));
          return false;
        }
        loaded[v.name()] = v;
        return true;
      }));
  RETURN_IF_ERROR(parse);
  absl::MutexLock lock(&mu_);
  by_name_ = std::move(loaded);
  return absl::OkStatus();
}

absl::StatusOr<rpc::Volume> VolumeCatalog::Add(const rpc::AddVolumeRequest& req) {
  RETURN_IF_ERROR(ValidateDatasetName(req.name()));
  std::string origin = req.origin();
  if (absl::StartsWith(origin, "s3://")) {  // a bucket prefix: it must answer us
    while (origin.size() > 5 && origin.back() == '/') origin.pop_back();
    absl::StatusOr<std::unique_ptr<origin::WritableOrigin>> bucket =
        origin::OpenWritableOrigin(origin);
    absl::Status answers = bucket.ok() ? (*bucket)->Reachable() : bucket.status();
    if (!answers.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("origin '", origin, "' cannot be used: ", answers.message()));
    }
  } else {
    struct stat st;
    if (origin.empty() || origin[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "origin '", origin, "' must be an absolute directory path or s3://bucket/prefix"));
    }
    if (stat(origin.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("origin '", origin, "' is not a directory meta can see"));
    }
    if (access(origin.c_str(), W_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("origin '", origin, "' is not writable"));
    }
  }
  const uint32_t replicas = req.replicas() == 0 ? 1 : req.replicas();
  if (replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(absl::StrCat("--replicas is at most ", kMaxReplicas));
  }
  const uint64_t block_size = req.block_size() == 0 ? kDefaultBlockSize : req.block_size();
  if (block_size < 4096 || block_size > (64ull << 20) || (block_size & (block_size - 1)) != 0) {
    return absl::InvalidArgumentError("block size must be a power of two from 4 KiB to 64 MiB");
  }
  if (datasets_->Get(req.name()).ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat("'", req.name(), "' is a dataset's name: a volume needs its own"));
  }
  absl::MutexLock lock(&mu_);
  if (auto it = by_name_.find(req.name()); it != by_name_.end()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "volume '", req.name(), "' already exists (origin ", it->second.origin(), ")"));
  }
  ASSIGN_OR_RETURN(uint32_t id, store_->AllocateDatasetId());
  const int64_t now = NowMs();
  rpc::Volume vol;
  vol.set_name(req.name());
  vol.set_id(id);
  vol.set_origin(origin);
  vol.set_replicas(replicas);
  vol.set_block_size(block_size);
  vol.set_created_unix_ms(now);
  vol.set_next_ino(kVolumeRootIno + 1);
  vol.set_next_file_id(1);
  rpc::VolumeInode root;
  root.set_ino(kVolumeRootIno);
  root.set_type(rpc::FileEntry::DIR);
  root.set_mode(S_IFDIR | 0755);
  root.set_mtime_ns(now * 1'000'000);
  root.set_ctime_ns(now * 1'000'000);
  MetaStore::VolumeChange c;
  Put(&c, id, root);
  c.put.emplace_back(NameKey(vol.name()), vol.SerializeAsString());
  RETURN_IF_ERROR(store_->ApplyVolumeChange(c));
  by_name_[vol.name()] = vol;
  spdlog::info("meta: added volume {} (id {}) uploading to {}, {} replica(s)", vol.name(), id,
               origin, replicas);
  return vol;
}

std::vector<rpc::Volume> VolumeCatalog::List() {
  absl::MutexLock lock(&mu_);
  std::vector<rpc::Volume> out;
  for (const auto& [name, v] : by_name_) out.push_back(v);
  return out;
}

absl::StatusOr<rpc::Volume> VolumeCatalog::Get(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return absl::NotFoundError(absl::StrCat("unknown volume '", name, "'"));
  return it->second;
}

bool VolumeCatalog::Has(const std::string& name) {
  absl::MutexLock lock(&mu_);
  return by_name_.count(name) > 0;
}

absl::Status VolumeCatalog::Remove(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return absl::NotFoundError(absl::StrCat("unknown volume '", name, "'"));
  // The record first: a crash midway leaves keys no volume names (they cost only space).
  MetaStore::VolumeChange c;
  c.erase.push_back(NameKey(name));
  RETURN_IF_ERROR(store_->ApplyVolumeChange(c));
  const uint32_t id = it->second.id();
  by_name_.erase(it);
  return store_->DeleteVolumeKeys(VolPrefix(id), id);
}

// ---- reads ----

absl::StatusOr<rpc::VolumeInode> VolumeCatalog::Inode(uint32_t vol, uint64_t ino) {
  ASSIGN_OR_RETURN(std::optional<std::string> v, store_->GetVolumeKey(InodeKey(vol, ino)));
  if (!v) return Err(ENOENT, absl::StrCat("no inode ", ino));
  rpc::VolumeInode n;
  if (!n.ParseFromString(*v))
    return absl::DataLossError(absl::StrCat("inode ", ino, " is corrupt"));
  return n;
}

absl::StatusOr<rpc::VolumeInode> VolumeCatalog::LookupIn(uint32_t vol, uint64_t parent,
                                                         const std::string& name) {
  RETURN_IF_ERROR(CheckName(name));
  ASSIGN_OR_RETURN(std::optional<std::string> v, store_->GetVolumeKey(EntryKey(vol, parent, name)));
  if (!v) {
    ASSIGN_OR_RETURN(rpc::VolumeInode dir, Inode(vol, parent));
    if (!IsDir(dir)) return Err(ENOTDIR, absl::StrCat("inode ", parent, " is not a directory"));
    return Err(ENOENT, absl::StrCat("no '", name, "' in directory ", parent));
  }
  if (v->size() != 8) return absl::DataLossError(absl::StrCat("entry '", name, "' is corrupt"));
  return Inode(vol, GetBe(*v, 0, 8));
}

absl::Status VolumeCatalog::ReadDir(uint32_t vol, const rpc::VolumeReadDir& op,
                                    rpc::VolumeOpReply* reply) {
  ASSIGN_OR_RETURN(rpc::VolumeInode dir, Inode(vol, op.ino()));
  if (!IsDir(dir)) return Err(ENOTDIR, absl::StrCat("inode ", op.ino(), " is not a directory"));
  const uint32_t max = op.max_entries() == 0 || op.max_entries() > kMaxReadDirPage
                           ? kMaxReadDirPage
                           : op.max_entries();
  const std::string prefix = DirPrefix(vol, op.ino());
  // Strictly after the cursor: its key with a NUL appended is the next possible key.
  const std::string from = op.after().empty() ? prefix : prefix + op.after() + std::string(1, '\0');
  std::vector<uint64_t> inos;
  RETURN_IF_ERROR(
      store_->ScanVolumeKeys(prefix, from, [&](const std::string&, const std::string& value) {
        if (inos.size() == max) {
          reply->set_more(true);
          return false;
        }
        if (value.size() == 8) inos.push_back(GetBe(value, 0, 8));
        return true;
      }));
  for (uint64_t ino : inos) {
    auto n = Inode(vol, ino);
    if (!n.ok()) continue;  // removed between the two reads
    *reply->add_entries() = std::move(*n);
  }
  *reply->mutable_inode() = dir;
  return absl::OkStatus();
}

// ---- changes ----

absl::StatusOr<rpc::VolumeOpReply> VolumeCatalog::Apply(const rpc::VolumeOpRequest& req) {
  absl::StatusOr<rpc::Volume> got = Get(req.volume());
  if (!got.ok()) return got.status();
  const uint32_t id = got->id();
  rpc::VolumeOpReply reply;
  reply.set_volume_id(id);
  reply.set_block_size(got->block_size());
  using R = rpc::VolumeOpRequest;
  switch (req.op_case()) {
    case R::kLookup: {
      ASSIGN_OR_RETURN(*reply.mutable_inode(),
                       LookupIn(id, req.lookup().parent(), req.lookup().name()));
      return reply;
    }
    case R::kGetattr: {
      ASSIGN_OR_RETURN(*reply.mutable_inode(), Inode(id, req.getattr().ino()));
      return reply;
    }
    case R::kReaddir:
      RETURN_IF_ERROR(ReadDir(id, req.readdir(), &reply));
      return reply;
    case R::OP_NOT_SET:
      return absl::InvalidArgumentError("a volume operation names no operation");
    default:
      break;
  }
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(req.volume());
  if (it == by_name_.end() || it->second.id() != id) {
    return absl::NotFoundError(absl::StrCat("unknown volume '", req.volume(), "'"));
  }
  rpc::Volume* vol = &it->second;
  absl::Status st;
  switch (req.op_case()) {
    case R::kMkdir:
      st = Make(vol, req.mkdir(), /*dir=*/true, &reply);
      break;
    case R::kCreate:
      st = Make(vol, req.create(), /*dir=*/false, &reply);
      break;
    case R::kOpenWrite:
      st = OpenWrite(vol, req.open_write().ino(), req.open_write().node(), &reply,
                     req.open_write().fresh_id());
      break;
    case R::kCommit:
      st = Commit(vol, req.commit(), &reply);
      break;
    case R::kRelease:
      st = Release(*vol, req.release(), &reply);
      break;
    case R::kRename:
      st = Rename(*vol, req.rename(), &reply);
      break;
    case R::kUnlink:
      st = Remove(*vol, req.unlink(), /*dir=*/false, &reply);
      break;
    case R::kRmdir:
      st = Remove(*vol, req.rmdir(), /*dir=*/true, &reply);
      break;
    case R::kSetattr:
      st = SetAttr(*vol, req.setattr(), &reply);
      break;
    case R::kPersisted:
      st = Persisted(*vol, req.persisted(), &reply);
      break;
    case R::kOriginDeleted:
      st = OriginDeleted(*vol, req.origin_deleted());
      break;
    case R::kCopying:
      st = Copying(*vol, req.copying(), &reply);
      break;
    default:
      st = absl::InvalidArgumentError("unknown volume operation");
  }
  if (!st.ok()) return st;
  return reply;
}

absl::Status VolumeCatalog::Write(MetaStore::VolumeChange* change, rpc::Volume* vol,
                                  const rpc::Volume& updated) {
  const bool counters =
      updated.next_ino() != vol->next_ino() || updated.next_file_id() != vol->next_file_id();
  if (counters) change->put.emplace_back(NameKey(updated.name()), updated.SerializeAsString());
  RETURN_IF_ERROR(store_->ApplyVolumeChange(*change));
  *vol = updated;
  return absl::OkStatus();
}

absl::Status VolumeCatalog::Make(rpc::Volume* vol, const rpc::VolumeMake& op, bool dir,
                                 rpc::VolumeOpReply* reply) {
  const uint32_t id = vol->id();
  RETURN_IF_ERROR(CheckName(op.name()));
  ASSIGN_OR_RETURN(rpc::VolumeInode parent, Inode(id, op.parent()));
  if (!IsDir(parent))
    return Err(ENOTDIR, absl::StrCat("inode ", op.parent(), " is not a directory"));
  absl::StatusOr<rpc::VolumeInode> existing = LookupIn(id, op.parent(), op.name());
  if (existing.ok()) {
    if (dir || op.exclusive()) return Err(EEXIST, absl::StrCat("'", op.name(), "' exists"));
    if (IsDir(*existing)) return Err(EISDIR, absl::StrCat("'", op.name(), "' is a directory"));
    return OpenWrite(vol, existing->ino(), op.node(), reply);  // O_CREAT of an existing file
  }
  if (CarriedErrno(existing.status()) != ENOENT) return existing.status();
  if (!dir && op.node().empty()) return absl::InvalidArgumentError("create names no node");
  const int64_t now_ns = NowMs() * 1'000'000;
  rpc::Volume updated = *vol;
  rpc::VolumeInode n;
  n.set_ino(updated.next_ino());
  updated.set_next_ino(updated.next_ino() + 1);
  n.set_parent(op.parent());
  n.set_name(op.name());
  n.set_type(dir ? rpc::FileEntry::DIR : rpc::FileEntry::FILE);
  n.set_mode((dir ? S_IFDIR : S_IFREG) | (op.mode() & 07777));
  n.set_uid(op.uid());
  n.set_gid(op.gid());
  n.set_mtime_ns(now_ns);
  n.set_ctime_ns(now_ns);
  if (!dir) {
    n.set_writer(op.node());
    n.set_lease_until_ms(NowMs() + kLeaseMs);
    n.set_writing_file_id(updated.next_file_id());
    updated.set_next_file_id(updated.next_file_id() + 1);
  }
  parent.set_children(parent.children() + 1);
  parent.set_mtime_ns(now_ns);
  parent.set_ctime_ns(now_ns);
  MetaStore::VolumeChange c;
  c.put.emplace_back(EntryKey(id, op.parent(), op.name()), InoValue(n.ino()));
  Put(&c, id, n);
  Put(&c, id, parent);
  RETURN_IF_ERROR(Write(&c, vol, updated));
  *reply->mutable_inode() = std::move(n);
  return absl::OkStatus();
}

absl::Status VolumeCatalog::OpenWrite(rpc::Volume* vol, uint64_t ino, const std::string& node,
                                      rpc::VolumeOpReply* reply, bool fresh_id) {
  if (node.empty()) return absl::InvalidArgumentError("a write lease names no node");
  ASSIGN_OR_RETURN(rpc::VolumeInode n, Inode(vol->id(), ino));
  if (IsDir(n)) return Err(EISDIR, absl::StrCat("inode ", ino, " is a directory"));
  const int64_t now = NowMs();
  if (!n.writer().empty() && n.writer() != node && n.lease_until_ms() > now) {
    return Err(EBUSY, absl::StrCat("'", n.name(), "' is being written by node ", n.writer(),
                                   " (one writer per file; its lease ends in ",
                                   (n.lease_until_ms() - now + 999) / 1000, " s)"));
  }
  rpc::Volume updated = *vol;
  if (n.writer() != node || n.writing_file_id() == 0 || fresh_id) {
    n.set_writing_file_id(updated.next_file_id());
    updated.set_next_file_id(updated.next_file_id() + 1);
  }
  n.set_writer(node);
  n.set_lease_until_ms(now + kLeaseMs);
  MetaStore::VolumeChange c;
  Put(&c, vol->id(), n);
  RETURN_IF_ERROR(Write(&c, vol, updated));
  *reply->mutable_inode() = std::move(n);
  return absl::OkStatus();
}

absl::Status VolumeCatalog::Commit(rpc::Volume* vol, const rpc::VolumeCommit& op,
                                   rpc::VolumeOpReply* reply) {
  const uint32_t id = vol->id();
  ASSIGN_OR_RETURN(rpc::VolumeInode n, Inode(id, op.ino()));
  if (IsDir(n)) return Err(EISDIR, absl::StrCat("inode ", op.ino(), " is a directory"));
  if (n.writer() != op.node() || op.node().empty()) {
    return Err(EIO, absl::StrCat("node ", op.node(), " no longer holds the write lease of '",
                                 n.name(), "'", n.writer().empty() ? "" : " (now node ", n.writer(),
                                 n.writer().empty() ? "" : ")"));
  }
  if (op.file_id() != n.writing_file_id()) {
    return Err(EINVAL, absl::StrCat("commit of contents ", op.file_id(), " but the lease gave ",
                                    n.writing_file_id()));
  }
  const uint64_t blocks = (op.size() + vol->block_size() - 1) / vol->block_size();
  if (static_cast<uint64_t>(op.checksums_size()) != blocks) {
    return Err(EINVAL, absl::StrCat("commit of ", op.size(), " bytes needs ", blocks,
                                    " checksums, not ", op.checksums_size()));
  }
  if (op.size() > 0 && op.holders_size() == 0) {
    return Err(EINVAL, "commit names no node holding the contents");
  }
  MetaStore::VolumeChange c;
  Discard(&c, id, n);
  for (uint64_t i = 0; i < blocks; ++i) {
    c.checksums.emplace_back(BlockAddr{id, kVolumeDataVersion, op.file_id(), i},
                             op.checksums(static_cast<int>(i)));
  }
  rpc::Volume updated = *vol;
  const int64_t now = NowMs();
  n.set_file_id(op.size() == 0 ? 0 : op.file_id());
  n.set_size(op.size());
  n.set_mtime_ns(op.mtime_ns() != 0 ? op.mtime_ns() : now * 1'000'000);
  n.set_ctime_ns(now * 1'000'000);
  n.set_generation(n.generation() + 1);
  *n.mutable_holders() = op.holders();
  n.clear_persisted_path();  // the new contents are not in the origin yet
  n.clear_origin_copy();
  n.clear_copiers();
  n.set_state(op.size() == 0 ? rpc::VolumeInode::REPLICATED
                             : StateFor(*vol, static_cast<size_t>(op.holders_size())));
  if (op.keep_lease()) {
    n.set_writing_file_id(updated.next_file_id());
    updated.set_next_file_id(updated.next_file_id() + 1);
    n.set_lease_until_ms(now + kLeaseMs);
  } else {
    n.clear_writer();
    n.set_writing_file_id(0);
    n.set_lease_until_ms(0);
  }
  Put(&c, id, n);
  RETURN_IF_ERROR(Write(&c, vol, updated));
  *reply->mutable_inode() = std::move(n);
  return absl::OkStatus();
}

absl::Status VolumeCatalog::Release(const rpc::Volume& vol, const rpc::VolumeRelease& op,
                                    rpc::VolumeOpReply* reply) {
  ASSIGN_OR_RETURN(rpc::VolumeInode n, Inode(vol.id(), op.ino()));
  if (n.writer() == op.node() && !op.node().empty()) {
    n.clear_writer();
    n.set_writing_file_id(0);
    n.set_lease_until_ms(0);
    MetaStore::VolumeChange c;
    Put(&c, vol.id(), n);
    RETURN_IF_ERROR(store_->ApplyVolumeChange(c));
  }
  *reply->mutable_inode() = std::move(n);
  return absl::OkStatus();
}

}  // namespace ember::meta
