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

uint32_t LocationIndex::NodeIdLocked(const std::string& node) {
  auto [it, added] = node_ids_.try_emplace(node, static_cast<uint32_t>(node_names_.size()));
  if (added) node_names_.push_back(node);
  return it->second;
}

std::string LocationIndex::BitmapLocked(const FileKey& k, const Held& h) {
  if (h.big) {
    auto it = big_.find({k, h.node});
    return it == big_.end() ? std::string() : it->second;
  }
  std::string b;
  for (uint64_t bits = h.bits; bits != 0; bits >>= 8) b.push_back(static_cast<char>(bits & 0xff));
  return b;
}

bool LocationIndex::TestLocked(const FileKey& k, const Held& h, uint64_t i) {
  if (!h.big) return i < 64 && ((h.bits >> i) & 1);
  auto it = big_.find({k, h.node});
  return it != big_.end() && TestBit(it->second, i);
}

void LocationIndex::SetLocked(const FileKey& k, uint32_t node, std::string bitmap) {
  TrimBitmap(&bitmap);
  auto loc = locations_.find(k);
  Held* h = nullptr;
  if (loc != locations_.end()) {
    for (Held& x : loc->second) {
      if (x.node == node) h = &x;
    }
  }
  if (h != nullptr && h->big) big_.erase({k, node});
  if (bitmap.empty()) {
    if (h == nullptr) return;
    Holders& hs = loc->second;
    hs.erase(hs.begin() + (h - hs.data()));
    if (hs.empty()) locations_.erase(loc);
    auto& versions = node_versions_[node];
    auto v = versions.find({k.dataset_id, k.version});
    if (v != versions.end() && --v->second == 0) versions.erase(v);
    return;
  }
  if (h == nullptr) {
    Holders& hs = locations_[k];
    hs.push_back(Held{node, 0, 0});
    h = &hs.back();
    node_versions_[node][{k.dataset_id, k.version}]++;
  }
  h->bits = 0;
  h->big = bitmap.size() > 8 ? 1 : 0;
  if (h->big) {
    big_[{k, node}] = std::move(bitmap);
  } else {
    for (size_t i = 0; i < bitmap.size(); i++) {
      h->bits |= static_cast<uint64_t>(static_cast<uint8_t>(bitmap[i])) << (8 * i);
    }
  }
}

absl::Status LocationIndex::Load() {
  size_t records = 0;
  absl::MutexLock lock(&mu_);
  locations_.clear();
  big_.clear();
  node_versions_.clear();
  RETURN_IF_ERROR(store_->ForEachLocation(
      [&](const FileKey& key, const std::string& node, const std::string& bitmap) {
        mu_.AssertHeld();  // called within this function's lock
        SetLocked(key, NodeIdLocked(node), bitmap);
        records++;
      }));
  generation_++;
  spdlog::info("meta: loaded {} file location records", records);
  return absl::OkStatus();
}

std::string& LocationIndex::NextBitmapLocked(uint32_t node, const FileKey& k, bool full_start,
                                             std::map<FileKey, std::string>* next) {
  auto [it, fresh] = next->emplace(k, std::string());
  if (fresh && !full_start) {  // starts from what the node reported before
    auto loc = locations_.find(k);
    if (loc != locations_.end()) {
      for (const Held& h : loc->second) {
        if (h.node == node) it->second = BitmapLocked(k, h);
      }
    }
  }
  return it->second;
}

absl::Status LocationIndex::Apply(const std::string& node_name, bool full_start,
                                  const std::vector<FileBitmap>& files,
                                  const std::vector<BlockAddr>& added,
                                  const std::vector<BlockAddr>& removed) {
  absl::MutexLock lock(&mu_);
  const uint32_t node = NodeIdLocked(node_name);
  // The node's bitmaps after this report, for every file it touches; computed first, stored,
  // then applied, so memory never runs ahead of the store.
  std::map<FileKey, std::string> next;
  if (full_start) {
    for (const auto& [dv, count] : node_versions_[node]) {
      for (auto it = locations_.lower_bound(FileKey{dv.first, dv.second, 0});
           it != locations_.end() && it->first.dataset_id == dv.first &&
           it->first.version == dv.second;
           ++it) {
        for (const Held& h : it->second) {
          if (h.node == node) next[it->first] = std::string();
        }
      }
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
    writes.push_back({k, node_name, bitmap});
  }
  if (!writes.empty()) RETURN_IF_ERROR(store_->PutLocations(writes));
  for (auto& [k, bitmap] : next) SetLocked(k, node, std::move(bitmap));
  if (!next.empty() || full_start) generation_++;
  return absl::OkStatus();
}

bool LocationIndex::HeldByOthersLocked(uint32_t ds, uint32_t version, const std::string& self,
                                       const NodeView& view) {
  for (const auto& [node, versions] : node_versions_) {
    const std::string& name = node_names_[node];
    if (name == self || !view.Alive(name)) continue;
    if (versions.count({ds, version}) > 0) return true;
  }
  return false;
}

void LocationIndex::Locate(const std::vector<BlockAddr>& blocks, const std::string& self,
                           const NodeView& view, rpc::LocateResponse* resp, bool node_table) {
  absl::MutexLock lock(&mu_);
  std::map<std::pair<uint32_t, uint32_t>, bool> unheld;  // per dataset version asked about
  // With node_table: node -> its place in resp->nodes, or -1 when not alive.
  absl::flat_hash_map<uint32_t, int64_t> refs;
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
    for (const Held& held : it->second) {
      if (!TestLocked(it->first, held, b.index)) continue;
      const std::string& node_id = node_names_[held.node];
      if (node_table) {
        auto [ref, added] = refs.try_emplace(held.node, -1);
        if (added && view.Alive(node_id)) {
          const NodeInfo* n = view.Find(node_id);
          rpc::HolderNode* node = resp->add_nodes();
          node->set_node_id(node_id);
          node->set_address(n->address);
          node->set_switch_label(n->sw);
          node->set_rack(n->rack);
          ref->second = resp->nodes_size() - 1;
        }
        if (ref->second >= 0) h->add_node_refs(static_cast<uint32_t>(ref->second));
        continue;
      }
      if (!view.Alive(node_id)) continue;
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
    for (const Held& held : it->second) {
      const std::string& node = node_names_[held.node];
      const std::string bitmap = BitmapLocked(it->first, held);
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
  for (auto it = locations_.lower_bound(FileKey{ds, version, 0});
       it != locations_.end() && it->first.dataset_id == ds &&
       (version == 0 || it->first.version == version);) {
    for (const Held& h : it->second) {
      if (h.big) big_.erase({it->first, h.node});
    }
    it = locations_.erase(it);
  }
  for (auto& [node, versions] : node_versions_) {
    for (auto v = versions.begin(); v != versions.end();) {
      if (v->first.first == ds && (version == 0 || v->first.second == version)) {
        v = versions.erase(v);
      } else {
        ++v;
      }
    }
  }
}

uint64_t LocationIndex::generation() {
  absl::MutexLock lock(&mu_);
  return generation_;
}

}  // namespace ember::meta
