// PrefetchRunner::Run: one prefetch job's work on this node (prefetch.cc: the jobs from meta,
// their plans and pins). Its own blocks are located, then read from the origin (or a peer that
// holds them); the others' blocks wait for their owners, located a window at a time, and are
// fetched from them many per request; progress goes to meta as it goes.
#include <spdlog/spdlog.h>

#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cachefs/dataset_fs.h"
#include "cachefs/prefetch.h"
#include "common/units.h"

namespace ember::cachefs {
namespace {

constexpr int kWorkers = 16;  // fills mostly wait on peers, meta and the disk
constexpr size_t kMaxFailures = 20;
constexpr auto kReportEvery = std::chrono::milliseconds(500);
// This node's own blocks are located this many per call to meta.
constexpr size_t kLocateBatch = 1024;
// This node's own blocks are located while the others' are polled for, this many ahead of the
// workers.
constexpr size_t kOwnAhead = 4 * kLocateBatch;
// Others' blocks are located per owner, the first few its owner has not delivered yet: between
// kWindowMin and kWindowMax of them, the window doubling while all were there, doubling up to
// kWindowStart while none were (to see past a few blocks it may never deliver, not to ask for
// thousands it has not reached: an ImageNet-shaped prefetch located 15-19 addresses per block
// fetched that way), and else set to what arrived since the last look and a quarter more (an
// owner delivers in plan order, at a pace; a block it skipped goes to the back of its queue). One
// window for all owners located the same not-yet-delivered blocks of the slowest owner over and
// over: in a tiny-file prefetch to three nodes 2.7 addresses were located per block fetched, and a
// faster owner's blocks were found late, after they had left its memory. Calls go every kPollMin
// while blocks arrive, backing off to kPollMax while none do.
constexpr size_t kWindowMin = 16;
constexpr size_t kWindowStart = 256;
constexpr size_t kWindowMax = 4096;
// At most this many addresses per poll, shared by the owners with blocks waiting (an answer lists
// every holder of each block: in a large full-mode job it must stay far below meta's message cap).
constexpr size_t kLocateCallMax = 4096;
// A block meta located at a peer that then did not have it waits again, at most this many times;
// then it takes the origin route (a location meta keeps naming wrongly would loop forever).
constexpr int kMaxRewaits = 3;
// Blocks a prefetch worker has fetched whose cache writes it has not waited for yet.
constexpr size_t kUnsettled = 256;
constexpr uint64_t kUnsettledBytes = 8u << 20;
// Located blocks a worker fetches at once (one pipelined request per holder), up to this many
// bytes. Many tiny blocks per request, but not more than ~64 ImageNet-sized ones: 16 MiB batches
// made a 110 KB-file prefetch to 3 nodes 61-74 s where 8 MiB took 48-51 s.
constexpr size_t kPeerBatch = 256;
constexpr uint64_t kPeerBatchBytes = 8u << 20;
constexpr auto kPollMin = std::chrono::milliseconds(20);
constexpr auto kPollMax = std::chrono::milliseconds(200);

}  // namespace

void PrefetchRunner::Run(Running* r) {
  const rpc::PrefetchJob job = r->job;
  const auto& spec = job.spec();
  rpc::PrefetchNodeProgress progress;
  progress.set_node_id(node_id_);
  std::vector<Block> mine;
  std::vector<uint64_t> files;
  const auto t_start = std::chrono::steady_clock::now();
  auto view = Plan(job, &mine, &files);
  const auto t_plan = std::chrono::steady_clock::now();
  if (!view.ok()) {
    progress.set_finished(true);
    progress.set_note(absl::StrCat("cannot plan: ", view.status().message()));
    // Best effort: meta marks a node that never reports as failed for the job anyway.
    (void)meta_->ReportPrefetch(job.id(), progress);
    r->finished = true;
    return;
  }
  const int n = spec.nodes_size();
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (spec.nodes(i) == node_id_) k = i;
  }
  RateLimiter limiter(spec.origin_rate() / std::max(1, n));
  auto before_origin = [&](uint64_t bytes) { limiter.Acquire(bytes); };
  // Own small blocks read from the origin in one batch: at most this many bytes, under a rate
  // limit an eighth of a second's worth (the others wait for an owner that delivers steadily;
  // one that goes quiet for the owner grace is taken for dead).
  const uint64_t origin_batch_bytes =
      spec.origin_rate() == 0
          ? ReadPath::kSmallBatchBytes
          : std::min<uint64_t>(ReadPath::kSmallBatchBytes, spec.origin_rate() / std::max(1, n) / 8);

  // By the plan's file number (Block::file): a tiny-file dataset has hundreds of thousands.
  std::vector<FileRef> refs;
  refs.reserve(files.size());
  for (uint64_t id : files) refs.push_back(MakeFileRef(**view, id));
  std::vector<uint64_t> left_in_file(files.size(), 0);
  for (const auto& b : mine) {
    left_in_file[b.file]++;
    progress.set_bytes_total(progress.bytes_total() + refs[b.file].BlockLength(b.index));
  }
  progress.set_blocks_total(mine.size());
  progress.set_files_total(files.size());
  auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  spdlog::info(
      "prefetch {}: {} blocks of {} for this node (planned in {} ms, {} ms more to set up)",
      job.id(), mine.size(), spec.dataset(), ms(t_plan - t_start),
      ms(std::chrono::steady_clock::now() - t_plan));

  struct Item {
    Block block;
    FillRoute route = FillRoute::kPeersOnly;
    int rewaits = 0;      // times a located peer did not have it
    int skips = 0;        // polls that found its owner's later blocks but not this one
    bool unheld = false;  // own, and meta located it at no peer: straight from the origin
  };
  // Guards the queues, `left`, progress and left_in_file while the workers run. Lock order:
  // mu -> the cache's (SetPin of a block just made resident).
  absl::Mutex mu;
  absl::CondVar cv;
  std::deque<Item> own;      // blocks to fill now from a peer that has them, else the origin
  std::deque<Item> located;  // others' blocks a peer holds now: peer-only fills
  // Others' blocks their owners have not delivered yet, by owner, in plan order.
  std::vector<std::deque<Item>> waiting(static_cast<size_t>(n));
  // For the log: addresses located and calls while waiting; polls that moved blocks of silent
  // owners to the origin route.
  uint64_t located_addrs = 0, locate_calls = 0, expiry_polls = 0;
  size_t left = mine.size();  // blocks not yet done, wherever they are
  const auto start = std::chrono::steady_clock::now();
  const int64_t pin_until = job.pin_until_unix_ms();

  // Others' blocks wait for their owners (the poll below locates them a window at a time);
  // this node's own blocks are located after the workers have started (below).
  std::vector<Block> mine_own;
  for (const Block& b : mine) {
    if (b.ordinal % n == static_cast<uint64_t>(k)) {
      mine_own.push_back(b);
    } else {
      waiting[b.ordinal % n].push_back({b, FillRoute::kPeersOnly});
    }
  }
  // Accounts for one block, once it is resident (or failed). REQUIRES: mu.
  auto account = [&](const Item& item, const absl::StatusOr<ReadPath::Source>& src) {
    const Block& b = item.block;
    const FileRef& ref = refs[b.file];
    const uint64_t len = ref.BlockLength(b.index);
    if (!src.ok()) {
      progress.set_blocks_failed(progress.blocks_failed() + 1);
      if (static_cast<size_t>(progress.failures_size()) < kMaxFailures) {
        progress.add_failures(
            absl::StrCat(ref.origin.path, " (block ", b.index, "): ", src.status().message()));
      }
    } else {
      if (*src == ReadPath::Source::kOrigin) {
        progress.set_bytes_from_origin(progress.bytes_from_origin() + len);
      } else if (*src == ReadPath::Source::kPeer) {
        progress.set_bytes_from_peers(progress.bytes_from_peers() + len);
      }
      if (pin_until > NowUnixMs()) {
        cache_->SetPin({ref.dataset_id, ref.version, ref.file_id, b.index}, pin_until);
      }
    }
    progress.set_blocks_done(progress.blocks_done() + 1);
    progress.set_bytes_done(progress.bytes_done() + len);
    if (--left_in_file[b.file] == 0) progress.set_files_done(progress.files_done() + 1);
    if (--left == 0) cv.SignalAll();
  };
  // Each worker keeps up to kUnsettled blocks' cache writes in flight (small blocks arrive faster
  // than one write per worker could keep up with) and counts them once stored.
  struct Pending {
    Item item;
    absl::StatusOr<ReadPath::Source> src;
    std::shared_ptr<Fill> fill;
  };
  // A pending fill holds its block's bytes: settle by bytes too (large blocks), not only count.
  struct Unsettled {
    std::vector<Pending> fills;
    uint64_t bytes = 0;  // their blocks' bytes
  };
  auto settle = [&](Unsettled& pending) {
    for (Pending& p : pending.fills) {
      if (auto s = read_path_->Settled(p.fill); !s.ok()) p.src = s;
    }
    absl::MutexLock lock(&mu);
    for (Pending& p : pending.fills) account(p.item, p.src);
    pending.fills.clear();
    pending.bytes = 0;
  };
  // What a worker does with a block it started: waits for a fill's write later (with the
  // others in flight), puts a peer-only block no peer gave back to wait, or counts it now.
  auto started_one = [&](Unsettled& pending, const Item& item, absl::StatusOr<ReadPath::Source> src,
                         std::shared_ptr<Fill> fill) {
    if (fill != nullptr) {
      pending.fills.push_back({item, std::move(src), std::move(fill)});
      pending.bytes += refs[item.block.file].BlockLength(item.block.index);
      if (pending.fills.size() >= kUnsettled || pending.bytes >= kUnsettledBytes) settle(pending);
      return;
    }
    absl::MutexLock lock(&mu);
    if (!src.ok() && absl::IsNotFound(src.status()) && item.route == FillRoute::kPeersOnly) {
      // The peer meta named no longer has it: wait again (a few times; then the origin route).
      Item again = item;
      if (++again.rewaits > kMaxRewaits) {
        again.route = FillRoute::kPeersThenOrigin;
        own.push_back(again);
        cv.SignalAll();
      } else {
        waiting[item.block.ordinal % n].push_back(again);
      }
    } else {
      account(item, src);
    }
  };
  auto worker = [&] {
    Unsettled pending;
    std::vector<Item> batch;
    bool take_own = false;
    while (true) {
      Item item;
      bool idle = false;
      {
        absl::MutexLock lock(&mu);
        // Nothing to fetch: settle what is in flight here (it counts in `left`), else wait.
        while (!r->cancel && left > 0 && own.empty() && located.empty() && pending.fills.empty()) {
          cv.WaitWithTimeout(&mu, absl::Milliseconds(100));
        }
        if (r->cancel || left == 0) return;
        idle = own.empty() && located.empty();
        if (!idle) {
          // Others' blocks (while their holders still have them in memory) and this node's own
          // in turn: an owner that only served others would deliver nothing of its share for
          // long enough to be taken for dead, and its blocks read from the origin twice.
          take_own = !take_own;
          if (own.empty() || (!located.empty() && !take_own)) {
            // Located blocks go many at a time (one request per holder), the newest located
            // first: likelier still in their holder's memory (ImageNet-shaped, 3 nodes: served
            // from memory 56-61% -> 61-74%, the holders' disk reads 3.5-4.4 -> 1.7-2.7 GB).
            uint64_t bytes = 0;
            while (!located.empty() && batch.size() < kPeerBatch && bytes < kPeerBatchBytes) {
              batch.push_back(located.back());
              bytes += refs[batch.back().block.file].BlockLength(batch.back().block.index);
              located.pop_back();
            }
          } else {
            item = own.front();
            own.pop_front();
            // Own small blocks no peer holds go to the origin many at a time (one batch of
            // reads, ReadPath::StartFromOrigin), as a reader's folder batch does.
            if (item.unheld && ReadPath::Batchable(refs[item.block.file])) {
              uint64_t bytes = refs[item.block.file].origin.size;
              batch.push_back(item);
              while (!own.empty() && batch.size() < ReadPath::kSmallBatch && own.front().unheld &&
                     ReadPath::Batchable(refs[own.front().block.file]) &&
                     bytes + refs[own.front().block.file].origin.size <= origin_batch_bytes) {
                bytes += refs[own.front().block.file].origin.size;
                batch.push_back(own.front());
                own.pop_front();
              }
            }
          }
        }
      }
      if (idle) {
        settle(pending);
        continue;
      }
      if (!batch.empty()) {
        std::vector<std::pair<const FileRef*, uint64_t>> blocks;
        for (const Item& it : batch) blocks.push_back({&refs[it.block.file], it.block.index});
        std::vector<ReadPath::Started> started =
            batch.front().unheld ? read_path_->StartFromOrigin(blocks, before_origin)
                                 : read_path_->StartFromPeers(blocks);
        for (size_t i = 0; i < batch.size(); i++) {
          started_one(pending, batch[i], std::move(started[i].src), std::move(started[i].fill));
        }
        batch.clear();
        continue;
      }
      std::shared_ptr<Fill> fill;
      auto src = read_path_->StartResident(refs[item.block.file], item.block.index, item.route,
                                           before_origin, &fill);
      started_one(pending, item, std::move(src), std::move(fill));
    }
  };
  std::vector<std::thread> workers;
  for (int i = 0; i < kWorkers; i++) workers.emplace_back(worker);
  // Report while working.
  // Ends at once when the work is done (the final report follows without waiting out a period).
  absl::Notification done;
  std::thread reporter([&] {
    while (!done.WaitForNotificationWithTimeout(absl::FromChrono(kReportEvery))) {
      rpc::PrefetchNodeProgress snapshot;
      {
        absl::MutexLock lock(&mu);
        snapshot = progress;
      }
      // Best effort: the next report, and the final one (retried), carry the same progress.
      (void)meta_->ReportPrefetch(job.id(), snapshot);
    }
  });
  // Where this node's own blocks are now, one call to meta per kLocateBatch of them, kOwnAhead
  // ahead in each turn of the poll below (beside the windows of others' blocks), while the workers
  // already fill those located: a block a peer holds is fetched from it (a prefetch run again), the
  // others read from the origin (no call to meta per block). When meta says no other node holds
  // any block of the version (a first prefetch), the rest are not asked about. Only this node's
  // own blocks, and not before the workers start: locating all of them first (others' blocks
  // too, all unheld while their owners had not read them) kept the last node to start idle for
  // seconds in a tiny-file prefetch to three nodes (200 calls of 1,024 addresses).
  bool unheld = false;
  size_t own_at = 0;  // in mine_own: located up to here
  auto locate_own = [&] {
    const size_t end = std::min(mine_own.size(), own_at + kLocateBatch);
    std::vector<BlockAddr> addrs;
    for (size_t i = own_at; i < end; i++) {
      addrs.push_back(refs[mine_own[i].file].Block(mine_own[i].index));
    }
    absl::StatusOr<std::vector<bool>> held = std::vector<bool>(addrs.size(), false);
    if (!unheld) {
      held = read_path_->HeldByPeers(addrs);
      unheld = held.ok() && read_path_->LikelyUnheldByPeers(addrs.front());
    }
    absl::MutexLock lock(&mu);
    for (size_t i = own_at; i < end; i++) {
      // Meta unreachable: each fill asks for itself (and reads the origin if it must).
      own.push_back(
          {.block = mine_own[i],
           .route = held.ok() ? FillRoute::kKnownPeersThenOrigin : FillRoute::kPeersThenOrigin,
           .unheld = held.ok() && !(*held)[i - own_at]});
    }
    own_at = end;
    cv.SignalAll();
    if (own_at == mine_own.size()) {
      spdlog::info("prefetch {}: this node's own blocks located in {} ms", job.id(),
                   ms(std::chrono::steady_clock::now() - start));
    }
  };
  // This thread moves waiting blocks on: a window of each owner's first ones located in one call,
  // those a peer now holds to `located`. An owner is alive while its blocks keep arriving: only
  // when one has delivered nothing for owner_grace_ (it died) are its blocks read from the origin
  // here (measured from the job's start, a long prefetch read every block still waiting a
  // second time). Polls fast while blocks arrive, slower when not.
  std::vector<std::chrono::steady_clock::time_point> owner_seen(n, start);
  std::vector<size_t> window(n, kWindowStart);
  std::vector<bool> given_up(n, false);  // owners whose blocks went to the origin route
  auto poll = kPollMin;
  while (true) {
    // Own blocks located ahead of the workers by at least kOwnAhead (not a batch a turn: the
    // turns of a busy node were ~100 ms, and its workers ran out of own blocks).
    while (own_at < mine_own.size() && !r->cancel) {
      {
        absl::MutexLock lock(&mu);
        if (own.size() >= kOwnAhead) break;
      }
      locate_own();
    }
    std::vector<BlockAddr> addrs;
    std::vector<size_t> taken(n, 0);  // of each owner's first waiting blocks, in addrs in turn
    {
      absl::MutexLock lock(&mu);
      if (r->cancel || left == 0) break;
      size_t owners = 0;
      for (const auto& q : waiting) owners += q.empty() ? 0 : 1;
      const size_t cap = std::max(kWindowMin, kLocateCallMax / std::max<size_t>(owners, 1));
      for (int j = 0; j < n; j++) {
        const auto& q = waiting[j];
        for (size_t i = 0; i < q.size() && i < std::min(window[j], cap); i++, taken[j]++) {
          addrs.push_back(refs[q[i].block.file].Block(q[i].block.index));
        }
      }
    }
    bool moved = false;
    if (!addrs.empty()) {
      auto held = read_path_->HeldByPeers(addrs);
      locate_calls++;
      located_addrs += addrs.size();
      const auto now = std::chrono::steady_clock::now();
      absl::MutexLock lock(&mu);
      bool expired = false;
      size_t at = 0;  // in addrs
      for (int j = 0; j < n; j++) {
        // Workers only append to `waiting`: its first taken[j] items are the ones located.
        auto& q = waiting[j];
        auto is_held = [&](size_t i) { return held.ok() && (*held)[at + i]; };
        size_t found = 0, last_found = 0;
        for (size_t i = 0; i < taken[j]; i++) {
          if (is_held(i)) found++, last_found = i + 1;
        }
        if (found > 0) owner_seen[j] = now;
        // Silent for the grace (dead): its blocks go to the origin route.
        const bool silent = now - owner_seen[j] > owner_grace_;
        auto to_origin = [&](Item& item) {
          item.route = FillRoute::kPeersThenOrigin;
          own.push_back(item);
          moved = expired = true;
          given_up[j] = true;
        };
        // The owner delivers in plan order: a block before the last one found that is still
        // not there for a second look is skipped for now (to the back: an origin error at the
        // owner, say), so it cannot hold the window on itself; the others wait at the front.
        std::deque<Item> kept, skipped;
        for (size_t i = 0; i < taken[j]; i++) {
          Item& item = q[i];
          if (is_held(i)) {
            located.push_back(item);
            moved = true;
          } else if (silent) {
            to_origin(item);
          } else {
            // Out of order by a little (the owner's workers finish in any order): wait at the
            // front; skipped twice: to the back.
            (i < last_found && ++item.skips >= 2 ? skipped : kept).push_back(item);
          }
        }
        q.erase(q.begin(), q.begin() + static_cast<long>(taken[j]));
        q.insert(q.end(), skipped.begin(), skipped.end());
        // And the rest of a dead owner's share at once, not a window at a time (16 every 20 ms
        // would take minutes for a tiny-file dataset). Not when meta did not answer: that is no
        // news of the owner.
        if (held.ok() && silent) {
          for (Item& item : q) to_origin(item);
          q.clear();
        }
        q.insert(q.begin(), kept.begin(), kept.end());
        // Next time about as many as arrived since the last look, and some: the owner's pace.
        // Wider while all were there; while none were, up to kWindowStart (see above).
        if (held.ok() && taken[j] > 0) {
          window[j] = found == taken[j] ? std::min(window[j] * 2, kWindowMax)
                      : found == 0      ? std::min(window[j] * 2, kWindowStart)
                                        : std::clamp(found + found / 4, kWindowMin, kWindowMax);
        }
        at += taken[j];
      }
      if (expired) expiry_polls++;
      if (moved) cv.SignalAll();
    }
    poll = moved ? kPollMin : std::min(poll * 2, kPollMax);
    // While own blocks are left to locate, turns come at least every kPollMin.
    const auto wait = own_at < mine_own.size() ? kPollMin : poll;
    absl::MutexLock lock(&mu);
    if (!r->cancel && left > 0) cv.WaitWithTimeout(&mu, absl::FromChrono(wait));
  }
  for (auto& w : workers) w.join();
  done.Notify();
  reporter.join();
  {
    absl::MutexLock lock(&mu);
    progress.set_finished(true);
    if (r->cancel) progress.set_note("cancelled");
  }
  r->pinned_until = pin_until;
  r->finished = true;
  // Meta learns where the blocks are before it hears this node finished: `ember prefetch`
  // returning means `ember locality` counts them.
  if (report_locations_) report_locations_();
  for (int attempt = 0; attempt < 20; attempt++) {
    if (meta_->ReportPrefetch(job.id(), progress).ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  spdlog::info(
      "prefetch {}: finished here: {} of {} blocks, {} failed, {} bytes from origin, {} "
      "from peers; {} addresses located in {} calls while waiting for others' blocks; gave up on "
      "{} silent owners in {} polls",
      job.id(), progress.blocks_done(), progress.blocks_total(), progress.blocks_failed(),
      progress.bytes_from_origin(), progress.bytes_from_peers(), located_addrs, locate_calls,
      std::count(given_up.begin(), given_up.end(), true), expiry_polls);
}

}  // namespace ember::cachefs
