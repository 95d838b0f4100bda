#include "meta/catalog.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "common/units.h"
#include "meta/manifest.h"
#include "origin/origin.h"

namespace ember::meta {
namespace {

// Pulls entries of a stored manifest version in id order (= ComparePaths order), with paths.
class StoredStream {
 public:
  StoredStream(MetaStore* store, uint32_t ds, uint32_t ver) : store_(store), ds_(ds), ver_(ver) {}
  bool Next(std::string* path, rpc::FileEntry* e) {
    if (pos_ == page_.size()) {
      if (done_) return false;
      auto page = store_->ReadManifest(ds_, ver_, after_, 4096);
      if (!page.ok() || page->empty()) {
        done_ = true;
        return false;
      }
      page_ = std::move(*page);
      pos_ = 0;
      after_ = page_.back().file_id();
    }
    *e = page_[pos_++];
    auto parent = dirs_.find(e->parent_id());
    *path = parent == dirs_.end() || parent->second.empty()
                ? e->name()
                : absl::StrCat(parent->second, "/", e->name());
    if (e->type() == rpc::FileEntry::DIR) dirs_[e->file_id()] = *path;
    return true;
  }

 private:
  MetaStore* store_;
  uint32_t ds_, ver_;
  uint64_t after_ = 0;
  std::vector<rpc::FileEntry> page_;
  size_t pos_ = 0;
  bool done_ = false;
  std::unordered_map<uint64_t, std::string> dirs_;
};

bool HasVersion(const rpc::Dataset& ds, uint32_t version) {
  for (const auto& v : ds.versions()) {
    if (v.version() == version) return true;
  }
  return false;
}

absl::Status NoVersion(const rpc::Dataset& ds, uint32_t version) {
  return absl::NotFoundError(absl::StrCat("dataset '", ds.name(), "' has no version ", version));
}

}  // namespace

DatasetCatalog::DatasetCatalog(MetaStore* store) : store_(store) {}

absl::Status DatasetCatalog::Load() {
  ASSIGN_OR_RETURN(std::vector<rpc::Dataset> all, store_->ListDatasets());
  absl::MutexLock lock(&mu_);
  for (const auto& ds : all) PutLocked(ds);
  return absl::OkStatus();
}

void DatasetCatalog::PutLocked(const rpc::Dataset& ds) {
  by_name_[ds.name()] = ds;
  name_by_id_[ds.id()] = ds.name();
  for (auto it = bounds_.lower_bound({ds.id(), 0});
       it != bounds_.end() && it->first.first == ds.id();) {
    it = bounds_.erase(it);
  }
  const uint64_t bs = std::max<uint64_t>(ds.block_size(), 1);
  for (const auto& v : ds.versions()) {
    bounds_[{ds.id(), v.version()}] = {v.max_file_id(),
                                       std::max<uint64_t>(1, (v.bytes() + bs - 1) / bs)};
  }
}

void DatasetCatalog::EraseLocked(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return;
  const uint32_t id = it->second.id();
  name_by_id_.erase(id);
  for (auto b = bounds_.lower_bound({id, 0}); b != bounds_.end() && b->first.first == id;) {
    b = bounds_.erase(b);
  }
  for (auto s = sizes_.lower_bound({id, 0}); s != sizes_.end() && s->first.first == id;) {
    s = sizes_.erase(s);
  }
  by_name_.erase(it);
}

std::vector<rpc::Dataset> DatasetCatalog::List() {
  absl::MutexLock lock(&mu_);
  std::vector<rpc::Dataset> out;
  out.reserve(by_name_.size());
  for (const auto& [name, ds] : by_name_) out.push_back(ds);
  return out;
}

absl::StatusOr<rpc::Dataset> DatasetCatalog::Get(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    return absl::NotFoundError(absl::StrCat("unknown dataset '", name, "'"));
  return it->second;
}

absl::StatusOr<rpc::Dataset> DatasetCatalog::Resolve(const rpc::GetDatasetRequest& req) {
  if (!req.name().empty()) return Get(req.name());
  absl::MutexLock lock(&mu_);
  auto id = name_by_id_.find(req.id());
  if (id == name_by_id_.end())
    return absl::NotFoundError(absl::StrCat("unknown dataset id ", req.id()));
  return by_name_.at(id->second);
}

absl::StatusOr<std::pair<rpc::Dataset, uint32_t>> DatasetCatalog::ResolveVersion(
    const std::string& name, uint32_t version) {
  ASSIGN_OR_RETURN(rpc::Dataset ds, Get(name));
  const uint32_t v = version == 0 ? ds.latest_version() : version;
  if (!HasVersion(ds, v)) return NoVersion(ds, v);
  return std::make_pair(std::move(ds), v);
}

absl::StatusOr<rpc::VersionInfo> DatasetCatalog::ScanVersion(const std::string& uri,
                                                             uint32_t dataset_id, uint32_t version,
                                                             const ProgressFn& report) {
  MetaStore::ManifestWriter mw(store_, dataset_id, version);
  auto sink = [&](const rpc::FileEntry& e, std::string_view) { return mw.Add(e); };
  auto progress = [&](const ScanStats& s) {
    rpc::DatasetProgress p;
    p.set_entries_scanned(s.entries);
    p.set_bytes_scanned(s.bytes);
    report(p);
  };
  absl::StatusOr<ScanStats> stats = ScanOrigin(uri, sink, progress);
  absl::Status fin = stats.ok() ? mw.Finish() : stats.status();
  if (!fin.ok()) {
    // Best effort: what is left behind is an orphan the next open of the store drops.
    absl::Status cleanup = store_->DeleteVersionData(dataset_id, version);
    if (!cleanup.ok()) {
      spdlog::warn("meta: leaving a partial manifest of {}/{} to the next start: {}", dataset_id,
                   version, std::string(cleanup.message()));
    }
    return fin;
  }
  rpc::VersionInfo v;
  v.set_version(version);
  v.set_files(stats->files);
  v.set_dirs(stats->dirs);
  v.set_symlinks(stats->symlinks);
  v.set_bytes(stats->bytes);
  v.set_fingerprint(stats->fingerprint);
  v.set_created_unix_ms(NowUnixMs());
  v.set_max_file_id(stats->max_file_id);
  v.set_skipped(stats->skipped);
  return v;
}

absl::StatusOr<rpc::DatasetProgress> DatasetCatalog::Add(const rpc::AddDatasetRequest& req,
                                                         const ProgressFn& progress) {
  RETURN_IF_ERROR(ValidateDatasetName(req.name()));
  // Object stores: larger default blocks (fewer, larger ranged GETs; requests are what they
  // charge and what costs their servers CPU). See docs/benchmarks.md, "Remote origins".
  const uint64_t block_size = req.block_size() != 0                  ? req.block_size()
                              : origin::IsRemoteOrigin(req.origin()) ? 4 * kDefaultBlockSize
                                                                     : kDefaultBlockSize;
  RETURN_IF_ERROR(ValidateBlockSize(block_size));
  ASSIGN_OR_RETURN(std::string uri, origin::NormalizeOrigin(req.origin()));
  absl::MutexLock writer(&writer_mu_);
  if (auto existing = Get(req.name()); existing.ok()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "dataset '", req.name(), "' already exists (origin ", existing->origin(), ")"));
  }
  ASSIGN_OR_RETURN(uint32_t id, store_->AllocateDatasetId());
  ASSIGN_OR_RETURN(rpc::VersionInfo v, ScanVersion(uri, id, 1, progress));
  rpc::Dataset ds;
  ds.set_name(req.name());
  ds.set_id(id);
  ds.set_origin(uri);
  ds.set_block_size(block_size);
  ds.set_latest_version(1);
  ds.set_created_unix_ms(NowUnixMs());
  *ds.add_versions() = v;
  RETURN_IF_ERROR(store_->PutDataset(ds));  // the commit point: the manifest is complete
  {
    absl::MutexLock lock(&mu_);
    PutLocked(ds);
  }
  spdlog::info("meta: added dataset {} (id {}) from {}: {} files, {} bytes", ds.name(), id, uri,
               v.files(), v.bytes());
  rpc::DatasetProgress done;
  done.set_done(true);
  done.set_changed(true);
  done.set_entries_scanned(v.files() + v.dirs() + v.symlinks());
  done.set_bytes_scanned(v.bytes());
  done.set_added(done.entries_scanned());
  *done.mutable_dataset() = std::move(ds);
  return done;
}

absl::StatusOr<rpc::DatasetProgress> DatasetCatalog::Refresh(const std::string& name,
                                                             const ProgressFn& progress) {
  absl::MutexLock writer(&writer_mu_);
  ASSIGN_OR_RETURN(rpc::Dataset ds, Get(name));
  RETURN_IF_ERROR(origin::NormalizeOrigin(ds.origin()).status());
  const uint32_t latest = ds.latest_version();
  const uint32_t next = latest + 1;
  ASSIGN_OR_RETURN(rpc::VersionInfo v, ScanVersion(ds.origin(), ds.id(), next, progress));
  const rpc::VersionInfo* prev = nullptr;
  for (const auto& pv : ds.versions()) {
    if (pv.version() == latest) prev = &pv;
  }
  rpc::DatasetProgress done;
  done.set_done(true);
  done.set_entries_scanned(v.files() + v.dirs() + v.symlinks());
  done.set_bytes_scanned(v.bytes());
  if (prev != nullptr && prev->fingerprint() == v.fingerprint() &&
      prev->max_file_id() == v.max_file_id()) {
    RETURN_IF_ERROR(store_->DeleteVersionData(ds.id(), next));
    done.set_changed(false);
  } else {
    StoredStream old_s(store_, ds.id(), latest), new_s(store_, ds.id(), next);
    DiffCounts d =
        DiffManifests([&](std::string* p, rpc::FileEntry* e) { return old_s.Next(p, e); },
                      [&](std::string* p, rpc::FileEntry* e) { return new_s.Next(p, e); });
    ds.set_latest_version(next);
    *ds.add_versions() = v;
    RETURN_IF_ERROR(store_->PutDataset(ds));
    {
      absl::MutexLock lock(&mu_);
      PutLocked(ds);
    }
    done.set_changed(true);
    done.set_added(d.added);
    done.set_removed(d.removed);
    done.set_modified(d.modified);
    spdlog::info("meta: dataset {} version {}: +{} -{} ~{}", name, next, d.added, d.removed,
                 d.modified);
  }
  *done.mutable_dataset() = std::move(ds);
  return done;
}

absl::StatusOr<uint32_t> DatasetCatalog::Remove(const rpc::RemoveDatasetRequest& req) {
  absl::MutexLock writer(&writer_mu_);
  ASSIGN_OR_RETURN(rpc::Dataset ds, Get(req.name()));
  if (req.version() == 0) {
    RETURN_IF_ERROR(store_->DeleteDataset(ds));
    absl::MutexLock lock(&mu_);
    EraseLocked(ds.name());
    spdlog::info("meta: removed dataset {}", ds.name());
    return ds.id();
  }
  if (req.version() == ds.latest_version()) {
    return absl::FailedPreconditionError(absl::StrCat("version ", req.version(),
                                                      " is the latest of '", ds.name(),
                                                      "'; remove the whole dataset instead"));
  }
  if (!HasVersion(ds, req.version())) return NoVersion(ds, req.version());
  rpc::Dataset updated = ds;
  updated.clear_versions();
  for (const auto& v : ds.versions()) {
    if (v.version() != req.version()) *updated.add_versions() = v;
  }
  RETURN_IF_ERROR(store_->PutDataset(updated));
  {
    absl::MutexLock lock(&mu_);
    PutLocked(updated);
    sizes_.erase({ds.id(), req.version()});
  }
  // The record no longer names the version: leftovers are orphans the next start drops.
  RETURN_IF_ERROR(store_->DeleteVersionData(ds.id(), req.version()));
  return ds.id();
}

absl::Status DatasetCatalog::ListManifest(const rpc::ListManifestRequest& req,
                                          rpc::ListManifestResponse* resp) {
  ASSIGN_OR_RETURN(auto dv, ResolveVersion(req.name(), req.version()));
  const auto& [ds, version] = dv;
  const uint32_t max =
      req.max_entries() == 0 ? kMaxManifestPage : std::min(req.max_entries(), kMaxManifestPage);
  ASSIGN_OR_RETURN(auto entries, store_->ReadManifest(ds.id(), version, req.after_file_id(), max));
  resp->set_dataset_id(ds.id());
  resp->set_version(version);
  if (entries.size() == max) resp->set_next_after_file_id(entries.back().file_id());
  for (auto& e : entries) *resp->add_entries() = std::move(e);
  return absl::OkStatus();
}

absl::Status DatasetCatalog::CheckBlock(const rpc::BlockAddr& b) {
  Bounds bounds;
  {
    absl::MutexLock lock(&mu_);
    auto it = bounds_.find({b.dataset_id(), b.version()});
    if (it == bounds_.end()) {
      return absl::NotFoundError(absl::StrCat("no dataset version ", b.dataset_id(), "/",
                                              b.version(), " (removed, or never added)"));
    }
    bounds = it->second;
  }
  if (b.file_id() == 0 || b.file_id() > bounds.max_file_id) {
    return absl::InvalidArgumentError(absl::StrCat("block ", b.dataset_id(), "/", b.version(), "/",
                                                   b.file_id(), "/", b.index(),
                                                   ": no such file id"));
  }
  if (b.index() >= bounds.max_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("block ", b.dataset_id(), "/", b.version(), "/",
                                                   b.file_id(), "/", b.index(),
                                                   ": index beyond the dataset's size"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DatasetCatalog::MaxBlocks(uint32_t dataset_id, uint32_t version) {
  absl::MutexLock lock(&mu_);
  auto it = bounds_.find({dataset_id, version});
  if (it == bounds_.end()) {
    return absl::NotFoundError(absl::StrCat("no dataset version ", dataset_id, "/", version,
                                            " (removed, or never added)"));
  }
  return it->second.max_blocks;
}

absl::StatusOr<std::shared_ptr<const DatasetCatalog::FileSizes>> DatasetCatalog::Sizes(
    uint32_t dataset_id, uint32_t version) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sizes_.find({dataset_id, version});
    if (it != sizes_.end()) return it->second;
  }
  // Read outside the lock: a manifest scan takes a while and others only read.
  auto sizes = std::make_shared<FileSizes>();
  RETURN_IF_ERROR(store_->ForEachEntry(dataset_id, version, [&](const rpc::FileEntry& e) {
    if (sizes->size() <= e.file_id()) sizes->resize(e.file_id() + 1, 0);
    (*sizes)[e.file_id()] = e.type() == rpc::FileEntry::FILE ? e.size() : 0;
    return true;
  }));
  absl::MutexLock lock(&mu_);
  if (!bounds_.count({dataset_id, version})) {
    return absl::NotFoundError(absl::StrCat("no dataset version ", dataset_id, "/", version,
                                            " (removed, or never added)"));
  }
  auto [it, fresh] = sizes_.emplace(std::make_pair(dataset_id, version), std::move(sizes));
  return it->second;
}

absl::StatusOr<DatasetCatalog::Selection> DatasetCatalog::SelectPaths(
    const rpc::Dataset& ds, uint32_t version, const std::vector<std::string>& raw) {
  std::vector<std::string> paths;
  for (std::string p : raw) {
    while (!p.empty() && p.front() == '/') p.erase(0, 1);
    while (!p.empty() && p.back() == '/') p.pop_back();
    if (p.find("..") != std::string::npos || p.find("//") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("path '", p, "' is not a plain path"));
    }
    paths.push_back(p);
  }
  std::vector<bool> seen(paths.size(), false);
  std::unordered_map<uint64_t, std::string> dirs;
  Selection sel;
  RETURN_IF_ERROR(store_->ForEachEntry(ds.id(), version, [&](const rpc::FileEntry& e) {
    auto parent = dirs.find(e.parent_id());
    std::string path = parent == dirs.end() || parent->second.empty()
                           ? e.name()
                           : absl::StrCat(parent->second, "/", e.name());
    if (e.type() == rpc::FileEntry::DIR) dirs[e.file_id()] = path;
    bool in = paths.empty();
    for (size_t i = 0; i < paths.size(); i++) {
      if (path == paths[i]) seen[i] = true;
      if (paths[i].empty() || path == paths[i] ||
          (path.size() > paths[i].size() && path.compare(0, paths[i].size(), paths[i]) == 0 &&
           path[paths[i].size()] == '/')) {
        in = true;
      }
    }
    if (in && e.type() == rpc::FileEntry::FILE) {
      sel.bytes += e.size();
      sel.files++;
    }
    return true;
  }));
  for (size_t i = 0; i < paths.size(); i++) {
    if (!seen[i] && !paths[i].empty()) {
      return absl::NotFoundError(
          absl::StrCat("no path '", paths[i], "' in dataset '", ds.name(), "' version ", version));
    }
  }
  return sel;
}

}  // namespace ember::meta
