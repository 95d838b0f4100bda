#include "meta/location_index.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/status.h"

namespace ember::meta {
namespace {

bool TestBit(const std::string& bitmap, uint64_t i) {
  return i / 8 < bitmap.size() && (static_cast<uint8_t>(bitmap[i / 8]) >> (i % 8)) & 1;
}

void SetBit(std::string* bitmap, uint64_t i, bool on) {
  if (i / 8 >= bitmap->size()) {
    if (!on) return;
    bitmap->resize(i / 8 + 1, '\0');
  }
  uint8_t b = static_cast<uint8_t>((*bitmap)[i / 8]);
  b = on ? (b | (1u << (i % 8))) : (b & ~(1u << (i % 8)));
  (*bitmap)[i / 8] = static_cast<char>(b);
}

void TrimBitmap(std::string* bitmap) {
  while (!bitmap->empty() && bitmap->back() == '\0') bitmap->pop_back();
}

}  // namespace

absl::Status LocationIndex::Load() {
  size_t records = 0;
  std::map<FileKey, std::map<std::string, std::string>> locations;
  std::map<std::string, std::set<FileKey>> node_files;
  RETURN_IF_ERROR(store_->ForEachLocation(
      [&](const FileKey& key, const std::string& node, const std::string& bitmap) {
        locations[key][node] = bitmap;
        node_files[node].insert(key);
        records++;
      }));
  absl::MutexLock lock(&mu_);
  locations_ = std::move(locations);
  node_files_ = std::move(node_files);
  generation_++;
  spdlog::info("meta: loaded {} file location records", records);
  return absl::OkStatus();
}

std::string& LocationIndex::NextBitmapLocked(const std::string& node, const FileKey& k,
                                             bool full_start,
                                             std::map<FileKey, std::string>* next) {
  auto [it, fresh] = next->emplace(k, std::string());
  if (fresh && !full_start) {  // starts from what the node reported before
    auto loc = locations_.find(k);
    if (loc != locations_.end()) {
      auto b = loc->second.find(node);
      if (b != loc->second.end()) it->second = b->second;
    }
  }
  return it->second;
}

absl::Status LocationIndex::Apply(const std::string& node, bool full_start,
                                  const std::vector<FileBitmap>& files,
                                  const std::vector<BlockAddr>& added,
                                  const std::vector<BlockAddr>& removed) {
  absl::MutexLock lock(&mu_);
  // The node's bitmaps after this report, for every file it touches; computed first, stored,
  // then applied, so memory never runs ahead of the store.
  std::map<FileKey, std::string> next;
  if (full_start) {
    auto nf = node_files_.find(node);
    if (nf != node_files_.end()) {
      for (const FileKey& k : nf->second) next[k] = std::string();
    }
  }
  for (const FileBitmap& f : files) {
    std::string& b = NextBitmapLocked(node, f.key, full_start, &next);
    b = f.bitmap;
    TrimBitmap(&b);
  }
  for (const BlockAddr& a : added) {
    SetBit(&NextBitmapLocked(node, {a.dataset_id, a.version, a.file_id}, full_start, &next),
           a.index, true);
  }
  for (const BlockAddr& a : removed) {
    SetBit(&NextBitmapLocked(node, {a.dataset_id, a.version, a.file_id}, full_start, &next),
           a.index, false);
  }
  std::vector<MetaStore::LocationWrite> writes;
  writes.reserve(next.size());
  for (auto& [k, bitmap] : next) {
    TrimBitmap(&bitmap);
    writes.push_back({k, node, bitmap});
  }
  if (!writes.empty()) RETURN_IF_ERROR(store_->PutLocations(writes));
  for (auto& [k, bitmap] : next) {
    if (bitmap.empty()) {
      auto loc = locations_.find(k);
      if (loc != locations_.end()) {
        loc->second.erase(node);
        if (loc->second.empty()) locations_.erase(loc);
      }
      node_files_[node].erase(k);
    } else {
      locations_[k][node] = std::move(bitmap);
      node_files_[node].insert(k);
    }
  }
  if (!next.empty() || full_start) generation_++;
  return absl::OkStatus();
}

bool LocationIndex::HeldByOthersLocked(uint32_t ds, uint32_t version, const std::string& self,
                                       const NodeView& view) {
  // A lookup in each live node's ordered file set: O(nodes * log files).
  for (const auto& [node, files] : node_files_) {
    if (node == self || files.empty() || !view.Alive(node)) continue;
    auto f = files.lower_bound(FileKey{ds, version, 0});
    if (f != files.end() && f->dataset_id == ds && f->version == version) return true;
  }
  return false;
}

void LocationIndex::Locate(const std::vector<BlockAddr>& blocks, const std::string& self,
                           const NodeView& view, rpc::LocateResponse* resp) {
  absl::MutexLock lock(&mu_);
  std::map<std::pair<uint32_t, uint32_t>, bool> unheld;  // per dataset version asked about
  for (const BlockAddr& b : blocks) {
    rpc::Holders* h = resp->add_holders();
    auto it = locations_.find(FileKey{b.dataset_id, b.version, b.file_id});
    if (it == locations_.end() || it->second.empty()) {
      auto key = std::make_pair(b.dataset_id, b.version);
      auto u = unheld.find(key);
      if (u == unheld.end()) {
        u = unheld.emplace(key, !HeldByOthersLocked(b.dataset_id, b.version, self, view)).first;
      }
      h->set_dataset_unheld(u->second);
      continue;
    }
    for (const auto& [node_id, bitmap] : it->second) {
      if (!TestBit(bitmap, b.index) || !view.Alive(node_id)) continue;
      const NodeInfo* n = view.Find(node_id);
      h->add_node_ids(node_id);
      h->add_addresses(n->address);
      h->add_switches(n->sw);
      h->add_racks(n->rack);
    }
  }
}

LocationIndex::Residency LocationIndex::Resident(uint32_t ds, uint32_t version,
                                                 const std::vector<uint64_t>& sizes,
                                                 uint64_t block_size, const NodeView& view) {
  const uint64_t bs = std::max<uint64_t>(block_size, 1);
  Residency r;
  for (uint64_t sz : sizes) {
    r.total_bytes += sz;
    r.total_blocks += (sz + bs - 1) / bs;
  }
  auto block_len = [&](uint64_t file, uint64_t index) -> uint64_t {
    const uint64_t sz = file < sizes.size() ? sizes[file] : 0;
    if (index * bs >= sz) return 0;
    return std::min(bs, sz - index * bs);
  };
  r.replicas_histogram.assign(1, 0);
  absl::MutexLock lock(&mu_);
  r.generation = generation_;
  for (auto it = locations_.lower_bound(FileKey{ds, version, 0});
       it != locations_.end() && it->first.dataset_id == ds && it->first.version == version; ++it) {
    const uint64_t file = it->first.file_id;
    std::map<uint64_t, int> holders;  // block -> live holders
    for (const auto& [node, bitmap] : it->second) {
      const bool live = view.Alive(node);
      NodeResidency& nr = r.by_node[node];
      for (uint64_t i = 0; i < bitmap.size() * 8; i++) {
        if (!TestBit(bitmap, i)) continue;
        const uint64_t len = block_len(file, i);
        if (len == 0) continue;
        nr.bytes += len;
        nr.blocks++;
        if (live) holders[i]++;
      }
    }
    for (const auto& [i, k] : holders) {
      if (r.replicas_histogram.size() <= static_cast<size_t>(k)) {
        r.replicas_histogram.resize(k + 1, 0);
      }
      r.replicas_histogram[k]++;
      r.anywhere_blocks++;
      r.anywhere_bytes += block_len(file, i);
    }
  }
  r.replicas_histogram[0] = r.total_blocks - r.anywhere_blocks;
  return r;
}

void LocationIndex::Drop(uint32_t ds, uint32_t version) {
  absl::MutexLock lock(&mu_);
  generation_++;
  for (auto it = locations_.begin(); it != locations_.end();) {
    if (it->first.dataset_id == ds && (version == 0 || it->first.version == version)) {
      for (auto& [node, bitmap] : it->second) node_files_[node].erase(it->first);
      it = locations_.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t LocationIndex::generation() {
  absl::MutexLock lock(&mu_);
  return generation_;
}

}  // namespace ember::meta
