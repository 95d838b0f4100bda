#include "cachefs/volume/volume_upload.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/ids.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {

constexpr auto kPassEvery = std::chrono::seconds(2);

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " '", path, "': ", strerror(errno)));
}

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// The origin's own directory, which this never creates. Returns: Ok; Unavailable.
absl::Status Reachable(const rpc::Volume& vol) {
  struct stat st;
  if (stat(vol.origin().c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::UnavailableError(
        absl::StrCat("origin '", vol.origin(), "' of volume ", vol.name(), " is unreachable"));
  }
  return absl::OkStatus();
}

// Directories under the origin leading to `rel` (relative path of a file).
absl::Status MakeParents(const rpc::Volume& vol, const std::string& rel) {
  const std::string parent = Parent(rel);
  if (parent.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(absl::StrCat(vol.origin(), "/", parent), ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot make '", vol.origin(), "/", parent, "': ", ec.message()));
  }
  return absl::OkStatus();
}

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
      if (f.file_id() == 0) continue;
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
    if (absl::Status r = Reachable(vol); !r.ok()) {
      spdlog::warn("volume {}: uploads wait: {}", vol.name(), std::string(r.message()));
      continue;
    }
    for (const rpc::VolumeInode* g : deletes) {
      absl::Status s = DeleteDiscarded(vol, *g);
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
      ++done;
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
        absl::Status s = MakeParents(vol, to);
        bool uploaded = false;
        OriginCopy copy;
        if (s.ok() && persisted) {
          s = Move(vol, *f, to, &copy);
          if (absl::IsNotFound(s)) {  // the origin lost it: put it there again
            s = Upload(vol, *f, to, &copy);
            uploaded = true;
          }
        } else if (s.ok()) {
          s = Upload(vol, *f, to, &copy);
          uploaded = true;
        }
        if (s.ok()) s = MarkPersisted(vol, *f, to, copy);
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
        evictable.insert({vol.id(), f->file_id()});
        ++done;
      }
    }
  }
  store_->SetEvictable(std::move(evictable));
  // Contents replaced, unlinked or of removed volumes.
  if (complete) store_->DropUnreferenced(live, sealed_before, writing);
  return done;
}

absl::Status VolumeUploader::Move(const rpc::Volume& vol, const rpc::VolumeInode& n,
                                  const std::string& to_rel, OriginCopy* copy) {
  const std::string from = absl::StrCat(vol.origin(), "/", n.persisted_path());
  const std::string to = absl::StrCat(vol.origin(), "/", to_rel);
  struct stat st;
  if (rename(from.c_str(), to.c_str()) == 0) {
    // The old directory, now empty (a step.tmp/ renamed whole): best effort.
    (void)rmdir(Parent(from).c_str());
    if (lstat(to.c_str(), &st) != 0) return Errno("cannot stat", to);
    *copy = OriginCopy::Of(st);
    return SyncPath(Parent(to));
  }
  if (errno != ENOENT) return Errno("cannot rename", from);
  // Moved by a pass that could not tell meta (it died, or meta did not answer)?
  if (lstat(to.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) == n.size() &&
      (n.origin_file_ino() == 0 || OriginCopy::Of(st).ino == n.origin_file_ino())) {
    *copy = OriginCopy::Of(st);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("'", from, "' is gone"));
}

absl::Status VolumeUploader::DeleteDiscarded(const rpc::Volume& vol, const rpc::VolumeInode& g) {
  const std::string path = absl::StrCat(vol.origin(), "/", g.persisted_path());
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : Errno("cannot stat", path);
  }
  const OriginCopy there = OriginCopy::Of(st);
  if (g.origin_file_ino() == 0) {  // which file it was is not known: it stays
    spdlog::info("volume {}: '{}' is kept in the origin (uploaded before copies were recorded)",
                 vol.name(), path);
    return absl::OkStatus();
  }
  if (!S_ISREG(st.st_mode) || there.ino != g.origin_file_ino() ||
      there.mtime_ns != g.origin_mtime_ns() || there.size != g.size()) {
    // Another file's copy was put there since (a later save of the same name): not ours.
    return absl::OkStatus();
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("cannot delete", path);
  std::string dir = Parent(g.persisted_path());
  RETURN_IF_ERROR(SyncPath(dir.empty() ? vol.origin() : absl::StrCat(vol.origin(), "/", dir)));
  // Directories left empty (a whole step/ removed), up to the origin's own: best effort.
  for (; !dir.empty(); dir = Parent(dir)) {
    if (rmdir(absl::StrCat(vol.origin(), "/", dir).c_str()) != 0) break;
  }
  return absl::OkStatus();
}

absl::Status VolumeUploader::Upload(const rpc::Volume& vol, const rpc::VolumeInode& n,
                                    const std::string& path, OriginCopy* copy) {
  absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> w = store_->Open(vol.id(), n.file_id());
  if (!w.ok()) return w.status();  // not here (dropped as corrupt): another holder's turn later
  const VolumeStore::Whole& whole = **w;
  const std::string to = absl::StrCat(vol.origin(), "/", path);
  const std::string dir = Parent(to);
  const std::string tmp =
      absl::StrCat(dir, "/.", to.substr(dir.size() + 1), ".ember-", n.file_id(), ".tmp");
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  absl::Cleanup drop = [&] {
    if (fd >= 0) close(fd);
    unlink(tmp.c_str());
  };
  std::unique_ptr<char[]> buf(new char[whole.block_size]);
  for (uint64_t i = 0; i * whole.block_size < whole.size; ++i) {
    const uint64_t off = i * whole.block_size;
    const size_t len = static_cast<size_t>(std::min(whole.block_size, whole.size - off));
    Yield();
    if (!PreadFull(whole.fd, off, len, buf.get())) return Errno("cannot read", "volume copy");
    if (BlockChecksum(buf.get(), len) != whole.sums[i]) {
      // Never upload bytes that are not what was committed: drop the copy (CheckBlock).
      absl::Status bad = store_->CheckBlock(whole, vol.id(), n.file_id(), i);
      return bad.ok() ? absl::DataLossError("a block changed while it was read") : bad;
    }
    if (!PwriteFull(fd, off, buf.get(), len)) return Errno("cannot write", tmp);
  }
  if (fdatasync(fd) != 0) return Errno("cannot sync", tmp);
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("cannot stat", tmp);
  *copy = OriginCopy::Of(st);  // a rename keeps both
  close(fd);
  fd = -1;
  if (rename(tmp.c_str(), to.c_str()) != 0) return Errno("cannot rename", tmp);
  std::move(drop).Cancel();
  return SyncPath(dir);
}

absl::Status VolumeUploader::MarkPersisted(const rpc::Volume& vol, const rpc::VolumeInode& n,
                                           const std::string& path, const OriginCopy& copy) {
  rpc::VolumeOpRequest req;
  req.set_volume(vol.name());
  req.mutable_persisted()->set_ino(n.ino());
  req.mutable_persisted()->set_file_id(n.file_id());
  req.mutable_persisted()->set_path(path);
  req.mutable_persisted()->set_origin_file_ino(copy.ino);
  req.mutable_persisted()->set_origin_mtime_ns(copy.mtime_ns);
  req.mutable_persisted()->set_size(copy.size);
  req.mutable_persisted()->set_node(node_id_);
  return meta_->VolumeOp(req).status();
}

}  // namespace ember::cachefs
