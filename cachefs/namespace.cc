#include "cachefs/namespace.h"

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cachefs/manifest_cache.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {
constexpr auto kListTtl = std::chrono::seconds(2);
}

std::string DatasetView::PathOf(uint64_t file_id) const {
  std::vector<const std::string*> parts;
  for (const FsNode* n = Get(file_id); n != nullptr && n->parent != 0; n = Get(n->parent)) {
    parts.push_back(&n->name);
  }
  std::string path;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (!path.empty()) path += '/';
    path += **it;
  }
  return path;
}

bool DatasetView::Append(const rpc::FileEntry& e) {
  if (e.file_id() != nodes.size() + 1) return false;
  if (nodes.empty()) {
    if (e.parent_id() != 0 || e.type() != rpc::FileEntry::DIR) return false;
  } else {
    if (e.parent_id() == 0 || e.parent_id() > nodes.size() ||
        nodes[e.parent_id() - 1].type != rpc::FileEntry::DIR) {
      return false;
    }
    const std::string& n = e.name();
    if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos ||
        n.find('\0') != std::string::npos) {
      return false;
    }
  }
  FsNode n;
  n.parent = e.parent_id();
  n.name = e.name();
  n.type = static_cast<uint8_t>(e.type());
  n.size = e.size();
  n.mode = e.mode();
  n.uid = e.uid();
  n.gid = e.gid();
  n.mtime_ns = e.mtime_ns();
  n.link_target = e.link_target();
  n.etag = e.etag();
  nodes.push_back(std::move(n));
  // Pre-order with sorted children: appending keeps each child list sorted.
  if (e.parent_id() != 0) nodes[e.parent_id() - 1].children.push_back(e.file_id());
  return true;
}

uint64_t MakeIno(uint32_t dataset_id, uint32_t view, uint64_t file_id) {
  return (static_cast<uint64_t>(dataset_id) << 48) | (static_cast<uint64_t>(view & 0xffff) << 32) |
         (file_id & 0xffffffffull);
}

void SplitIno(uint64_t ino, uint32_t* dataset_id, uint32_t* view, uint64_t* file_id) {
  *dataset_id = static_cast<uint32_t>(ino >> 48);
  *view = static_cast<uint32_t>((ino >> 32) & 0xffff);
  *file_id = ino & 0xffffffffull;
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
  if (disk_ != nullptr) {
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
    spdlog::info("node: loaded {} version {} ({} entries)", ds.name(), v->version, v->nodes.size());
  }
  v->view = view;
  absl::MutexLock lock(&views_mu_);
  views_[{ds.id(), view}] = v;
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
    if (info.version() == version) v->nodes.reserve(info.max_file_id());
  }
  bool shaped = true;
  absl::Status st = meta_->ForEachManifestEntry(ds.name(), version, [&](const rpc::FileEntry& e) {
    if (shaped) shaped = v->Append(e);
  });
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot load manifest of ", ds.name(), " version ",
                                               version, ": ", st.message()));
  }
  if (!shaped || v->nodes.empty()) {
    return absl::DataLossError(absl::StrCat("manifest of ", ds.name(), " is malformed"));
  }
  return v;
}

}  // namespace ember::cachefs
