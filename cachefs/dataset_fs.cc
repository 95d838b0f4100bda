#include "cachefs/dataset_fs.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "cachefs/fuse/errno.h"

namespace ember::cachefs {

DatasetFs::DatasetFs(Namespace* ns, ReadPath* read_path, VolumeFs* volumes)
    : ns_(ns), read_path_(read_path), volumes_(volumes) {}

Attr DatasetFs::RootAttr() {
  Attr a;
  a.ino = kRootIno;
  a.mode = S_IFDIR | 0555;
  a.nlink = 2;
  return a;
}

Attr DatasetFs::AttrOf(const DatasetView& view, uint64_t file_id, const FsNode& node) {
  Attr a;
  a.ino = MakeIno(view.dataset_id, view.view, file_id);
  a.mode = node.mode;
  if (file_id == 1) a.mode = (a.mode & ~07222u);  // the dataset root is read-only too
  a.mode &= ~0222u;                               // nothing in a dataset is writable
  a.size = node.size;
  a.nlink = node.type == rpc::FileEntry::DIR ? 2 : 1;
  a.uid = node.uid;
  a.gid = node.gid;
  a.mtime_ns = node.mtime_ns;
  return a;
}

FileRef MakeFileRef(const DatasetView& view, uint64_t file_id) {
  const FsNode node = *view.Get(file_id);
  FileRef r;
  r.dataset_id = view.dataset_id;
  r.version = view.version;
  r.file_id = file_id;
  r.block_size = view.block_size;
  r.dataset_name = view.name;
  r.origin.root = view.origin;
  r.origin.path = view.PathOf(file_id);
  r.origin.size = node.size;
  r.origin.mtime_ns = node.mtime_ns;
  r.origin.etag = std::string(node.etag);
  return r;
}

absl::StatusOr<std::pair<std::shared_ptr<const DatasetView>, FsNode>> DatasetFs::Resolve(
    uint64_t ino) {
  auto view = ns_->ViewByIno(ino);
  if (!view.ok()) return view.status();
  uint32_t ds, v;
  uint64_t file_id;
  SplitIno(ino, &ds, &v, &file_id);
  auto node = (*view)->Get(file_id);
  if (!node) return absl::NotFoundError(absl::StrCat("no inode ", ino));
  return std::make_pair(*view, *node);
}

absl::StatusOr<Entry> DatasetFs::Lookup(uint64_t parent, const std::string& name) {
  if (IsVolume(parent)) return volumes_->Lookup(parent, name);
  if (parent == kRootIno) {
    auto view = ns_->ViewByName(name);
    if (absl::IsNotFound(view.status()) && volumes_ != nullptr) {
      if (auto vol = volumes_->LookupVolume(name); !absl::IsNotFound(vol.status())) return vol;
    }
    if (absl::IsNotFound(view.status())) return AbsentEntry(std::string(view.status().message()));
    if (!view.ok()) return view.status();
    auto root = (*view)->Get(1);
    return Entry{AttrOf(**view, 1, *root), kRootTimeout};
  }
  auto r = Resolve(parent);
  if (!r.ok()) return r.status();
  const auto& view = std::get<0>(*r);  // not a structured binding: the lambda captures it
  const FsNode& dir = std::get<1>(*r);
  if (dir.type != rpc::FileEntry::DIR) return ErrnoStatus(ENOTDIR, "not a directory");
  auto it = std::lower_bound(dir.children.begin(), dir.children.end(), name,
                             [&](uint32_t id, const std::string& n) { return view->Name(id) < n; });
  if (it == dir.children.end() || view->Name(*it) != name) {
    return AbsentEntry(absl::StrCat("no entry '", name, "'"));
  }
  return Entry{AttrOf(*view, *it, *view->Get(*it)), kImmutableTimeout};
}

absl::StatusOr<Entry> DatasetFs::GetAttr(uint64_t ino) {
  if (ino == kRootIno) return Entry{RootAttr(), kRootTimeout};
  if (IsVolume(ino)) return volumes_->GetAttr(ino);
  auto r = Resolve(ino);
  if (!r.ok()) return r.status();
  uint32_t ds, v;
  uint64_t file_id;
  SplitIno(ino, &ds, &v, &file_id);
  return Entry{AttrOf(*r->first, file_id, r->second),
               file_id == 1 ? kRootTimeout : kImmutableTimeout};
}

absl::Status DatasetFs::ReadDir(
    uint64_t ino, uint64_t offset,
    const std::function<bool(const std::string&, const Attr&, uint64_t)>& fn) {
  if (IsVolume(ino)) return volumes_->ReadDir(ino, offset, fn);
  // Offsets: 1 after ".", 2 after "..", 2 + i after the i-th (1-based) child.
  Attr self, parent = RootAttr();
  std::shared_ptr<const DatasetView> view;
  FsNode dir;
  std::vector<rpc::Dataset> datasets;
  if (ino == kRootIno) {
    self = RootAttr();
    datasets = ns_->Datasets();
  } else {
    auto r = Resolve(ino);
    if (!r.ok()) return r.status();
    view = r->first;
    dir = r->second;
    if (dir.type != rpc::FileEntry::DIR) return ErrnoStatus(ENOTDIR, "not a directory");
    uint32_t ds, v;
    uint64_t file_id;
    SplitIno(ino, &ds, &v, &file_id);
    self = AttrOf(*view, file_id, dir);
    if (dir.parent != 0) parent = AttrOf(*view, dir.parent, *view->Get(dir.parent));
  }
  if (offset < 1 && !fn(".", self, 1)) return absl::OkStatus();
  if (offset < 2 && !fn("..", parent, 2)) return absl::OkStatus();
  uint64_t i = offset < 2 ? 0 : offset - 2;
  if (ino == kRootIno) {
    for (; i < datasets.size(); i++) {
      Attr a;
      a.ino = MakeIno(datasets[i].id(), 0, 1);
      a.mode = S_IFDIR | 0555;
      a.complete = false;  // the manifest loads on lookup, not on listing
      if (!fn(datasets[i].name(), a, i + 3)) return absl::OkStatus();
    }
    if (volumes_ == nullptr) return absl::OkStatus();
    // Then the volumes (their offsets follow the datasets').
    const std::vector<rpc::Volume> volumes = volumes_->Volumes();
    for (uint64_t j = i - datasets.size(); j < volumes.size(); j++) {
      Attr a = VolumeFs::VolumeRootAttr(volumes[j]);
      a.complete = false;
      if (!fn(volumes[j].name(), a, datasets.size() + j + 3)) break;
    }
    return absl::OkStatus();
  }
  std::string name;
  for (; i < dir.children.size(); i++) {
    uint64_t id = dir.children[i];
    const FsNode child = *view->Get(id);
    name.assign(child.name);
    if (!fn(name, AttrOf(*view, id, child), i + 3)) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DatasetFs::ReadLink(uint64_t ino) {
  if (IsVolume(ino)) return ErrnoStatus(EINVAL, "not a symlink");
  auto r = Resolve(ino);
  if (!r.ok()) return r.status();
  if (r->second.type != rpc::FileEntry::SYMLINK) return ErrnoStatus(EINVAL, "not a symlink");
  return std::string(r->second.link_target);
}

absl::StatusOr<std::unique_ptr<FileSystem::FileHandle>> DatasetFs::Open(uint64_t ino, int flags) {
  if (IsVolume(ino)) return volumes_->Open(ino, flags);
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC)) {
    return ErrnoStatus(EROFS, "read-only file system");
  }
  if (ino == kRootIno) return ErrnoStatus(EISDIR, "is a directory");
  auto r = Resolve(ino);
  if (!r.ok()) return r.status();
  if (r->second.type == rpc::FileEntry::DIR) return ErrnoStatus(EISDIR, "is a directory");
  if (r->second.type != rpc::FileEntry::FILE) return ErrnoStatus(EINVAL, "not a regular file");
  uint32_t ds, v;
  uint64_t file_id;
  SplitIno(ino, &ds, &v, &file_id);
  return std::make_unique<File>(read_path_->OpenStream(MakeFileRef(*r->first, file_id)));
}

absl::StatusOr<ReadResult> DatasetFs::Read(uint64_t ino, FileHandle* handle, uint64_t offset,
                                           size_t size, char* buf) {
  if (IsVolume(ino)) return volumes_->Read(ino, handle, offset, size, buf);
  std::unique_ptr<ReadStream> rebuilt;
  ReadStream* stream = nullptr;
  if (handle != nullptr) {
    stream = static_cast<File*>(handle)->stream.get();
  } else {
    // A file opened before a restart: a stream of its own for this read, from the inode.
    auto r = Resolve(ino);
    if (!r.ok()) return r.status();
    uint32_t ds, v;
    uint64_t file_id;
    SplitIno(ino, &ds, &v, &file_id);
    rebuilt = read_path_->OpenStream(MakeFileRef(*r->first, file_id));
    stream = rebuilt.get();
  }
  // A small file (ReadPath::Batchable): on a miss, the next small files of its folder come from
  // the origin with it.
  const ReadPath::NextSmallFiles next = [this, ino](size_t max) {
    return NextSmallFiles(ino, max);
  };
  auto r = read_path_->Read(*stream, offset, size, buf, &next);
  // Whatever kept the bytes from us (origin gone, changed, unreachable), the reader sees EIO;
  // the agent's log names the file and the reason.
  if (!r.ok()) return ErrnoStatus(EIO, std::string(r.status().message()));
  return r;
}

std::vector<FileRef> DatasetFs::NextSmallFiles(uint64_t ino, size_t max) {
  std::vector<FileRef> out;
  auto r = Resolve(ino);
  if (!r.ok()) return out;
  const DatasetView& view = *r->first;
  uint32_t ds, v;
  uint64_t file_id;
  SplitIno(ino, &ds, &v, &file_id);
  const std::optional<FsNode> dir =
      r->second.parent == 0 ? std::nullopt : view.Get(r->second.parent);
  if (!dir) return out;
  // The folder's children are in id (= name) order: the ones after this file, as `ls` and
  // `find` list them.
  auto it = std::upper_bound(dir->children.begin(), dir->children.end(), file_id);
  for (; it != dir->children.end() && out.size() < max; ++it) {
    const std::optional<FsNode> n = view.Get(*it);
    if (!n || n->type != rpc::FileEntry::FILE || !ReadPath::Batchable(n->size, view.block_size)) {
      continue;
    }
    out.push_back(MakeFileRef(view, *it));
  }
  return out;
}

absl::StatusOr<FileSystem::Backing> DatasetFs::OpenBacking(uint64_t ino, bool verified_only) {
  if (ino == kRootIno || IsVolume(ino)) return absl::NotFoundError("no backing file");
  auto r = Resolve(ino);
  if (!r.ok()) return r.status();
  if (r->second.type != rpc::FileEntry::FILE) return absl::NotFoundError("not a regular file");
  uint32_t ds, v;
  uint64_t file_id;
  SplitIno(ino, &ds, &v, &file_id);
  return read_path_->HoldFile(MakeFileRef(*r->first, file_id), verified_only);
}

FsStats DatasetFs::StatFs() {
  FsStats s;
  for (const auto& ds : ns_->Datasets()) {
    for (const auto& v : ds.versions()) {
      if (v.version() != ds.latest_version()) continue;
      s.total_bytes += v.bytes();
      s.files += v.files() + v.dirs() + v.symlinks();
    }
  }
  return s;
}

// ---- changes: volumes only ----

absl::StatusOr<std::pair<Entry, std::unique_ptr<FileSystem::FileHandle>>> DatasetFs::Create(
    uint64_t parent, const std::string& name, uint32_t mode, int flags, uint32_t uid,
    uint32_t gid) {
  if (!IsVolume(parent)) return ReadOnly();
  return volumes_->Create(parent, name, mode, flags, uid, gid);
}

absl::StatusOr<Entry> DatasetFs::MkDir(uint64_t parent, const std::string& name, uint32_t mode,
                                       uint32_t uid, uint32_t gid) {
  if (!IsVolume(parent)) return ReadOnly();
  return volumes_->MkDir(parent, name, mode, uid, gid);
}

absl::Status DatasetFs::Unlink(uint64_t parent, const std::string& name) {
  if (!IsVolume(parent)) return ReadOnly();
  return volumes_->Unlink(parent, name);
}

absl::Status DatasetFs::RmDir(uint64_t parent, const std::string& name) {
  if (!IsVolume(parent)) return ReadOnly();
  return volumes_->RmDir(parent, name);
}

absl::Status DatasetFs::Rename(uint64_t parent, const std::string& name, uint64_t new_parent,
                               const std::string& new_name, uint32_t flags) {
  if (!IsVolume(parent) || !IsVolume(new_parent)) {
    return IsVolume(parent) || IsVolume(new_parent) ? ErrnoStatus(EXDEV, "not within a volume")
                                                    : ReadOnly();
  }
  return volumes_->Rename(parent, name, new_parent, new_name, flags);
}

absl::StatusOr<size_t> DatasetFs::Write(uint64_t ino, FileHandle* handle, uint64_t offset,
                                        const char* data, size_t size) {
  if (!IsVolume(ino)) return ReadOnly();
  return volumes_->Write(ino, handle, offset, data, size);
}

absl::Status DatasetFs::Flush(uint64_t ino, FileHandle* handle) {
  return IsVolume(ino) ? volumes_->Commit(ino, handle) : absl::OkStatus();
}

absl::Status DatasetFs::Fsync(uint64_t ino, FileHandle* handle) {
  return IsVolume(ino) ? volumes_->Commit(ino, handle) : absl::OkStatus();
}

absl::StatusOr<Entry> DatasetFs::SetAttr(uint64_t ino, FileHandle* handle, const SetAttrs& attrs) {
  if (!IsVolume(ino)) return ReadOnly();
  return volumes_->SetAttr(ino, handle, attrs);
}

absl::StatusOr<std::string> DatasetFs::GetXattr(uint64_t ino, const std::string& name) {
  if (!IsVolume(ino)) return NoData();
  return volumes_->GetXattr(ino, name);
}

bool DatasetFs::Writable(uint64_t ino) { return IsVolume(ino); }

}  // namespace ember::cachefs
