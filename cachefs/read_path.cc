#include "cachefs/read_path.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace ember::cachefs {
namespace {
constexpr size_t kMaxQueuedReadahead = 64;
// Write-behind bounds: blocks (small files fill fast and claim their checksums in batches) and
// bytes (large blocks).
constexpr size_t kMaxQueuedWrites = 64;
constexpr uint64_t kMaxQueuedWriteBytes = 64ull << 20;
constexpr int kWriterThreads = 2;

absl::Status OriginChanged() {
  return absl::FailedPreconditionError(
      "origin bytes differ from those first read for this dataset version (origin changed)");
}
}  // namespace

ReadPath::ReadPath(BlockCache* cache, origin::Origin* origin, meta::MetaClient* meta,
                   const Options& options, PeerFetcher* peers)
    : cache_(cache), origin_(origin), meta_(meta), options_(options), peers_(peers) {
  for (int i = 0; i < options_.fill_threads; i++) workers_.emplace_back([this] { Worker(); });
  for (int i = 0; i < kWriterThreads; i++) writers_.emplace_back([this] { Writer(); });
}

ReadPath::~ReadPath() {
  {
    std::lock_guard lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  for (auto& t : workers_) t.join();
  {
    std::lock_guard lock(write_mu_);
    writers_stopping_ = true;  // writers finish what is queued first
  }
  write_cv_.notify_all();
  for (auto& t : writers_) t.join();
}

ReadStats ReadPath::GetStats() const {
  ReadStats s;
  s.hits = hits_;
  s.misses = misses_;
  s.bytes_from_cache = bytes_cache_;
  s.bytes_from_origin = bytes_origin_;
  s.bytes_from_peers = bytes_peers_;
  if (peers_ != nullptr) {
    s.peer_fetches = peers_->fetches();
    s.peer_errors = peers_->errors();
  }
  s.origin_block_reads = origin_reads_;
  s.checksum_failures = checksum_failures_;
  return s;
}

absl::StatusOr<ReadResult> ReadPath::Read(const FileRef& file, uint64_t offset, size_t size,
                                          std::atomic<uint64_t>* last_block) {
  ReadResult result;
  const uint64_t file_size = file.origin.size;
  if (offset >= file_size || size == 0) return result;
  const uint64_t end = std::min<uint64_t>(file_size, offset + size);
  const uint64_t bs = file.block_size;
  for (uint64_t index = offset / bs; index * bs < end; index++) {
    const bool count = last_block == nullptr || last_block->exchange(index) != index;
    auto block = GetBlock(file, index, count);
    if (!block.ok()) return block.status();
    uint64_t block_start = index * bs;
    uint64_t from = std::max(offset, block_start);
    uint64_t to = std::min(end, block_start + bs);
    Segment seg;
    seg.len = to - from;
    if (block->pin) {
      seg.fd = block->pin->fd;
      seg.pos = from;  // blocks sit at their natural offsets in the cache file
      if (!block->filled) bytes_cache_ += seg.len;
      result.holds.push_back(block->pin);
      // Merge with the previous segment when it is the same cache file and contiguous.
      if (!result.segments.empty()) {
        Segment& prev = result.segments.back();
        if (prev.fd >= 0 && prev.pos + prev.len == seg.pos) {
          // Different pins hold different fds of the same file; keep the first fd.
          prev.len += seg.len;
          result.total += seg.len;
          continue;
        }
      }
    } else {
      if (!block->filled) bytes_cache_ += seg.len;  // a recent block kept in memory
      seg.mem = block->data;
      seg.mem_off = from - block_start;
    }
    result.total += seg.len;
    result.segments.push_back(std::move(seg));
  }
  return result;
}

absl::StatusOr<ReadPath::BlockBytes> ReadPath::GetBlock(const FileRef& file, uint64_t index,
                                                        bool count) {
  const BlockAddr addr{file.dataset_id, file.version, file.file_id, index};
  bool filled = false;
  for (int attempt = 0; attempt < 5; attempt++) {
    if (auto recent = RecentGet(addr)) {
      // The policy sees every access, wherever it is served from. (A block it did not admit is
      // offered again at its next fill, once it has left memory: offering it on every access
      // here admits whatever is being read and thrashes a loop larger than the cache.)
      if (count) cache_->Touch(addr);
      if (!filled) hits_++;
      return BlockBytes{nullptr, recent->data, filled};
    }
    if (auto pin = cache_->Acquire(addr, count)) {
      if (!pin->verified) {
        if (!VerifyPinned(*pin)) continue;  // dropped; fill it again
        cache_->MarkVerified(addr);
      }
      if (!filled) hits_++;
      return BlockBytes{pin, nullptr, filled};
    }
    filled = true;
    std::shared_ptr<Fill> fill = FillOnce(file, index, true, nullptr);
    if (fill->already) filled = false;  // someone else's fill ended just before: a hit
    if (!fill->status.ok() && fill->peer_only) continue;  // joined a prefetch's peer-only try
    if (!fill->status.ok()) return fill->status;
    if (!fill->cached) return BlockBytes{nullptr, fill->data, true};
    // Cached: loop to pin it (it may be evicted in between; then we fill again).
  }
  return absl::UnavailableError(
      absl::StrCat("block ", index, " of ", file.origin.path, " could not be read after retries"));
}

absl::StatusOr<FileSystem::Backing> ReadPath::PinFile(const FileRef& file) {
  if (file.origin.size == 0) return absl::NotFoundError("empty file: nothing to read");
  const uint64_t blocks = (file.origin.size + file.block_size - 1) / file.block_size;
  auto pins = std::make_shared<std::vector<BlockCache::PinPtr>>();
  pins->reserve(blocks);
  for (uint64_t i = 0; i < blocks; i++) {
    const BlockAddr addr{file.dataset_id, file.version, file.file_id, i};
    auto pin = cache_->Acquire(addr);
    if (!pin) return absl::NotFoundError(absl::StrCat("block ", i, " is not resident"));
    if (!pin->verified) {
      if (!VerifyPinned(*pin)) return absl::NotFoundError(absl::StrCat("block ", i, " was bad"));
      cache_->MarkVerified(addr);
    }
    pins->push_back(std::move(pin));
  }
  return FileSystem::Backing{pins->front()->fd, pins};
}

bool ReadPath::VerifyPinned(const BlockCache::Pin& pin) {
  std::string buf(pin.length, '\0');
  if (PreadFull(pin.fd, pin.offset, pin.length, buf.data()) &&
      BlockChecksum(buf.data(), buf.size()) == pin.checksum) {
    return true;
  }
  // Concurrent readers of the same bad copy: the one that drops it counts and logs it.
  if (cache_->Drop(pin.addr, pin.generation)) {
    checksum_failures_++;
    spdlog::error("cache: block {}/{}/{}/{} failed its checksum on disk; dropped, refetching",
                  pin.addr.dataset_id, pin.addr.version, pin.addr.file_id, pin.addr.index);
  }
  return false;
}

std::shared_ptr<ReadPath::Fill> ReadPath::FillOnce(
    const FileRef& file, uint64_t index, bool allow_origin,
    const std::function<void(uint64_t)>* before_origin) {
  const BlockAddr addr{file.dataset_id, file.version, file.file_id, index};
  std::shared_ptr<Fill> fill;
  bool leader = false;
  {
    std::lock_guard lock(inflight_mu_);
    auto it = inflight_.find(addr);
    if (it != inflight_.end()) {
      fill = it->second;
    } else {
      fill = std::make_shared<Fill>();
      inflight_.emplace(addr, fill);
      leader = true;
    }
  }
  if (leader && (cache_->Resident(addr) || RecentGet(addr))) {
    // A fill that ended between the caller's look at the cache and here: nothing to fetch.
    std::lock_guard lock(fill->mu);
    fill->already = fill->cached = fill->done = fill->settled = true;
    fill->cv.notify_all();
  } else if (leader && FillBlock(file, index, fill, allow_origin, before_origin)) {
    return fill;  // a writer thread stores the block and ends the fill
  }
  if (leader) {
    std::lock_guard lock(inflight_mu_);
    inflight_.erase(addr);
  } else {
    std::unique_lock lock(fill->mu);
    fill->cv.wait(lock, [&] { return fill->done; });
  }
  return fill;
}

absl::StatusOr<ReadPath::Source> ReadPath::Prefetch(
    const FileRef& file, uint64_t index, bool allow_origin,
    const std::function<void(uint64_t)>& before_origin) {
  const BlockAddr addr{file.dataset_id, file.version, file.file_id, index};
  if (cache_->Resident(addr)) return Source::kResident;
  std::shared_ptr<Fill> fill = FillOnce(file, index, allow_origin, &before_origin);
  if (!fill->status.ok()) return fill->status;
  if (fill->already) return Source::kResident;
  {
    // A prefetch counts (and pins) resident blocks: wait for the cache write, not just the bytes.
    std::unique_lock lock(fill->mu);
    fill->cv.wait(lock, [&] { return fill->settled; });
    if (fill->conflict) {
      return OriginChanged();
    }
  }
  return fill->from_peer ? Source::kPeer : Source::kOrigin;
}

bool ReadPath::FillBlock(const FileRef& file, uint64_t index, const std::shared_ptr<Fill>& fill,
                         bool allow_origin, const std::function<void(uint64_t)>* before_origin) {
  const BlockAddr addr{file.dataset_id, file.version, file.file_id, index};
  const uint64_t offset = index * file.block_size;
  const size_t len = static_cast<size_t>(std::min(file.block_size, file.origin.size - offset));
  misses_++;
  auto data = std::make_shared<BlockBuffer>(len);
  absl::Status st = absl::OkStatus();
  // A peer first: the origin is read once for the whole cluster.
  static metrics::Histogram* const peer_fill = metrics::Global().GetHistogram(
      "ember_fill_seconds", "Block fills that succeeded, by source (peer fetch or origin read).",
      {{"source", "peer"}});
  static metrics::Histogram* const origin_fill = metrics::Global().GetHistogram(
      "ember_fill_seconds", "Block fills that succeeded, by source (peer fetch or origin read).",
      {{"source", "origin"}});
  auto fill_start = std::chrono::steady_clock::now();
  auto fill_seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - fill_start).count();
  };
  absl::StatusOr<uint64_t> from_peer = absl::NotFoundError("no peers");
  if (peers_ != nullptr && !(allow_origin && peers_->LikelyUnheld(addr))) {
    from_peer = peers_->Fetch(addr, static_cast<uint32_t>(len), data->data());
  }
  uint64_t sum = 0;
  bool claim = false;
  if (from_peer.ok()) {
    peer_fill->Observe(fill_seconds());
    bytes_peers_ += len;
    sum = *from_peer;
  } else if (!allow_origin) {
    st = absl::NotFoundError("no peer holds the block yet");
  } else {
    if (before_origin != nullptr && *before_origin) (*before_origin)(len);  // rate limit
    fill_start =
        std::chrono::steady_clock::now();  // the origin's time, not the peers' or the limiter's
    st = origin_->Read(file.origin, offset, len, data->data());
    if (st.ok()) {
      origin_fill->Observe(fill_seconds());
      origin_reads_++;
      bytes_origin_ += len;
      sum = BlockChecksum(data->data(), len);
      // Meta's checksum, when a Locate told it, is checked before anyone gets the bytes; else
      // ours is claimed after the reply (a writer thread, batched with other fills).
      std::optional<uint64_t> known =
          peers_ != nullptr ? peers_->KnownChecksum(addr) : std::nullopt;
      if (Conflicting(addr) || (known && *known != sum)) {
        st = OriginChanged();
      } else {
        claim = meta_ != nullptr && !known;
      }
    }
  }
  if (!st.ok() && allow_origin) {
    spdlog::error("read: {} block {} of {}/{}: {}{}", file.dataset_name, index, file.origin.root,
                  file.origin.path, std::string(st.message()),
                  absl::IsFailedPrecondition(st)
                      ? absl::StrCat("; run `ember dataset refresh ", file.dataset_name, "`")
                      : "");
  }
  // Readers waiting on this fill get the bytes now, from memory; the cache write (a page-cache
  // copy that costs as much as the fetch on some machines) happens after, while they go on.
  // Readers arriving meanwhile join this (done) fill: it stays in flight until the write ends.
  {
    std::lock_guard lock(fill->mu);
    fill->status = st;
    fill->cached = false;
    fill->from_peer = from_peer.ok();
    fill->peer_only = !allow_origin;
    if (st.ok()) fill->data = data;
    fill->done = true;
    fill->cv.notify_all();
  }
  if (!st.ok()) {
    std::lock_guard lock(fill->mu);
    fill->settled = true;
    fill->cv.notify_all();
    return false;
  }
  RecentPut({addr, data});
  std::vector<Write> ws;
  ws.push_back(Write{addr, file.origin.size, offset, data, sum, fill, claim,
                     claim ? absl::StrCat(file.dataset_name, " block ", index, " of ",
                                          file.origin.root, "/", file.origin.path)
                           : std::string()});
  {
    std::lock_guard lock(write_mu_);
    if (writes_.size() < kMaxQueuedWrites &&
        queued_write_bytes_ + len <= std::max<uint64_t>(kMaxQueuedWriteBytes, len) &&
        !writers_stopping_) {
      queued_write_bytes_ += len;
      writes_.push_back(std::move(ws.front()));
      write_cv_.notify_one();
      return true;
    }
  }
  StoreAll(ws);
  return true;
}

void ReadPath::StoreAll(std::vector<Write>& ws) {
  std::vector<bool> conflict = ClaimChecksums(ws);
  for (size_t i = 0; i < ws.size(); i++) {
    const Write& w = ws[i];
    if (conflict[i]) {
      RecentErase(w.addr);
      {
        std::lock_guard lock(pending_mu_);
        conflicts_.insert(w.addr);
      }
      spdlog::error(
          "read: {}: the origin's bytes differ from those first read for this dataset version "
          "(the origin changed in place); not cached, later reads fail; run `ember dataset "
          "refresh`",
          w.where);
    } else {
      cache_->Insert(w.addr, w.file_size, w.offset, w.data->view(),
                     w.checksum);  // or kept in memory
    }
    {
      std::lock_guard lock(w.fill->mu);
      w.fill->conflict = conflict[i];
      w.fill->settled = true;
      w.fill->cv.notify_all();
    }
    std::lock_guard lock(inflight_mu_);
    auto it = inflight_.find(w.addr);
    if (it != inflight_.end() && it->second == w.fill) inflight_.erase(it);
  }
}

void ReadPath::Writer() {
  for (;;) {
    std::vector<Write> ws;
    {
      std::unique_lock lock(write_mu_);
      write_cv_.wait(lock, [&] { return writers_stopping_ || !writes_.empty(); });
      if (writes_.empty()) return;
      while (!writes_.empty()) {  // all that queued up: one meta call for their checksums
        queued_write_bytes_ -= writes_.front().data->size();
        ws.push_back(std::move(writes_.front()));
        writes_.pop_front();
      }
    }
    StoreAll(ws);
  }
}

std::vector<bool> ReadPath::ClaimChecksums(const std::vector<Write>& ws) {
  std::vector<bool> conflict(ws.size(), false);
  rpc::RecordChecksumsRequest req;
  std::vector<size_t> which;
  for (size_t i = 0; i < ws.size(); i++) {
    if (!ws[i].claim) continue;
    auto* c = req.add_checksums();
    c->mutable_block()->set_dataset_id(ws[i].addr.dataset_id);
    c->mutable_block()->set_version(ws[i].addr.version);
    c->mutable_block()->set_file_id(ws[i].addr.file_id);
    c->mutable_block()->set_index(ws[i].addr.index);
    c->set_checksum(ws[i].checksum);
    which.push_back(i);
  }
  if (which.empty() || meta_ == nullptr) return conflict;
  auto r = meta_->RecordChecksums(req);
  if (!r.ok()) {
    // Meta is down: keep serving; the checksums are recorded when it returns.
    if (!meta_down_logged_.exchange(true)) {
      spdlog::warn("read: cannot record checksums in meta ({}); will retry",
                   std::string(r.status().message()));
    }
    std::lock_guard lock(pending_mu_);
    for (size_t i : which) pending_checksums_.emplace_back(ws[i].addr, ws[i].checksum);
    return conflict;
  }
  meta_down_logged_ = false;
  for (size_t k = 0; k < which.size() && k < static_cast<size_t>(r->conflict_size()); k++) {
    conflict[which[k]] = r->conflict(static_cast<int>(k));
  }
  return conflict;
}

bool ReadPath::Conflicting(const BlockAddr& addr) {
  std::lock_guard lock(pending_mu_);
  return conflicts_.count(addr) > 0;
}

void ReadPath::FlushPendingChecksums() {
  std::vector<std::pair<BlockAddr, uint64_t>> pending;
  {
    std::lock_guard lock(pending_mu_);
    pending.swap(pending_checksums_);
  }
  if (pending.empty() || meta_ == nullptr) return;
  rpc::RecordChecksumsRequest req;
  for (const auto& [a, sum] : pending) {
    auto* c = req.add_checksums();
    c->mutable_block()->set_dataset_id(a.dataset_id);
    c->mutable_block()->set_version(a.version);
    c->mutable_block()->set_file_id(a.file_id);
    c->mutable_block()->set_index(a.index);
    c->set_checksum(sum);
  }
  auto r = meta_->RecordChecksums(req);
  if (absl::IsNotFound(r.status()) || absl::IsInvalidArgument(r.status())) {
    // A dataset version removed meanwhile: nothing to record; the blocks age out of the cache.
    spdlog::warn("read: dropping {} pending checksums: {}", pending.size(),
                 std::string(r.status().message()));
    return;
  }
  if (!r.ok()) {
    std::lock_guard lock(pending_mu_);
    pending_checksums_.insert(pending_checksums_.end(), pending.begin(), pending.end());
    return;
  }
  for (int i = 0; i < r->conflict_size() && i < static_cast<int>(pending.size()); i++) {
    if (r->conflict(i)) {
      spdlog::error(
          "read: block {}/{}/{}/{} filled while meta was away conflicts with meta's "
          "checksum; dropping it",
          pending[i].first.dataset_id, pending[i].first.version, pending[i].first.file_id,
          pending[i].first.index);
      cache_->Drop(pending[i].first);
      std::lock_guard lock(pending_mu_);
      conflicts_.insert(pending[i].first);
    }
  }
}

std::optional<ReadPath::Recent> ReadPath::RecentGet(const BlockAddr& addr) {
  std::lock_guard lock(recent_mu_);
  for (auto it = recent_.begin(); it != recent_.end(); ++it) {
    if (it->addr == addr) {
      recent_.splice(recent_.begin(), recent_, it);
      return recent_.front();
    }
  }
  return std::nullopt;
}

void ReadPath::RecentErase(const BlockAddr& addr) {
  std::lock_guard lock(recent_mu_);
  recent_.remove_if([&](const Recent& r) { return r.addr == addr; });
}

void ReadPath::RecentPut(Recent r) {
  const size_t keep = options_.recent_blocks + std::max(0, options_.readahead_blocks);
  if (keep == 0) return;
  std::lock_guard lock(recent_mu_);
  recent_.push_front(std::move(r));
  if (recent_.size() > keep) recent_.pop_back();
}

void ReadPath::Readahead(const FileRef& file, uint64_t first, int count) {
  const uint64_t blocks = (file.origin.size + file.block_size - 1) / file.block_size;
  std::vector<BlockAddr> queued;
  std::unique_lock lock(queue_mu_);
  for (uint64_t i = first; i < first + count && i < blocks; i++) {
    if (queue_.size() >= kMaxQueuedReadahead) break;
    BlockAddr addr{file.dataset_id, file.version, file.file_id, i};
    if (cache_->Resident(addr)) continue;
    {
      std::lock_guard inflight(inflight_mu_);
      if (inflight_.count(addr)) continue;
    }
    queue_.emplace_back(file, i);
    queued.push_back(addr);
  }
  queue_cv_.notify_all();
  if (peers_ != nullptr && !queued.empty()) {
    lock.unlock();
    peers_->Prefetch(queued);  // one Locate for the whole readahead window
  }
}

void ReadPath::Worker() {
  while (true) {
    std::pair<FileRef, uint64_t> job;
    {
      std::unique_lock lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    if (cache_->Resident(
            {job.first.dataset_id, job.first.version, job.first.file_id, job.second})) {
      continue;
    }
    (void)GetBlock(job.first, job.second, /*count=*/false);  // the reader's visit counts
  }
}

}  // namespace ember::cachefs
