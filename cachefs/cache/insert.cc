// BlockCache's inserts: a batch of blocks claimed (small ones' places in a segment, one run),
// written (cache_files.cc), indexed in one write and made resident.
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>

#include "cachefs/cache/block_cache.h"

namespace ember::cachefs {

BlockCache::InsertResult BlockCache::Insert(const BlockAddr& addr, uint64_t file_size,
                                            uint64_t offset, std::string_view data,
                                            uint64_t checksum) {
  std::vector<InsertItem> items{{addr, file_size, offset, data, checksum}};
  return InsertMany(items).front();
}

std::vector<BlockCache::InsertResult> BlockCache::InsertMany(const std::vector<InsertItem>& items) {
  std::vector<Pending> ps(items.size());
  ClaimSmall(items, &ps);
  for (size_t i = 0; i < items.size(); i++) {
    if (!ps[i].decided) BeginInsert(items[i], &ps[i]);
  }
  // The bytes, outside the lock: small objects whose slots follow each other in one segment in
  // one write, other blocks into their files one by one. A direct run (CacheFiles::ClaimSmall)
  // is written whole, the slots of objects not admitted too (nothing points there): a part of it
  // would share its 4 KiB edges with the rest.
  for (size_t i = 0; i < ps.size();) {
    Pending& p = ps[i];
    const bool direct = p.small && p.slot.direct_fd != nullptr;
    if (p.decided && !direct) {
      i++;
      continue;
    }
    if (!p.small) {
      p.err =
          files_.WriteBlock(p.item.addr, p.item.file_size, p.item.offset, p.item.data, &p.stamp);
      i++;
      continue;
    }
    std::vector<const CacheFiles::SmallSlot*> slots{&p.slot};
    std::vector<std::string_view> data{p.item.data};
    size_t j = i + 1;
    uint64_t end = p.slot.offset + p.item.data.size();
    for (; j < ps.size() && (direct || !ps[j].decided) && ps[j].small &&
           (ps[j].slot.direct_fd != nullptr) == direct && ps[j].slot.segment == p.slot.segment &&
           ps[j].slot.offset == end;
         j++) {
      slots.push_back(&ps[j].slot);
      data.push_back(ps[j].item.data);
      end += ps[j].item.data.size();
    }
    uint64_t stamp = 0;
    const int err = files_.WriteSmallRun(slots, data, &stamp);
    for (size_t k = i; k < j; k++) {
      ps[k].err = err;
      ps[k].stamp = stamp;
    }
    i = j;
  }
  // Then commit what was written through the index: one batch.
  std::vector<IndexRecord> records;
  for (const Pending& p : ps) {
    if (!p.decided && p.err == 0) {
      records.push_back({p.item.addr, p.item.checksum, p.where, p.len, 0, p.slot.segment});
    }
  }
  absl::Status indexed = records.empty() ? absl::OkStatus() : index_->PutMany(records);
  std::vector<InsertResult> out;
  out.reserve(ps.size());
  for (Pending& p : ps) {
    if (!p.decided) {
      if (p.err == 0 && !indexed.ok()) p.err = EIO;
      p.result = FinishInsert(p, indexed);
    }
    out.push_back(p.result);
  }
  return out;
}

void BlockCache::ClaimSmall(const std::vector<InsertItem>& items, std::vector<Pending>* ps) {
  // A small file's only block goes into a segment: the places of a batch's small blocks are
  // claimed together, one run (a place left unused is a hole in the segment, no space).
  std::vector<size_t> lens;
  std::vector<Pending*> small;
  for (size_t i = 0; i < items.size(); i++) {
    Pending& p = (*ps)[i];
    p.item = items[i];
    p.len = static_cast<uint32_t>(items[i].data.size());
    p.small = items[i].offset == 0 && p.len > 0 && p.len == items[i].file_size &&
              items[i].file_size <= options_.small_file_max;
    if (p.small) {
      lens.push_back(p.len);
      small.push_back(&p);
    }
  }
  if (small.empty()) return;
  std::vector<CacheFiles::SmallSlot> slots;
  const int err = files_.ClaimSmall(lens, &slots);
  for (size_t i = 0; i < small.size(); i++) {
    if (err == 0) {
      small[i]->slot = std::move(slots[i]);
      continue;
    }
    small[i]->decided = true;
    small[i]->result =
        err == ENOSPC || err == EDQUOT ? InsertResult::kNoSpace : InsertResult::kError;
  }
  if (err != 0) {
    spdlog::error("cache: cannot start a segment under {}: {}", options_.dir, strerror(err));
    absl::MutexLock lock(&mu_);
    not_admitted_ += small.size();
  }
}

void BlockCache::BeginInsert(const InsertItem& item, Pending* p) {
  const BlockAddr& addr = item.addr;
  const uint32_t len = p->len;
  const uint32_t segment = p->slot.segment;
  p->where = p->small ? p->slot.offset : item.offset;
  absl::MutexLock lock(&mu_);
  auto existing = blocks_.find(addr);
  if (existing != blocks_.end()) {
    Entry& e = existing->second;
    if (!e.doomed || e.writing || e.holds == 0 || e.length != len || e.offset != item.offset ||
        e.segment != 0 || p->small) {
      p->decided = true;
      p->result = e.writing || e.doomed ? InsertResult::kNotAdmitted : InsertResult::kStored;
      return;
    }
    // Held (a passthrough open reads this file): write the good bytes in place, under the
    // holders' feet, then serve the block again. Its bytes still count in used_.
    e.doomed = false;
    e.writing = true;
    e.verifying = false;  // a reader checking the old generation must not hold up the new one
    verified_cv_.SignalAll();
    writing_++;
    e.checksum = item.checksum;
    e.generation = NewGenerationLocked();
    p->revive = true;
  } else {
    if (len > options_.capacity_bytes || !MakeRoom(addr, len)) {
      not_admitted_++;
      p->decided = true;
      p->result = InsertResult::kNotAdmitted;
      return;
    }
    Entry e;
    e.writing = true;
    writing_++;
    e.checksum = item.checksum;
    e.offset = p->where;
    e.length = len;
    e.segment = segment;
    e.generation = NewGenerationLocked();
    LruPushFront(&*blocks_.emplace(addr, e).first);
    used_ += len;
    if (segment != 0) {
      segment_objects_[segment]++;
      if (last_active_segment_ != segment) {
        // Appends moved on: the segment before may have emptied while it was active.
        const uint32_t before = last_active_segment_;
        last_active_segment_ = segment;
        if (before != 0 && segment_objects_.contains(before)) {
          segment_objects_[before]++;
          SegmentLostLocked(before);
        }
      }
    }
  }
  files_state_[KeyOf(addr, segment)].writers++;
}

BlockCache::InsertResult BlockCache::FinishInsert(const Pending& p, const absl::Status& indexed) {
  const BlockAddr& addr = p.item.addr;
  const uint32_t len = p.len;
  const int err = p.err;
  absl::MutexLock lock(&mu_);
  FileState& file = files_state_[KeyOf(addr, p.slot.segment)];
  file.writers--;
  if (p.stamp != 0 && p.stamp >= file.stamp) {
    file.stamp = p.stamp;
    file.foreign = false;  // taken after the write ended
  }
  auto it = blocks_.find(addr);
  writing_--;
  if (err != 0) {
    if (p.revive) {
      // Still bad, and still held: punched by the last Release, as before.
      it->second.writing = false;
      it->second.doomed = true;
      not_admitted_++;
      return InsertResult::kError;
    }
    used_ -= len;
    EraseLocked(it);
    not_admitted_++;
    if (err == ENOSPC || err == EDQUOT) {
      if (!disk_full_logged_) {
        spdlog::error(
            "cache: disk full under {}; serving reads without caching until space "
            "returns",
            options_.dir);
        disk_full_logged_ = true;
      }
      return InsertResult::kNoSpace;
    }
    spdlog::error("cache: cannot write block to {}: {}", files_.FilePath(addr, p.slot.segment),
                  indexed.ok() ? strerror(err) : std::string(indexed.message()));
    return InsertResult::kError;
  }
  if (disk_full_logged_) {
    // Near the edge a write can fit between failures (a failed write's pages are punched):
    // call the disk back only once there is real room, so the log says "full" once.
    struct statvfs vfs;
    if (statvfs(options_.dir.c_str(), &vfs) == 0 &&
        static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize >= 4 * len + (16u << 20)) {
      spdlog::info("cache: writing blocks again under {}", options_.dir);
      disk_full_logged_ = false;
    }
  }
  it->second.writing = false;
  it->second.checked = true;    // the caller checked these bytes
  it->second.verified = false;  // written past the page cache: checked again when first read
  added_.push_back(addr);
  if (p.revive) {
    spdlog::info("cache: block {}/{}/{}/{} of {} repaired in place", addr.dataset_id, addr.version,
                 addr.file_id, addr.index, FilePath(addr));
  }
  return InsertResult::kStored;
}

}  // namespace ember::cachefs
