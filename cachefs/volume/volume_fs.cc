#include "cachefs/volume/volume_fs.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "cachefs/volume/volume_file.h"
#include "common/file_io.h"
#include "common/ids.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {

constexpr int64_t kListEveryMs = 2000;

}  // namespace

VolumeFs::File::~File() {
  {
    absl::MutexLock lock(&mu_);
    if (copy_fd_ >= 0) close(copy_fd_);
  }
  if (!writable_) return;
  fs_->Forget(this);  // first: a stat of the inode no longer looks at this handle
  {
    absl::MutexLock lock(&mu_);
    if (dirty_) {
      // Never committed here: the kernel flushes at close before it releases, so these are
      // writes whose close never came (the agent stops or hands over) or whose flush failed.
      // The file keeps its last committed contents: a commit now could publish half a save.
      spdlog::warn(
          "volume {}: inode {} released with writes no close or fsync committed; the "
          "file keeps its last committed contents",
          at_.volume, at_.ino);
    }
    if (fd_ >= 0) {
      CloseStagingLocked();
      fs_->store_->Drop(at_.vol_id, writing_id_);
    }
  }
  if (absl::Status r = fs_->ReleaseLease(at_); !r.ok()) {
    spdlog::warn(
        "volume {}: the write lease of inode {} was not given back ({}); it ends by "
        "itself",
        at_.volume, at_.ino, std::string(r.message()));
  }
}

absl::Status VolumeFs::File::StageLocked() {
  if (fd_ >= 0) return absl::OkStatus();
  // Empty contents (a file just created and committed empty) are not copied.
  const bool empty = whole_ == nullptr || whole_->size == 0;
  absl::StatusOr<int> fd = empty ? fs_->store_->CreateStaging(at_.vol_id, writing_id_)
                                 : fs_->store_->CopyToStaging(at_.vol_id, whole_id_, writing_id_);
  if (!fd.ok()) return fd.status();
  fd_ = *fd;
  seq_ok_ = empty;  // written from empty: checksums may follow the writes
  seq_end_ = 0;
  seq_sums_.clear();
  seq_block_.reset();
  ahead_.offered = 0;
  size_ = SizeLocked();
  return absl::OkStatus();
}

void VolumeFs::File::HashLocked(uint64_t offset, const char* data, size_t n) {
  if (!seq_ok_ || offset != seq_end_) {
    seq_ok_ = false;
    return;
  }
  while (n > 0) {
    if (seq_block_ == nullptr) seq_block_ = std::make_unique<BlockChecksummer>();
    const size_t take =
        static_cast<size_t>(std::min<uint64_t>(n, block_size_ - seq_end_ % block_size_));
    seq_block_->Update(data, take);
    data += take;
    n -= take;
    seq_end_ += take;
    if (seq_end_ % block_size_ == 0) {
      seq_sums_.push_back(seq_block_->Digest());
      seq_block_.reset();
    }
  }
}

std::optional<std::vector<uint64_t>> VolumeFs::File::KnownSumsLocked() {
  if (!seq_ok_ || seq_end_ != SizeLocked()) return std::nullopt;
  std::vector<uint64_t> sums = seq_sums_;
  if (seq_block_ != nullptr) sums.push_back(seq_block_->Digest());
  return sums;
}

absl::Status VolumeFs::File::RenewLocked() {
  constexpr int64_t kRenewEveryMs = 10'000;  // meta's lease: 30 s
  if (NowMs() - renewed_ms_ < kRenewEveryMs) return absl::OkStatus();
  rpc::VolumeOpRequest req;
  req.mutable_open_write()->set_ino(at_.ino);
  req.mutable_open_write()->set_node(fs_->node_id_);
  ASSIGN_OR_RETURN(rpc::VolumeOpReply r, fs_->Op(at_, req));
  if (r.inode().writing_file_id() != writing_id_) {
    // The lease ran out and was taken (by another node, or anew): these writes cannot commit.
    return ErrnoStatus(EIO, absl::StrCat("the write lease of '", r.inode().name(),
                                         "' ran out while it was written"));
  }
  renewed_ms_ = NowMs();
  return absl::OkStatus();
}

uint64_t VolumeFs::File::SizeLocked() {
  struct stat st;
  if (fd_ >= 0 && fstat(fd_, &st) == 0) return static_cast<uint64_t>(st.st_size);
  if (whole_ == nullptr) return copy_ != nullptr ? copy_size_ : 0;
  return whole_->size;
}

absl::Status VolumeFs::File::RekeyLocked() {
  if (!rekey_) return absl::OkStatus();
  rpc::VolumeOpRequest req;
  req.mutable_open_write()->set_ino(at_.ino);
  req.mutable_open_write()->set_node(fs_->node_id_);
  req.mutable_open_write()->set_fresh_id(true);
  ASSIGN_OR_RETURN(rpc::VolumeOpReply r, fs_->Op(at_, req));
  const uint64_t fresh = r.inode().writing_file_id();
  if (fd_ >= 0) RETURN_IF_ERROR(fs_->store_->Rekey(at_.vol_id, writing_id_, fresh));
  writing_id_ = fresh;
  ahead_.offered = 0;  // copies ahead were of the old id
  renewed_ms_ = NowMs();
  rekey_ = false;
  return absl::OkStatus();
}

absl::Status VolumeFs::File::CommitLocked(bool keep_lease) {
  if (!dirty_) return absl::OkStatus();
  RETURN_IF_ERROR(RekeyLocked());  // a failed commit before this one
  RETURN_IF_ERROR(StageLocked());
  const std::optional<std::vector<uint64_t>> known = KnownSumsLocked();
  const uint64_t size = SizeLocked();
  rpc::VolumeOpRequest req;
  auto* c = req.mutable_commit();
  c->set_ino(at_.ino);
  c->set_node(fs_->node_id_);
  c->set_file_id(writing_id_);
  c->set_size(size);
  // From here on, copies of writing_id_ may exist elsewhere: if this commit fails, the bytes
  // written on go under a new id (a copy of the old one must never pass for the new one).
  rekey_ = true;
  // With every block's checksum known (written straight on), the replicas copy while this node
  // syncs: the whole file is offered, and the two run at once. Else: sealed (read for its
  // checksums) first, then copied.
  std::future<absl::StatusOr<std::vector<std::string>>> copies;
  if (known) {
    fs_->store_->Offer(at_.vol_id, writing_id_, fd_, block_size_, *known, size);
    copies = std::async(std::launch::async,
                        [fs = fs_, at = at_, id = writing_id_, bs = block_size_, &known, size] {
                          return fs->Replicate(at, id, size, bs, *known);
                        });
  } else {
    fs_->store_->Withdraw(at_.vol_id, writing_id_);  // blocks offered before were rewritten
  }
  absl::StatusOr<std::vector<uint64_t>> sealed =
      fs_->store_->Seal(at_.vol_id, writing_id_, fd_, block_size_, known ? &*known : nullptr);
  absl::StatusOr<std::vector<std::string>> holders =
      copies.valid() ? copies.get()
      : sealed.ok()  ? fs_->Replicate(at_, writing_id_, size, block_size_, *sealed)
                     : sealed.status();
  fs_->store_->Withdraw(at_.vol_id, writing_id_);  // sealed: served as whole contents now
  absl::StatusOr<rpc::VolumeOpReply> r;
  if (!sealed.ok()) {
    r = sealed.status();
  } else if (holders.ok()) {
    for (uint64_t s : *sealed) c->add_checksums(s);
    for (auto& h : *holders) c->add_holders(std::move(h));
    c->set_keep_lease(keep_lease);
    r = fs_->Op(at_, req);
  } else {
    r = holders.status();
  }
  if (!r.ok()) {
    (void)RekeyLocked();  // or at the next commit; the staging file stays either way
    return r.status();
  }
  rekey_ = false;
  CloseStagingLocked();
  whole_id_ = writing_id_;
  writing_id_ = r->inode().writing_file_id();
  renewed_ms_ = NowMs();
  dirty_ = false;
  auto w = fs_->store_->Open(at_.vol_id, whole_id_);
  if (!w.ok()) return ErrnoStatus(EIO, std::string(w.status().message()));
  whole_ = *w;
  checked_.assign(whole_->sums.size(), true);  // just written and checksummed here
  if (fs_->uploader_ != nullptr) fs_->uploader_->Nudge();
  return absl::OkStatus();
}

// ---- the file system ----

bool VolumeFs::IsVolumeIno(uint64_t ino) {
  uint32_t ds, view;
  uint64_t id;
  SplitIno(ino, &ds, &view, &id);
  return view == kView && ds != 0;
}

VolumeFs::VolumeFs(meta::MetaClient* meta, VolumeStore* store, transport::BlockTransport* transport,
                   std::string node_id, VolumeUploader* uploader)
    : meta_(meta),
      store_(store),
      transport_(transport),
      node_id_(std::move(node_id)),
      uploader_(uploader) {}

std::vector<rpc::Volume> VolumeFs::Volumes() {
  {
    absl::MutexLock lock(&mu_);
    if (listed_at_ms_ != 0 && NowMs() - listed_at_ms_ < kListEveryMs) return volumes_;
  }
  auto list = meta_->ListVolumes();
  absl::MutexLock lock(&mu_);
  if (list.ok()) volumes_ = std::move(*list);  // meta away: the last list stands
  listed_at_ms_ = NowMs();
  return volumes_;
}

Attr VolumeFs::VolumeRootAttr(const rpc::Volume& v) {
  Attr a;
  a.ino = MakeIno(v.id(), kView, meta::kVolumeRootIno);
  a.mode = S_IFDIR | 0755;
  a.nlink = 2;
  a.mtime_ns = v.created_unix_ms() * 1'000'000;
  return a;
}

absl::StatusOr<Entry> VolumeFs::LookupVolume(const std::string& name) {
  for (const auto& v : Volumes()) {
    if (v.name() == name) return GetAttr(VolumeRootAttr(v).ino);
  }
  return absl::NotFoundError(absl::StrCat("no volume '", name, "'"));
}

absl::StatusOr<VolumeFs::Ref> VolumeFs::Resolve(uint64_t fuse_ino) {
  uint32_t ds, view;
  uint64_t ino;
  SplitIno(fuse_ino, &ds, &view, &ino);
  for (int pass = 0; pass < 2; ++pass) {
    {
      absl::MutexLock lock(&mu_);
      for (const auto& v : volumes_) {
        if (v.id() == ds) return Ref{ds, v.name(), ino};
      }
      if (pass == 1) break;
      listed_at_ms_ = 0;  // an unknown id: ask meta again
    }
    Volumes();
  }
  return ErrnoStatus(ENOENT, absl::StrCat("no volume of id ", ds));
}

absl::Status VolumeFs::ReleaseLease(const Ref& at) {
  rpc::VolumeOpRequest req;
  req.mutable_release()->set_ino(at.ino);
  req.mutable_release()->set_node(node_id_);
  return Op(at, req).status();
}

Entry VolumeFs::EntryOf(const Ref& at, const rpc::VolumeInode& n) {
  Entry e;
  e.timeout_s = 0;  // every node must see a commit at its next open: always ask meta
  Attr& a = e.attr;
  a.ino = MakeIno(at.vol_id, kView, n.ino());
  a.mode = n.mode();
  a.size = n.size();
  a.nlink = n.type() == rpc::FileEntry::DIR ? 2 : 1;
  a.uid = n.uid();
  a.gid = n.gid();
  a.mtime_ns = n.mtime_ns();
  absl::MutexLock lock(&mu_);
  // This node's writer knows a size meta does not yet.
  for (auto [it, end] = writers_.equal_range(a.ino); it != end; ++it) {
    a.size = it->second->size_.load();
  }
  return e;
}

void VolumeFs::Forget(File* f) {
  absl::MutexLock lock(&mu_);
  for (auto [it, end] = writers_.equal_range(f->fuse_ino_); it != end; ++it) {
    if (it->second == f) {
      writers_.erase(it);
      if (uploader_ != nullptr) uploader_->Foreground(-1);
      return;
    }
  }
}

absl::StatusOr<std::unique_ptr<VolumeFs::File>> VolumeFs::OpenForWrite(const Ref& at,
                                                                       const rpc::VolumeInode& n,
                                                                       uint64_t block_size,
                                                                       bool truncate) {
  const uint64_t fuse_ino = MakeIno(at.vol_id, kView, n.ino());
  auto f = std::make_unique<File>(this, at, fuse_ino, block_size);
  f->writable_ = true;
  {
    absl::MutexLock lock(&f->mu_);
    f->writing_id_ = n.writing_file_id();
    if (!truncate && n.file_id() != 0) {
      ASSIGN_OR_RETURN(f->whole_, Local(at.vol_id, n, block_size));
      f->whole_id_ = n.file_id();
    }
    RETURN_IF_ERROR(f->StageLocked());
    // A truncation of contents is a change to commit; a new empty file is committed too, so
    // that its creation is a commit like any other.
    f->dirty_ = truncate || n.file_id() == 0;
  }
  absl::MutexLock lock(&mu_);
  writers_.emplace(fuse_ino, f.get());
  if (uploader_ != nullptr) uploader_->Foreground(+1);
  return f;
}

absl::StatusOr<std::unique_ptr<FileSystem::FileHandle>> VolumeFs::Open(uint64_t ino, int flags) {
  ASSIGN_OR_RETURN(Ref at, Resolve(ino));
  const bool write = (flags & O_ACCMODE) != O_RDONLY;
  rpc::VolumeOpRequest req;
  if (write) {
    req.mutable_open_write()->set_ino(at.ino);
    req.mutable_open_write()->set_node(node_id_);
  } else {
    req.mutable_getattr()->set_ino(at.ino);
  }
  ASSIGN_OR_RETURN(rpc::VolumeOpReply r, Op(at, req));
  const rpc::VolumeInode& n = r.inode();
  if (n.type() == rpc::FileEntry::DIR) return ErrnoStatus(EISDIR, "is a directory");
  if (write) {
    auto f = OpenForWrite(at, n, r.block_size(), (flags & O_TRUNC) != 0);
    if (!f.ok()) {
      (void)ReleaseLease(at);
      return f.status();
    }
    return std::unique_ptr<FileSystem::FileHandle>(std::move(*f));
  }
  auto f = std::make_unique<File>(this, at, ino, r.block_size());
  if (n.file_id() != 0) {
    // Here already; or read from the holders as the reader reads (VolumeStream, no copy here);
    // or, when only the origin has them, copied from it while the reader reads (each block as
    // it lands), so that the next reader here does not read the origin again.
    absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> whole =
        store_->Open(at.vol_id, n.file_id());
    std::shared_ptr<Copy> copy;
    if (!whole.ok()) {
      ASSIGN_OR_RETURN(CopyPlan plan, PlanCopy(at.vol_id, n, r.block_size()));
      f->copying_ = true;
      if (!plan.peers.empty()) {
        std::vector<VolumeStream::Source> sources;
        for (const auto& peer : plan.peers) {
          sources.push_back(
              {absl::StrCat("node ", peer), FromPeers(at.vol_id, n.file_id(), {peer})});
        }
        if (!plan.origin_path.empty()) {
          sources.push_back(
              {"the origin", FromOrigin(plan.origin, plan.origin_path, r.block_size())});
        }
        f->stream_ = std::make_unique<VolumeStream>(n.name(), n.file_id(), n.size(), r.block_size(),
                                                    plan.sums, std::move(sources));
        return std::unique_ptr<FileSystem::FileHandle>(std::move(f));
      }
      ASSIGN_OR_RETURN(copy, StartCopy(at.vol_id, n, r.block_size(), std::move(plan)));
    }
    absl::MutexLock lock(&f->mu_);
    f->whole_id_ = n.file_id();
    if (copy != nullptr) {
      f->copy_ = std::move(copy);
      f->copy_size_ = n.size();
    } else {
      f->whole_ = std::move(*whole);
      f->checked_.assign(f->whole_->sums.size(), f->whole_->verified);
    }
  }
  return std::unique_ptr<FileSystem::FileHandle>(std::move(f));
}

absl::StatusOr<std::pair<Entry, std::unique_ptr<FileSystem::FileHandle>>> VolumeFs::Create(
    uint64_t parent, const std::string& name, uint32_t mode, int flags, uint32_t uid,
    uint32_t gid) {
  ASSIGN_OR_RETURN(Ref at, Resolve(parent));
  rpc::VolumeOpRequest req;
  auto* m = req.mutable_create();
  m->set_parent(at.ino);
  m->set_name(name);
  m->set_mode(mode);
  m->set_uid(uid);
  m->set_gid(gid);
  m->set_node(node_id_);
  m->set_exclusive((flags & O_EXCL) != 0);
  ASSIGN_OR_RETURN(rpc::VolumeOpReply r, Op(at, req));
  Ref file{at.vol_id, at.volume, r.inode().ino()};
  auto f = OpenForWrite(file, r.inode(), r.block_size(), (flags & O_TRUNC) != 0);
  if (!f.ok()) {
    (void)ReleaseLease(file);
    return f.status();
  }
  Entry e = EntryOf(file, r.inode());
  return std::make_pair(e, std::unique_ptr<FileSystem::FileHandle>(std::move(*f)));
}

absl::StatusOr<size_t> VolumeFs::Write(uint64_t /*ino*/, FileSystem::FileHandle* handle,
                                       uint64_t offset, const char* data, size_t size) {
  auto* f = static_cast<File*>(handle);
  if (f == nullptr || !f->writable_) return ErrnoStatus(EBADF, "not open for writing");
  absl::MutexLock lock(&f->mu_);
  RETURN_IF_ERROR(f->RenewLocked());
  RETURN_IF_ERROR(f->StageLocked());
  if (const uint64_t end = offset + size, now = f->size_.load(); end > now) {
    RETURN_IF_ERROR(store_->Reserve(end - now));  // waits for room, then ENOSPC
  }
  if (!PwriteFull(f->fd_, offset, data, size)) {
    const int err = errno == ENOSPC ? ENOSPC : EIO;
    const std::string why = strerror(errno);
    // What was reserved past the bytes already there is given back (a failed write may have
    // written part: the file's size says how far).
    struct stat st;
    const uint64_t now = fstat(f->fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    if (const uint64_t had = f->size_.load(); offset + size > std::max(had, now)) {
      store_->Unreserve(offset + size - std::max(had, now));
    }
    f->seq_ok_ = false;  // what a failed write left is not known
    return ErrnoStatus(err, absl::StrCat("volume write: ", why));
  }
  const size_t done = size;
  f->HashLocked(offset, data, size);
  if (f->seq_ok_)
    SendAhead(f->at_, f->writing_id_, f->fd_, f->block_size_, f->seq_sums_, &f->ahead_);
  f->dirty_ = true;
  f->size_ = std::max(f->size_.load(), offset + size);
  return done;
}

absl::Status VolumeFs::Commit(uint64_t /*ino*/, FileSystem::FileHandle* handle) {
  auto* f = static_cast<File*>(handle);
  if (f == nullptr || !f->writable_) return absl::OkStatus();
  absl::MutexLock lock(&f->mu_);
  return f->CommitLocked(/*keep_lease=*/true);
}

absl::StatusOr<Entry> VolumeFs::SetAttr(uint64_t ino, FileSystem::FileHandle* handle,
                                        const FileSystem::SetAttrs& attrs) {
  ASSIGN_OR_RETURN(Ref at, Resolve(ino));
  if (attrs.size) {
    std::unique_ptr<FileSystem::FileHandle> own;
    auto* f = static_cast<File*>(handle);
    if (f == nullptr || !f->writable_) {  // truncate(2) of a file not open here
      ASSIGN_OR_RETURN(own, Open(ino, O_WRONLY | (*attrs.size == 0 ? O_TRUNC : 0)));
      f = static_cast<File*>(own.get());
    }
    absl::MutexLock lock(&f->mu_);
    RETURN_IF_ERROR(f->StageLocked());
    if (*attrs.size > f->size_.load()) RETURN_IF_ERROR(store_->Reserve(*attrs.size - f->size_));
    f->seq_ok_ = f->seq_ok_ && *attrs.size == f->seq_end_;  // else: read again at the commit
    if (ftruncate(f->fd_, static_cast<off_t>(*attrs.size)) != 0) {
      return ErrnoStatus(errno == ENOSPC ? ENOSPC : EIO, "volume truncate failed");
    }
    if (*attrs.size < f->size_.load()) store_->Unreserve(f->size_.load() - *attrs.size);
    f->dirty_ = true;
    f->size_ = *attrs.size;
    if (own != nullptr) RETURN_IF_ERROR(f->CommitLocked(/*keep_lease=*/false));
  }
  if (attrs.mode || attrs.mtime_ns || attrs.uid || attrs.gid) {
    rpc::VolumeOpRequest req;
    auto* m = req.mutable_setattr();
    m->set_ino(at.ino);
    if (attrs.mode) {
      m->set_set_mode(true);
      m->set_mode(*attrs.mode);
    }
    if (attrs.mtime_ns) {
      m->set_set_mtime(true);
      m->set_mtime_ns(*attrs.mtime_ns);
    }
    if (attrs.uid || attrs.gid) {
      ASSIGN_OR_RETURN(Entry now, GetAttr(ino));
      m->set_set_owner(true);
      m->set_uid(attrs.uid.value_or(now.attr.uid));
      m->set_gid(attrs.gid.value_or(now.attr.gid));
    }
    RETURN_IF_ERROR(Op(at, req).status());
  }
  return GetAttr(ino);
}

}  // namespace ember::cachefs
