#include "cachefs/fetch/read_path.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/memory.h"

namespace ember::cachefs {
namespace {
constexpr int kWriterThreads = 2;
}  // namespace

ReadPath::ReadPath(BlockCache* cache, origin::Origin* origin, ChecksumBook* checksums,
                   const Options& options, PeerFetcher* peers, Scrubber* scrubber)
    : cache_(cache),
      checksums_(checksums),
      peers_(peers),
      scrubber_(scrubber),
      options_(options),
      sources_(origin, peers, checksums),
      recent_(options.recent_blocks + static_cast<size_t>(std::max(0, options.readahead_blocks))),
      write_behind_(
          std::make_unique<WriteBehind>(cache, checksums, &recent_, &inflight_, kWriterThreads)),
      readahead_(std::make_unique<Readahead>(cache, &inflight_, peers, options.fill_threads,
                                             [this](const FileRef& file, uint64_t index) {
                                               // The reader's visit counts, not this fill. A failed
                                               // fill was logged (FillSources); the reader's own
                                               // read meets the error, or fills the block, again.
                                               GetBlock(file, index, /*count=*/false).IgnoreError();
                                             })) {}

ReadPath::~ReadPath() {
  readahead_.reset();     // its workers fill through everything else
  write_behind_.reset();  // writers store what is queued
}

ReadStats ReadPath::GetStats() const {
  ReadStats s;
  s.hits = hits_;
  s.misses = misses_;
  s.bytes_from_cache = bytes_cache_;
  s.bytes_from_origin = sources_.bytes_from_origin();
  s.bytes_from_peers = sources_.bytes_from_peers();
  if (peers_ != nullptr) {
    s.peer_fetches = peers_->fetches();
    s.peer_errors = peers_->errors();
  }
  s.origin_block_reads = sources_.origin_block_reads();
  return s;
}

std::unique_ptr<ReadStream> ReadPath::OpenStream(const FileRef& file) const {
  return std::make_unique<ReadStream>(file);
}

absl::StatusOr<ReadResult> ReadPath::Read(ReadStream& stream, uint64_t offset, size_t size,
                                          char* buf, const NextSmallFiles* next) {
  // Sequential reader: queue the next blocks once per block boundary crossed.
  // readahead_blocks 0: none.
  const int most = std::max(0, options_.readahead_blocks);
  auto [first, count] =
      stream.Advance(offset, size, std::min(options_.readahead_min_blocks, most), most);
  // Queue skips (and wakes nobody for) blocks past the end: a small file queues nothing.
  if (count > 0) readahead_->Queue(stream.file(), first, count);
  return ReadBlocks(stream.file(), offset, size, &stream, buf, next);
}

absl::StatusOr<ReadResult> ReadPath::Read(const FileRef& file, uint64_t offset, size_t size,
                                          char* buf) {
  return ReadBlocks(file, offset, size, nullptr, buf);
}

absl::StatusOr<ReadResult> ReadPath::ReadBlocks(const FileRef& file, uint64_t offset, size_t size,
                                                ReadStream* stream, char* buf,
                                                const NextSmallFiles* next) {
  ReadResult result;
  const uint64_t file_size = file.origin.size;
  if (offset >= file_size || size == 0) return result;
  const uint64_t end = std::min<uint64_t>(file_size, offset + size);
  if (buf == nullptr) {
    auto owned = std::make_shared<std::vector<char>>(end - offset);
    buf = owned->data();
    result.holds.push_back(std::move(owned));
  }
  const uint64_t bs = file.block_size;
  for (uint64_t index = offset / bs; index * bs < end; index++) {
    const bool count = stream == nullptr || stream->Enter(index);
    const uint64_t block_start = index * bs;
    const uint64_t from = std::max(offset, block_start);
    const uint64_t to = std::min(end, block_start + bs);
    Segment seg;
    seg.len = to - from;
    for (int attempt = 0;; attempt++) {
      auto block = GetBlock(file, index, count && attempt == 0, next);
      if (!block.ok()) return block.status();
      if (!block->hold) {
        if (!block->filled) bytes_cache_ += seg.len;  // a recent block kept in memory
        seg.data = block->data->data() + (from - block_start);
        result.holds.push_back(std::move(block->data));
        break;
      }
      // Cached: checked into the reply buffer, at this piece's place in the reply.
      char* dst = buf + (from - offset);
      absl::Status st = cache_->ReadVerified(
          *block->hold, block->hold->offset + (from - block_start), seg.len, dst);
      if (st.ok()) {
        if (!block->filled) bytes_cache_ += seg.len;
        seg.data = dst;
        break;
      }
      // Quarantined (bad bytes on disk): filled again from a peer or the origin, as a miss.
      if (!absl::IsDataLoss(st) || attempt >= 2) return st;
    }
    // Contiguous pieces of the reply buffer make one segment.
    if (!result.segments.empty()) {
      Segment& prev = result.segments.back();
      const char* const reply_end = buf + (end - offset);
      const bool both_in_buf =
          prev.data >= buf && prev.data < reply_end && seg.data >= buf && seg.data < reply_end;
      if (both_in_buf && prev.data + prev.len == seg.data) {
        prev.len += seg.len;
        result.total += seg.len;
        continue;
      }
    }
    result.total += seg.len;
    result.segments.push_back(seg);
  }
  return result;
}

absl::StatusOr<ReadPath::BlockBytes> ReadPath::GetBlock(const FileRef& file, uint64_t index,
                                                        bool count, const NextSmallFiles* next) {
  const BlockAddr addr = file.Block(index);
  bool filled = false;
  for (int attempt = 0; attempt < 5; attempt++) {
    if (auto recent = recent_.Get(addr)) {
      // The policy sees every access, wherever it is served from. (A block it did not admit is
      // offered again at its next fill, once it has left memory: offering it on every access
      // here admits whatever is being read and thrashes a loop larger than the cache.)
      if (count) cache_->Touch(addr);
      if (!filled) hits_++;
      return BlockBytes{nullptr, std::move(recent), filled};
    }
    if (auto hold = cache_->Acquire(addr, count)) {
      if (!filled) hits_++;
      return BlockBytes{std::move(hold), nullptr, filled};
    }
    filled = true;
    const bool small = next != nullptr && *next && Batchable(file);
    Fill::Result fill = (small ? FillSmallFiles(file, *next)
                               : FillOnce(file, index, FillRoute::kPeersThenOrigin, nullptr))
                            ->WaitDone();
    if (fill.already) filled = false;  // someone else's fill ended just before: a hit
    if (!fill.status.ok() && fill.peer_only) continue;  // joined a prefetch's peer-only try
    if (!fill.status.ok()) return fill.status;
    if (!fill.already) return BlockBytes{nullptr, std::move(fill.data), true};
    // Already stored: loop to hold it (it may be evicted in between; then we fill again).
  }
  return absl::UnavailableError(
      absl::StrCat("block ", index, " of ", file.origin.path, " could not be read after retries"));
}

namespace {

// What a passthrough open holds: every block of the file, and a fd of its own. When it ends, the
// kernel has been reading the file's pages itself, unchecked: the cache stops trusting them.
struct PassthroughHold {
  std::vector<BlockHoldPtr> holds;
  std::shared_ptr<const void> fd;
  BlockCache* cache = nullptr;
  ~PassthroughHold() {
    if (!holds.empty()) cache->ForgetPageChecks(holds.front()->addr);
  }
};

}  // namespace

absl::StatusOr<FileSystem::Backing> ReadPath::HoldFile(const FileRef& file, bool verified_only) {
  if (file.origin.size == 0) return absl::NotFoundError("empty file: nothing to read");
  const uint64_t blocks = file.Blocks();
  auto hold = std::make_shared<PassthroughHold>();
  hold->cache = cache_;
  hold->holds.reserve(blocks);
  for (uint64_t i = 0; i < blocks; i++) {
    auto h = cache_->Acquire(file.Block(i));
    if (!h) return absl::NotFoundError(absl::StrCat("block ", i, " is not resident"));
    hold->holds.push_back(std::move(h));
  }
  if (blocks == 1 && hold->holds.front()->segment != 0) {
    // Packed into a segment: no file to hand the kernel; the mount's page cache serves it.
    return absl::NotFoundError("a small file packed into a segment");
  }
  if (verified_only && !cache_->AllChecked(hold->holds)) {
    // Not checked since the agent started (or changed since): this open is served by the
    // daemon, which checks what it reads; the scrubber checks the rest for the next open.
    if (scrubber_ != nullptr) {
      std::vector<BlockAddr> unchecked;
      for (const auto& h : hold->holds) {
        if (!h->checked) unchecked.push_back(h->addr);
      }
      scrubber_->CheckSoon(unchecked);
    }
    return absl::NotFoundError("not every block is checked since the agent started");
  }
  int fd = -1;
  hold->fd = cache_->OpenBacking(file.Block(0), &fd);
  if (!hold->fd) return absl::NotFoundError("the cache file cannot be opened");
  // Raw pointers: the caller keeps `hold` (so the cache) alive for as long as it may ask.
  PassthroughHold* const h = hold.get();
  return FileSystem::Backing{fd, hold, [h] { return h->cache->AllChecked(h->holds); }};
}

std::shared_ptr<Fill> ReadPath::FillOnce(const FileRef& file, uint64_t index, FillRoute route,
                                         const std::function<void(uint64_t)>* before_origin) {
  const BlockAddr addr = file.Block(index);
  auto [fill, leader] = inflight_.Join(addr);
  if (!leader) return fill;  // the caller waits for it to be done
  if (EndIfThere(addr, fill)) return fill;
  if (FillBlock(file, index, fill, route, before_origin)) {
    return fill;  // write-behind stores the block and ends the fill
  }
  inflight_.End(addr, fill);
  return fill;
}

bool ReadPath::EndIfThere(const BlockAddr& addr, const std::shared_ptr<Fill>& fill) {
  uint64_t checksum = 0;
  if (!cache_->Resident(addr) && recent_.Peek(addr, &checksum) == nullptr) return false;
  // A fill that ended between the caller's look at the cache and the Join: nothing to fetch.
  fill->Finish({.already = true});
  fill->Settle(false);
  inflight_.End(addr, fill);
  return true;
}

std::shared_ptr<Fill> ReadPath::FillSmallFiles(const FileRef& file, const NextSmallFiles& next) {
  const BlockAddr addr = file.Block(0);
  // A peer may hold it: peer first, one file at a time (the origin is read once per cluster).
  // An origin that reads one file after another (S3, HTTP): the reader would wait for the batch.
  if (!LikelyUnheldByPeers(addr) || !sources_.OriginReadsManyAtOnce(file)) {
    return FillOnce(file, 0, FillRoute::kPeersThenOrigin, nullptr);
  }
  auto [fill, leader] = inflight_.Join(addr);
  if (!leader || EndIfThere(addr, fill)) return fill;
  // This call leads the fills of the next small files that are neither cached nor in flight.
  const std::vector<FileRef> more = next(kSmallBatch - 1);
  std::vector<std::pair<const FileRef*, uint64_t>> lead{{&file, 0}};
  std::vector<std::shared_ptr<Fill>> fills{fill};
  uint64_t bytes = file.origin.size;
  for (const FileRef& f : more) {
    const BlockAddr a = f.Block(0);
    if (!Batchable(f) || cache_->Resident(a)) continue;
    if (bytes + f.origin.size > kSmallBatchBytes) break;
    auto [g, leads] = inflight_.Join(a);
    if (!leads || EndIfThere(a, g)) continue;  // someone else's fill, or there already
    lead.emplace_back(&f, 0);
    fills.push_back(std::move(g));
    bytes += f.origin.size;
  }
  std::vector<FillSources::Fetched> got = sources_.FetchFromOrigin(lead);
  for (size_t k = 0; k < lead.size(); k++) {
    misses_++;
    // A neighbour read on a reader's behalf that failed was only a try, as a peer-only fill is:
    // a reader that joined it reads the file itself (and meets the file's own error there), so
    // a neighbour's trouble of the moment (no fd free, say) never reaches a reader of it.
    // A failed fill leaves the table before its waiters wake: one that tries again leads a
    // fill of its own instead of joining this one again.
    const bool failed = !got[k].status.ok();
    const FillRoute route = k == 0 || !failed ? FillRoute::kPeersThenOrigin : FillRoute::kPeersOnly;
    if (failed) inflight_.End(lead[k].first->Block(0), fills[k]);
    Deliver(*lead[k].first, 0, fills[k], route, std::move(got[k]));  // a failure: settled too
  }
  return fill;
}

absl::StatusOr<ReadPath::Source> ReadPath::MakeResident(
    const FileRef& file, uint64_t index, FillRoute route,
    const std::function<void(uint64_t)>& before_origin) {
  std::shared_ptr<Fill> fill;
  auto src = StartResident(file, index, route, before_origin, &fill);
  if (!src.ok() || fill == nullptr) return src;
  // A prefetch counts (and pins) resident blocks: wait for the cache write, not just the bytes.
  if (auto s = Settled(fill); !s.ok()) return s;
  return src;
}

absl::StatusOr<ReadPath::Source> ReadPath::StartResident(
    const FileRef& file, uint64_t index, FillRoute route,
    const std::function<void(uint64_t)>& before_origin, std::shared_ptr<Fill>* unsettled) {
  unsettled->reset();
  for (int attempt = 0;; attempt++) {
    if (cache_->Resident(file.Block(index))) return Source::kResident;
    std::shared_ptr<Fill> fill = FillOnce(file, index, route, &before_origin);
    Fill::Result r = fill->WaitDone();
    // Joined a fill that was only a try (peer-only, or a neighbour in a reader's folder batch)
    // and failed: this one may read the origin, so it fills the block itself.
    if (!r.status.ok() && r.peer_only && AllowsOrigin(route) && attempt < 4) continue;
    if (!r.status.ok()) return r.status;
    if (r.already) return Source::kResident;
    *unsettled = std::move(fill);
    return r.from_peer ? Source::kPeer : Source::kOrigin;
  }
}

ReadPath::Joined ReadPath::JoinMany(const std::vector<std::pair<const FileRef*, uint64_t>>& blocks,
                                    std::vector<Started>* out) {
  Joined j;
  j.fills.resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); i++) {
    const BlockAddr addr = blocks[i].first->Block(blocks[i].second);
    if (cache_->Resident(addr)) {
      (*out)[i].src = Source::kResident;
      continue;
    }
    auto [fill, leader] = inflight_.Join(addr);
    j.fills[i] = fill;
    if (!leader || EndIfThere(addr, fill)) continue;  // someone else's fill: waited for below
    j.lead.push_back(blocks[i]);
    j.lead_at.push_back(i);
  }
  return j;
}

void ReadPath::WaitMany(std::vector<std::shared_ptr<Fill>>& fills, std::vector<Started>* out,
                        const std::function<void(size_t)>& after_failed_try) {
  for (size_t i = 0; i < fills.size(); i++) {
    if (fills[i] == nullptr) continue;
    Fill::Result r = fills[i]->WaitDone();
    Started& o = (*out)[i];
    if (!r.status.ok() && r.peer_only && after_failed_try) {
      after_failed_try(i);
    } else if (!r.status.ok()) {
      o.src = r.status;
    } else if (r.already) {
      o.src = Source::kResident;
    } else {
      o.src = r.from_peer ? Source::kPeer : Source::kOrigin;
      o.fill = std::move(fills[i]);
    }
  }
}

std::vector<ReadPath::Started> ReadPath::StartFromPeers(
    const std::vector<std::pair<const FileRef*, uint64_t>>& blocks) {
  std::vector<Started> out(blocks.size());
  Joined j = JoinMany(blocks, &out);
  std::vector<FillSources::Fetched> got = sources_.FetchFromPeers(j.lead);
  for (size_t k = 0; k < j.lead.size(); k++) {
    const auto& [file, index] = j.lead[k];
    const BlockAddr addr = file->Block(index);
    const std::shared_ptr<Fill>& fill = j.fills[j.lead_at[k]];
    FillSources::Fetched& f = got[k];
    misses_++;
    fill->Finish({.status = f.status, .data = f.data, .from_peer = true, .peer_only = true});
    if (!f.status.ok()) {
      fill->Settle(false);
      inflight_.End(addr, fill);
      continue;
    }
    // Not among the recent blocks (see the header): readers that come meanwhile join the fill,
    // and the cache holds it from when the fill ends.
    write_behind_->Submit({addr, file->origin.size, index * file->block_size, f.data, f.checksum,
                           fill, /*claim=*/false, std::string()});
  }
  WaitMany(j.fills, &out, nullptr);
  return out;
}

std::vector<ReadPath::Started> ReadPath::StartFromOrigin(
    const std::vector<std::pair<const FileRef*, uint64_t>>& blocks,
    const std::function<void(uint64_t bytes)>& before_origin) {
  std::vector<Started> out(blocks.size());
  auto one_by_one = [&](size_t i) {
    out[i].src = StartResident(*blocks[i].first, blocks[i].second, FillRoute::kKnownPeersThenOrigin,
                               before_origin, &out[i].fill);
  };
  if (blocks.empty() || !sources_.OriginReadsManyAtOnce(*blocks.front().first)) {
    for (size_t i = 0; i < blocks.size(); i++) one_by_one(i);
    return out;
  }
  Joined j = JoinMany(blocks, &out);
  uint64_t bytes = 0;
  for (const auto& [file, index] : j.lead) bytes += file->BlockLength(index);
  if (!j.lead.empty() && before_origin) before_origin(bytes);  // rate limit
  std::vector<FillSources::Fetched> got = sources_.FetchFromOrigin(j.lead);
  for (size_t k = 0; k < j.lead.size(); k++) {
    misses_++;
    const auto& [file, index] = j.lead[k];
    const std::shared_ptr<Fill>& fill = j.fills[j.lead_at[k]];
    // A failure is settled by Deliver and leaves the table here, as FillOnce's.
    if (!Deliver(*file, index, fill, FillRoute::kKnownPeersThenOrigin, std::move(got[k]))) {
      inflight_.End(file->Block(index), fill);
    }
  }
  // A joined peer-only try that failed: this one may read the origin, so it fills the block.
  WaitMany(j.fills, &out, one_by_one);
  return out;
}

absl::Status ReadPath::Settled(const std::shared_ptr<Fill>& fill) {
  write_behind_->Hurry();  // someone waits: no lingering for a batch
  return fill->WaitSettled() ? OriginChanged() : absl::OkStatus();
}

bool ReadPath::FillBlock(const FileRef& file, uint64_t index, const std::shared_ptr<Fill>& fill,
                         FillRoute route, const std::function<void(uint64_t)>* before_origin) {
  misses_++;
  return Deliver(file, index, fill, route, sources_.Fetch(file, index, route, before_origin));
}

bool ReadPath::Deliver(const FileRef& file, uint64_t index, const std::shared_ptr<Fill>& fill,
                       FillRoute route, FillSources::Fetched f) {
  const BlockAddr addr = file.Block(index);
  // Readers waiting on this fill get the bytes now, from memory; the cache write happens after,
  // while they go on. Readers arriving meanwhile join this (done) fill: it stays in flight until
  // the write ends.
  fill->Finish({.status = f.status,
                .data = f.data,
                .from_peer = f.from_peer,
                .peer_only = !AllowsOrigin(route)});
  if (!f.status.ok()) {
    fill->Settle(false);
    return false;
  }
  recent_.Put(addr, f.data, f.checksum, !f.from_peer);
  const uint64_t offset = index * file.block_size;
  write_behind_->Submit({addr, file.origin.size, offset, f.data, f.checksum, fill, f.claim,
                         f.claim ? absl::StrCat(file.dataset_name, " block ", index, " of ",
                                                file.origin.root, "/", file.origin.path)
                                 : std::string()});
  return true;
}

std::shared_ptr<const BlockBuffer> ReadPath::RecentBlock(const BlockAddr& addr,
                                                         uint64_t* checksum) {
  return recent_.Peek(addr, checksum);
}

absl::StatusOr<std::vector<bool>> ReadPath::HeldByPeers(const std::vector<BlockAddr>& addrs) {
  if (peers_ == nullptr) return std::vector<bool>(addrs.size(), false);
  return peers_->Holders(addrs);
}

bool ReadPath::LikelyUnheldByPeers(const BlockAddr& addr) {
  return peers_ == nullptr || peers_->LikelyUnheld(addr);
}

void ReadPath::DropIdleRecent() {
  constexpr auto kIdle = std::chrono::seconds(30);
  constexpr size_t kWorthReleasing = 16u << 20;
  if (recent_.DropUnusedSince(std::chrono::steady_clock::now() - kIdle) >= kWorthReleasing) {
    ReleaseFreeMemory();
  }
}

void ReadPath::FlushPendingChecksums() {
  for (const BlockAddr& addr : checksums_->Flush()) cache_->Drop(addr);
}

}  // namespace ember::cachefs
