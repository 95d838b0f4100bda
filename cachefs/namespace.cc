#include "cachefs/namespace.h"

#include <spdlog/spdlog.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cachefs/manifest_cache.h"
#include "common/memory.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {
constexpr auto kListTtl = std::chrono::seconds(2);
}

std::string DatasetView::PathOf(uint64_t file_id) const {
  std::vector<std::string_view> parts;
  for (auto n = Get(file_id); n && n->parent != 0; n = Get(n->parent)) parts.push_back(n->name);
  std::string path;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (!path.empty()) path += '/';
    path.append(*it);
  }
  return path;
}

bool ManifestTable::AddString(std::string_view s, uint32_t* off) {
  if (s.size() > 0xffff || arena_.size() + s.size() > 0xffffffffull) return false;
  *off = static_cast<uint32_t>(arena_.size());
  arena_.append(s);
  return true;
}

bool ManifestTable::Append(const rpc::FileEntry& e) {
  if (e.file_id() != entries_.size() + 1 || entries_.size() >= 0xffffffffull) return false;
  if (entries_.empty()) {
    if (e.parent_id() != 0 || e.type() != rpc::FileEntry::DIR) return false;
  } else {
    if (e.parent_id() == 0 || e.parent_id() > entries_.size() ||
        entries_[e.parent_id() - 1].type != rpc::FileEntry::DIR) {
      return false;
    }
    const std::string& n = e.name();
    if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos ||
        n.find('\0') != std::string::npos) {
      return false;
    }
  }
  const size_t arena_before = arena_.size();
  Packed p{};
  p.size = e.size();
  p.mtime_ns = e.mtime_ns();
  p.parent = static_cast<uint32_t>(e.parent_id());
  p.type = static_cast<uint8_t>(e.type());
  p.name_len = static_cast<uint16_t>(e.name().size());
  bool fits = AddString(e.name(), &p.name_off);
  Extra x{};
  const bool extra = !e.link_target().empty() || !e.etag().empty();
  if (extra) {
    fits = fits && AddString(e.link_target(), &x.link_off) && AddString(e.etag(), &x.etag_off);
    x.link_len = static_cast<uint16_t>(e.link_target().size());
    x.etag_len = static_cast<uint16_t>(e.etag().size());
  }
  if (!fits) {
    arena_.resize(arena_before);
    return false;
  }
  auto [it, added] =
      attr_ids_.try_emplace({e.mode(), e.uid(), e.gid()}, static_cast<uint32_t>(attrs_.size()));
  if (added) attrs_.push_back({e.mode(), e.uid(), e.gid()});
  p.attr = it->second;
  if (p.type == rpc::FileEntry::DIR) {
    p.aux = dirs_++;
  } else if (extra) {
    extras_.push_back(x);
    p.aux = static_cast<uint32_t>(extras_.size());
  }
  entries_.push_back(p);
  return true;
}

void ManifestTable::Finish() {
  // Pre-order with sorted names: a directory's children, taken in id order, are in name order.
  dir_begin_.assign(dirs_ + 1, 0);
  for (size_t i = 1; i < entries_.size(); i++) dir_begin_[entries_[entries_[i].parent - 1].aux]++;
  uint32_t sum = 0;
  for (auto& b : dir_begin_) {
    uint32_t count = b;
    b = sum;
    sum += count;
  }
  kids_.assign(sum, 0);
  std::vector<uint32_t> next(dir_begin_.begin(), dir_begin_.end() - 1);
  for (size_t i = 1; i < entries_.size(); i++) {
    kids_[next[entries_[entries_[i].parent - 1].aux]++] = static_cast<uint32_t>(i + 1);
  }
  entries_.shrink_to_fit();
  arena_.shrink_to_fit();
  extras_.shrink_to_fit();
  attr_ids_ = {};
}

std::optional<FsNode> ManifestTable::Get(uint64_t file_id) const {
  if (file_id < 1 || file_id > entries_.size()) return std::nullopt;
  const Packed& p = entries_[file_id - 1];
  FsNode n;
  n.parent = p.parent;
  n.name = std::string_view(arena_).substr(p.name_off, p.name_len);
  n.type = p.type;
  n.size = p.size;
  const Attrs& a = attrs_[p.attr];
  n.mode = a.mode;
  n.uid = a.uid;
  n.gid = a.gid;
  n.mtime_ns = p.mtime_ns;
  if (p.type == rpc::FileEntry::DIR) {
    if (p.aux + 1 < dir_begin_.size()) {
      n.children = std::span<const uint32_t>(kids_).subspan(
          dir_begin_[p.aux], dir_begin_[p.aux + 1] - dir_begin_[p.aux]);
    }
  } else if (p.aux != 0) {
    const Extra& x = extras_[p.aux - 1];
    n.link_target = std::string_view(arena_).substr(x.link_off, x.link_len);
    n.etag = std::string_view(arena_).substr(x.etag_off, x.etag_len);
  }
  return n;
}

size_t ManifestTable::MemoryBytes() const {
  return entries_.capacity() * sizeof(Packed) + arena_.capacity() +
         attrs_.capacity() * sizeof(Attrs) + extras_.capacity() * sizeof(Extra) +
         (dir_begin_.capacity() + kids_.capacity()) * 4;
}

Namespace::Namespace(meta::MetaClient* meta, ManifestCache* disk) : meta_(meta), disk_(disk) {
  if (disk_ != nullptr) {
    auto saved = disk_->LoadDatasets();
    if (saved.ok()) datasets_ = std::move(*saved);
  }
}

std::vector<rpc::Dataset> Namespace::Datasets(bool force_refresh) {
  absl::MutexLock lock(&list_mu_);
  auto now = std::chrono::steady_clock::now();
  if (force_refresh || now - listed_at_ >= kListTtl) {
    auto list = meta_->ListDatasets();
    if (list.ok()) {
      bool changed = list->size() != datasets_.size();
      for (size_t i = 0; !changed && i < list->size(); i++) {
        changed = (*list)[i].SerializeAsString() != datasets_[i].SerializeAsString();
      }
      datasets_ = std::move(*list);
      if (changed && disk_ != nullptr) {
        if (auto s = disk_->SaveDatasets(datasets_); !s.ok()) {
          spdlog::warn("node: cannot keep a copy of the dataset list: {}",
                       std::string(s.message()));
        }
      }
    } else if (listed_at_ == std::chrono::steady_clock::time_point{}) {
      spdlog::warn("node: cannot list datasets: {}{}", std::string(list.status().message()),
                   datasets_.empty() ? "" : "; using the copy kept on disk");
    }
    listed_at_ = now;
  }
  return datasets_;
}

absl::StatusOr<rpc::Dataset> Namespace::DatasetById(uint32_t id) {
  for (auto& ds : Datasets()) {
    if (ds.id() == id) return ds;
  }
  return absl::NotFoundError(absl::StrCat("no dataset with id ", id));
}

absl::StatusOr<std::shared_ptr<const DatasetView>> Namespace::ViewByName(const std::string& name) {
  std::string base = name;
  uint32_t view = 0;
  if (size_t at = name.find('@'); at != std::string::npos) {
    base = name.substr(0, at);
    if (!absl::SimpleAtoi(name.substr(at + 1), &view) || view == 0 || view > 0xffff) {
      return absl::NotFoundError(absl::StrCat("no dataset entry '", name, "'"));
    }
  }
  // A name not in the cached list may have just been added or refreshed: look again once.
  for (bool force : {false, true}) {
    for (auto& ds : Datasets(force)) {
      if (ds.name() != base) continue;
      bool has = view == 0;
      for (const auto& v : ds.versions()) has |= v.version() == view;
      if (has) return Load(ds, view);
    }
  }
  return absl::NotFoundError(absl::StrCat("no dataset entry '", name, "'"));
}

absl::StatusOr<std::shared_ptr<const DatasetView>> Namespace::ViewByIno(uint64_t ino) {
  uint32_t ds_id, view;
  uint64_t file_id;
  SplitIno(ino, &ds_id, &view, &file_id);
  {
    absl::ReaderMutexLock lock(&views_mu_);
    auto it = views_.find({ds_id, view});
    if (it != views_.end()) return it->second;
  }
  // Not loaded yet (a restarted agent asked about an inode the kernel still knows).
  auto ds = DatasetById(ds_id);
  if (!ds.ok()) return ds.status();
  return Load(*ds, view);
}

size_t Namespace::SyncCopies(uint64_t max_entries) {
  if (disk_ == nullptr) return 0;
  size_t copied = 0;
  for (const rpc::Dataset& ds : Datasets(/*force_refresh=*/true)) {  // a changed list is saved
    const uint32_t version = ds.latest_version();
    if (version == 0 || disk_->HasManifest(ds.id(), version)) continue;
    uint64_t entries = 0;
    for (const auto& info : ds.versions()) {
      if (info.version() == version) entries = info.max_file_id();
    }
    absl::MutexLock load_lock(&load_mu_);  // one manifest load at a time (and one writer of it)
    if (entries > max_entries) {
      if (too_large_.insert({ds.id(), version}).second) {
        spdlog::info(
            "node: not keeping a copy of {} version {} ahead of use ({} entries, more than {}); "
            "it is kept once used",
            ds.name(), version, entries, max_entries);
      }
      continue;
    }
    if (LoadedVersion(ds.id(), version) != nullptr) continue;  // copied when it was loaded
    auto v = LoadFromMeta(ds, version);
    if (!v.ok()) {
      spdlog::warn("node: cannot copy a manifest ahead of use: {}",
                   std::string(v.status().message()));
      break;  // meta is away or failing: next round
    }
    if (auto s = disk_->SaveManifest(**v); !s.ok()) {
      spdlog::warn("node: cannot keep a copy of the manifest of {}: {}", ds.name(),
                   std::string(s.message()));
      continue;
    }
    spdlog::info("node: kept a copy of {} version {} ({} entries) for when meta is away", ds.name(),
                 version, (*v)->size());
    copied++;
  }
  if (copied > 0) ReleaseFreeMemory();
  return copied;
}

std::shared_ptr<const DatasetView> Namespace::LoadedVersion(uint32_t dataset_id, uint32_t version) {
  absl::ReaderMutexLock lock(&views_mu_);
  for (const auto& [key, v] : views_) {
    if (key.first == dataset_id && v->version == version) return v;
  }
  return nullptr;
}

Namespace::Memory Namespace::GetMemory() {
  Memory m;
  std::set<const ManifestTable*> seen;
  absl::ReaderMutexLock lock(&views_mu_);
  for (const auto& [key, v] : views_) {
    if (!seen.insert(v->files.get()).second) continue;
    m.entries += v->files->size();
    m.bytes += v->files->MemoryBytes();
  }
  return m;
}

absl::StatusOr<std::shared_ptr<const DatasetView>> Namespace::Load(const rpc::Dataset& ds,
                                                                   uint32_t view) {
  absl::MutexLock load_lock(&load_mu_);
  {
    absl::ReaderMutexLock lock(&views_mu_);
    auto it = views_.find({ds.id(), view});
    if (it != views_.end()) return it->second;
  }
  const uint32_t version = view == 0 ? ds.latest_version() : view;
  std::shared_ptr<DatasetView> v;
  // The other view of the same version (NAME and NAME@V) shares its table.
  if (auto other = LoadedVersion(ds.id(), version)) v = std::make_shared<DatasetView>(*other);
  if (v == nullptr && disk_ != nullptr) {
    auto saved = disk_->LoadManifest(ds.id(), version);
    if (saved.ok()) {
      v = std::move(*saved);
    } else if (!absl::IsNotFound(saved.status())) {
      spdlog::warn("node: {}; loading it from meta", std::string(saved.status().message()));
    }
  }
  if (v == nullptr) {
    ASSIGN_OR_RETURN(v, LoadFromMeta(ds, version));
    if (disk_ != nullptr) {
      if (auto s = disk_->SaveManifest(*v); !s.ok()) {
        spdlog::warn("node: cannot keep a copy of the manifest of {}: {}", ds.name(),
                     std::string(s.message()));
      }
    }
    spdlog::info("node: loaded {} version {} ({} entries, {} KiB in memory)", ds.name(), v->version,
                 v->size(), v->files->MemoryBytes() >> 10);
  }
  v->view = view;
  {
    absl::MutexLock lock(&views_mu_);
    views_[{ds.id(), view}] = v;
  }
  ReleaseFreeMemory();  // what building the table took beyond the table
  return std::shared_ptr<const DatasetView>(v);
}

absl::StatusOr<std::shared_ptr<DatasetView>> Namespace::LoadFromMeta(const rpc::Dataset& ds,
                                                                     uint32_t version) {
  auto v = std::make_shared<DatasetView>();
  v->name = ds.name();
  v->dataset_id = ds.id();
  v->version = version;
  v->origin = ds.origin();
  v->block_size = ds.block_size();
  for (const auto& info : ds.versions()) {
    if (info.version() == version) v->files->Reserve(info.max_file_id());
  }
  bool shaped = true;
  absl::Status st = meta_->ForEachManifestEntry(ds.name(), version, [&](const rpc::FileEntry& e) {
    if (shaped) shaped = v->Append(e);
  });
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot load manifest of ", ds.name(), " version ",
                                               version, ": ", st.message()));
  }
  if (!shaped || v->size() == 0) {
    return absl::DataLossError(absl::StrCat("manifest of ", ds.name(), " is malformed"));
  }
  v->Finish();
  return v;
}

}  // namespace ember::cachefs
