#include "cachefs/volume/volume_upload.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "cachefs/volume/volume_stream.h"
#include "common/file_io.h"
#include "common/ids.h"
#include "common/status.h"
#include "origin/writable.h"

namespace ember::cachefs {
namespace {

constexpr auto kPassEvery = std::chrono::seconds(2);

}  // namespace

VolumeUploader::VolumeUploader(meta::MetaClient* meta, VolumeStore* store, std::string node_id)
    : meta_(meta), store_(store), node_id_(std::move(node_id)) {
  thread_ = std::thread([this] { Loop(); });
}

VolumeUploader::~VolumeUploader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void VolumeUploader::Nudge() {
  absl::MutexLock lock(&mu_);
  nudged_ = true;
}

void VolumeUploader::Foreground(int delta) {
  absl::MutexLock lock(&mu_);
  busy_ += delta;
}

void VolumeUploader::Yield() {
  // In slices: a writer that starts waiting for room (which uploads make) ends the pause.
  for (;;) {
    absl::MutexLock lock(&mu_);
    if (busy_ <= 0 || stop_ || store_->Starved()) {
      if (busy_ <= 0) yielding_since_ = absl::InfinitePast();
      return;
    }
    const absl::Time now = absl::Now();
    if (yielding_since_ == absl::InfinitePast()) yielding_since_ = now;
    if (now >= yielding_since_ + kYieldAtMost) return;
    auto quiet = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || busy_ <= 0; };
    mu_.AwaitWithDeadline(absl::Condition(&quiet),
                          std::min(yielding_since_ + kYieldAtMost, now + absl::Milliseconds(200)));
  }
}

void VolumeUploader::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || nudged_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), absl::FromChrono(kPassEvery));
      if (stop_) return;
      nudged_ = false;
    }
    VolumeStream::ReleaseIdleBuffers();  // a restore's buffers, once it has been over a while
    if (absl::StatusOr<int> done = Pass(); !done.ok()) {
      spdlog::debug("volume uploads: {}", std::string(done.status().message()));
    }
  }
}

absl::StatusOr<int> VolumeUploader::Pass() {
  ASSIGN_OR_RETURN(std::vector<rpc::Volume> volumes, meta_->ListVolumes());
  if (volumes.empty()) return 0;
  ASSIGN_OR_RETURN(std::vector<rpc::Node> nodes, meta_->ListNodes());
  std::map<std::string, bool> alive;
  for (const auto& n : nodes) alive[n.id()] = n.state() == rpc::Node::ALIVE;
  alive[node_id_] = true;
  std::string first_alive;
  for (const auto& [id, up] : alive) {
    if (up) {
      first_alive = id;
      break;
    }
  }
  // Contents sealed before this (less a margin for clocks of seconds) and named by no file in
  // the listings below are garbage; anything sealed later may be a commit in progress.
  const absl::Time sealed_before = absl::Now() - absl::Minutes(2);
  int done = 0;
  bool complete = true;  // every volume's files known: contents nobody names may be dropped
  std::set<std::pair<uint32_t, uint64_t>> live, evictable, writing;
  for (const auto& vol : volumes) {
    absl::StatusOr<rpc::VolumeStatusResponse> st = meta_->VolumeStatus(vol.name());
    if (!st.ok()) {  // removed meanwhile, or meta away: the next pass
      complete = false;
      continue;
    }
    // Where each persisted file's copy is in the origin: nothing is written over another
    // file's copy (a rotation `mv latest prev` + a new `latest` must not lose the old one).
    std::map<std::string, uint64_t> occupied;  // origin path -> ino
    for (const rpc::VolumeInode& f : st->files()) {
      if (f.state() == rpc::VolumeInode::PERSISTED) occupied[f.persisted_path()] = f.ino();
    }
    std::vector<const rpc::VolumeInode*> mine;
    for (const rpc::VolumeInode& f : st->files()) {
      if (f.writing_file_id() != 0) {
        live.insert({vol.id(), f.writing_file_id()});
        writing.insert({vol.id(), f.writing_file_id()});
      }
      if (f.file_id() == 0) {  // an empty file (no contents to hold): the first live node puts it
        if (f.state() != rpc::VolumeInode::EMPTY && first_alive == node_id_) mine.push_back(&f);
        continue;
      }
      live.insert({vol.id(), f.file_id()});
      if (f.state() == rpc::VolumeInode::PERSISTED) evictable.insert({vol.id(), f.file_id()});
      for (const auto& h : f.holders()) {  // the first live holder uploads
        if (alive[h]) {
          if (h == node_id_) mine.push_back(&f);
          break;
        }
      }
    }
    // Copies in the origin of files removed or replaced since: the first live node that held
    // them deletes them (any live node when none is left).
    std::vector<const rpc::VolumeInode*> deletes;
    for (const rpc::VolumeInode& g : st->discarded()) {
      std::string by = first_alive;
      for (const auto& h : g.holders()) {
        if (alive[h]) {
          by = h;
          break;
        }
      }
      if (by == node_id_) deletes.push_back(&g);
    }
    if (mine.empty() && deletes.empty()) continue;
    absl::StatusOr<std::shared_ptr<origin::WritableOrigin>> opened =
        origin::SharedWritableOrigin(vol.origin());
    absl::Status reachable = opened.ok() ? (*opened)->Reachable() : opened.status();
    if (!reachable.ok()) {
      spdlog::warn("volume {}: uploads wait: {}", vol.name(), std::string(reachable.message()));
      continue;
    }
    origin::WritableOrigin& to_origin = **opened;
    // No upload or move goes to a path whose deletion is pending (a put landing between the
    // deletion's check and its delete would be lost): they wait for a pass after it.
    std::set<uint64_t> deleted;
    for (const rpc::VolumeInode* g : deletes) {
      absl::Status s = absl::OkStatus();
      if (g->origin_copy().empty()) {  // which file it was is not known: it stays
        spdlog::info("volume {}: '{}' is kept in the origin (uploaded before copies were named)",
                     vol.name(), g->persisted_path());
      } else {
        s = to_origin.DeleteIf(g->persisted_path(), {g->origin_copy(), g->size()});
      }
      if (s.ok()) {
        rpc::VolumeOpRequest req;
        req.set_volume(vol.name());
        req.mutable_origin_deleted()->set_file_id(g->file_id());
        s = meta_->VolumeOp(req).status();
      }
      if (!s.ok()) {
        spdlog::warn("volume {}: the copy of a removed file at '{}' not deleted yet: {}",
                     vol.name(), g->persisted_path(), std::string(s.message()));
        continue;
      }
      deleted.insert(g->file_id());
      ++done;
    }
    for (const rpc::VolumeInode& g : st->discarded()) {
      if (!deleted.contains(g.file_id())) occupied.emplace(g.persisted_path(), 0);
    }
    // Moves first (renamed since their upload), then uploads, so that the paths moves free are
    // free for the uploads of the same pass.
    for (int phase = 0; phase < 2; ++phase) {
      for (const rpc::VolumeInode* f : mine) {
        const std::string& path = f->name();  // Status gives each file's path here
        const bool persisted = f->state() == rpc::VolumeInode::PERSISTED;
        if (persisted && f->persisted_path() == path) continue;
        if ((phase == 0) != persisted) continue;
        std::string to = path;
        if (auto o = occupied.find(path); o != occupied.end() && o->second != f->ino()) {
          if (!persisted) continue;  // its holder moves it away first (this pass or the next)
          to = absl::StrCat(".ember-moving-", f->file_id());  // a swap: through a free name
        }
        bool uploaded = !persisted;
        absl::StatusOr<origin::OriginCopy> copy =
            persisted ? Move(to_origin, *f, to) : Upload(to_origin, vol, *f, to);
        if (persisted &&
            (absl::IsNotFound(copy.status()) || absl::IsUnimplemented(copy.status()))) {
          // The origin lost it (put it there again), or cannot move it (put it at the new path,
          // then delete the old).
          const bool old_there = absl::IsUnimplemented(copy.status());
          copy = Upload(to_origin, vol, *f, to);
          uploaded = true;
          if (copy.ok() && old_there) {
            if (absl::Status d =
                    to_origin.DeleteIf(f->persisted_path(), {f->origin_copy(), f->size()});
                !d.ok()) {
              spdlog::warn("volume {}: the old copy at '{}' stays: {}", vol.name(),
                           f->persisted_path(), std::string(d.message()));
            }
          }
        }
        absl::Status s = copy.status();
        if (s.ok()) s = MarkPersisted(vol, *f, to, *copy);
        if (CarriedErrno(s) == ENOENT) {  // removed meanwhile: meta lists the copy to delete
          spdlog::debug("volume {}: '{}' was removed while it was uploaded", vol.name(), path);
          continue;
        }
        if (!s.ok()) {
          spdlog::warn("volume {}: '{}' not {} yet: {}", vol.name(), path,
                       uploaded ? "uploaded" : "moved in the origin", std::string(s.message()));
          continue;
        }
        if (persisted) occupied.erase(f->persisted_path());
        occupied[to] = f->ino();
        if (f->file_id() != 0) evictable.insert({vol.id(), f->file_id()});
        ++done;
      }
    }
  }
  store_->SetEvictable(std::move(evictable));
  // Contents replaced, unlinked or of removed volumes.
  if (complete) store_->DropUnreferenced(live, sealed_before, writing);
  return done;
}

absl::StatusOr<origin::OriginCopy> VolumeUploader::Move(origin::WritableOrigin& to_origin,
                                                        const rpc::VolumeInode& n,
                                                        const std::string& to) {
  absl::StatusOr<origin::OriginCopy> moved = to_origin.Move(n.persisted_path(), to);
  if (!absl::IsNotFound(moved.status())) return moved;
  // Moved by a pass that could not tell meta (it died, or meta did not answer)?
  absl::StatusOr<origin::OriginCopy> there = to_origin.Stat(to);
  if (there.ok() && there->size == n.size() &&
      (n.origin_copy().empty() || there->id == n.origin_copy())) {
    return there;
  }
  return moved;
}

absl::StatusOr<origin::OriginCopy> VolumeUploader::Upload(origin::WritableOrigin& to_origin,
                                                          const rpc::Volume& vol,
                                                          const rpc::VolumeInode& n,
                                                          const std::string& path) {
  if (n.file_id() == 0) {  // empty
    return to_origin.Put(path, 0, 1, [](uint64_t, size_t, char*) { return absl::OkStatus(); });
  }
  absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> w = store_->Open(vol.id(), n.file_id());
  if (!w.ok()) return w.status();  // not here (dropped as corrupt): another holder's turn later
  const VolumeStore::Whole& whole = **w;
  return to_origin.Put(
      path, whole.size, whole.block_size, [&](uint64_t off, size_t len, char* buf) -> absl::Status {
        const uint64_t i = off / whole.block_size;
        Yield();
        if (!PreadFull(whole.fd, off, len, buf)) {
          return absl::UnavailableError(absl::StrCat("cannot read the volume copy: ",
                                                     errno == 0 ? "short" : strerror(errno)));
        }
        if (BlockChecksum(buf, len) != whole.sums[i]) {
          // Never upload bytes that are not what was committed: drop the copy (CheckBlock).
          absl::Status bad = store_->CheckBlock(whole, vol.id(), n.file_id(), i);
          return bad.ok() ? absl::DataLossError("a block changed while it was read") : bad;
        }
        return absl::OkStatus();
      });
}

absl::Status VolumeUploader::MarkPersisted(const rpc::Volume& vol, const rpc::VolumeInode& n,
                                           const std::string& path,
                                           const origin::OriginCopy& copy) {
  rpc::VolumeOpRequest req;
  req.set_volume(vol.name());
  req.mutable_persisted()->set_ino(n.ino());
  req.mutable_persisted()->set_file_id(n.file_id());
  req.mutable_persisted()->set_path(path);
  req.mutable_persisted()->set_origin_copy(copy.id);
  req.mutable_persisted()->set_size(copy.size);
  req.mutable_persisted()->set_node(node_id_);
  return meta_->VolumeOp(req).status();
}

}  // namespace ember::cachefs
