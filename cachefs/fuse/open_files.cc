#include "cachefs/fuse/open_files.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cachefs/fuse/errno.h"
#include "cachefs/fuse/kernel_protocol.h"
#include "cachefs/fuse/supervisor.h"

namespace ember::cachefs {
namespace {

// FUSE_DEV_IOC_BACKING_OPEN / _CLOSE (7.40): register a backing file for passthrough.
struct BackingMap {
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
constexpr unsigned long kIocBackingOpen = _IOW(229, 1, BackingMap);
constexpr unsigned long kIocBackingClose = _IOW(229, 2, uint32_t);

}  // namespace

OpenFiles::OpenFiles(FileSystem* fs, int fuse_fd, bool direct_io, bool no_open)
    : fs_(fs), fuse_fd_(fuse_fd), direct_io_(direct_io), no_open_(no_open) {}

void OpenFiles::SetNegotiated(bool passthrough, bool direct_io_mmap) {
  passthrough_ = passthrough;
  direct_io_mmap_ = direct_io_mmap;
}

void OpenFiles::SetSupervisor(int sock) {
  absl::MutexLock lock(&mu_);
  supervisor_ = sock;
}

size_t OpenFiles::Restore(const KernelFuseState& state) {
  // Re-derive what the predecessor held: a FileSystem handle per open file, and the holds of
  // every file the kernel reads through a backing file (they must not be evicted meanwhile).
  std::unordered_map<uint64_t, OpenRecord> opens;
  std::unordered_map<uint64_t, Inode> inodes;
  size_t held = 0;
  for (const auto& f : state.open_files) {
    OpenRecord o;
    o.ino = f.ino;
    o.passthrough = f.passthrough;
    Inode& in = inodes[f.ino];
    if (f.passthrough) {
      in.passthrough_opens++;
      auto it = state.backing_ids.find(f.ino);
      if (it != state.backing_ids.end()) in.backing_id = it->second;
      if (!in.hold) {
        auto b = fs_->OpenBacking(f.ino, /*verified_only=*/false);  // the kernel reads it already
        if (b.ok()) {
          in.hold = b->hold;
          in.still_checked = b->still_checked;
          held++;
        } else {
          spdlog::error("takeover: cannot hold the blocks of open file (inode {}): {}", f.ino,
                        std::string(b.status().message()));
        }
      }
    } else {
      in.cached_opens++;
      auto h = fs_->Open(f.ino, O_RDONLY);
      if (h.ok()) o.handle = std::move(*h);  // else Read goes on without per-file state
    }
    opens[f.fh] = std::move(o);
  }
  absl::MutexLock lock(&mu_);
  // Backing files the predecessor kept lingering, with no open file now: unregistered here.
  for (const auto& [ino, id] : state.backing_ids) {
    auto it = inodes.find(ino);
    if (it == inodes.end() || it->second.backing_id != id) CloseBacking(id);
  }
  opens_ = std::move(opens);
  inodes_ = std::move(inodes);
  next_fh_ = state.next_fh;
  return held;
}

void OpenFiles::Adopt(uint64_t ino, std::unique_ptr<FileSystem::FileHandle> handle, Opened* out) {
  absl::MutexLock lock(&mu_);
  OpenRecord o;
  o.ino = ino;
  o.handle = std::move(handle);
  // No FOPEN_KEEP_CACHE: contents may have changed since the last open.
  // Uncached (a volume file open for writing) only where a shared mmap of it still works.
  out->open_flags =
      o.handle != nullptr && o.handle->Uncached() && direct_io_mmap_ ? FOPEN_DIRECT_IO : 0;
  out->backing_id = 0;
  out->fh = next_fh_++;
  opens_[out->fh] = std::move(o);
  daemon_opens_++;
}

int OpenFiles::Open(uint64_t ino, int flags, Opened* out) {
  auto h = fs_->Open(ino, flags);
  if (!h.ok()) return ToErrno(h.status());
  if ((*h)->Volatile()) {
    Adopt(ino, std::move(*h), out);
    return 0;
  }
  std::shared_ptr<FileSystem::FileHandle> handle = std::move(*h);
  // Passthrough while no open file of this inode goes through us (the kernel refuses to mix the
  // two on one inode), and only for files whose blocks are all resident (then held). Holding
  // (and verifying after a restart) happens outside the lock.
  // A lingering backing (no open now) is reused only after the same check as a first open.
  std::vector<std::shared_ptr<const void>> unhold;  // released after the lock
  bool try_backing;
  std::function<bool()> recheck;
  std::shared_ptr<const void> recheck_hold;
  std::chrono::steady_clock::time_point lingering_since{};
  {
    absl::MutexLock lock(&mu_);
    SweepLocked(&unhold);
    const Inode& in = inodes_[ino];
    if (passthrough_ && in.cached_opens == 0 && in.backing_id > 0 && in.passthrough_opens == 0) {
      recheck = in.still_checked;
      recheck_hold = in.hold;  // keeps what `recheck` reads alive if the linger ends meanwhile
      lingering_since = in.idle_since;
    }
    try_backing = passthrough_ && in.cached_opens == 0 && in.backing_id == 0;
  }
  if (lingering_since != std::chrono::steady_clock::time_point{} && (!recheck || !recheck())) {
    // Not trusted any more: let it go; this open goes the way of a first one.
    absl::MutexLock lock(&mu_);
    auto it = inodes_.find(ino);
    if (it != inodes_.end() && it->second.backing_id > 0 && it->second.passthrough_opens == 0 &&
        it->second.idle_since == lingering_since) {
      EndBackingLocked(it, &unhold);
    }
    it = inodes_.find(ino);
    try_backing = passthrough_ && (it == inodes_.end() ||
                                   (it->second.cached_opens == 0 && it->second.backing_id == 0));
  }
  absl::StatusOr<FileSystem::Backing> backing = absl::NotFoundError("not tried");
  if (try_backing) backing = fs_->OpenBacking(ino);
  std::shared_ptr<FileSystem::FileHandle> unused;  // released after the lock
  absl::MutexLock lock(&mu_);
  Inode& in = inodes_[ino];
  OpenRecord o;
  o.ino = ino;
  if (passthrough_ && in.cached_opens == 0) {
    if (in.backing_id == 0 && backing.ok()) {
      BackingMap map{backing->fd, 0, 0};
      int id = ioctl(fuse_fd_, kIocBackingOpen, &map);
      if (id > 0) {
        in.backing_id = id;
        in.hold = backing->hold;
        in.still_checked = backing->still_checked;
        backing_registrations_++;
      } else {
        spdlog::warn("fuse: passthrough unavailable ({}); reads go through the daemon",
                     strerror(errno));
        passthrough_ = false;
      }
    }
    if (in.backing_id > 0) {
      o.passthrough = true;
      in.passthrough_opens++;
      in.idle_since = {};                                   // in use again: no longer lingering
      out->open_flags = FOPEN_PASSTHROUGH | FOPEN_NOFLUSH;  // read-only: nothing to flush
      out->backing_id = in.backing_id;
    }
  }
  if (!o.passthrough) {
    in.cached_opens++;
    // Contents never change: later opens keep the page cache. With --direct-io (and
    // passthrough, so cached files still get a page cache: their backing file's), a file not
    // yet wholly cached is read without the mount's page cache: the reply lands in the reader's
    // buffer. Off by default: it also turns off the kernel's readahead, so a reader with 4-8 KiB
    // reads makes one round trip per read. Needs the kernel's mmap support for such files.
    // Nothing to flush at close (FOPEN_NOFLUSH): read-only.
    out->open_flags =
        (direct_io_ && passthrough_ && direct_io_mmap_ ? FOPEN_DIRECT_IO : FOPEN_KEEP_CACHE) |
        FOPEN_NOFLUSH;
    o.handle = std::move(handle);
    daemon_opens_++;
  } else {
    unused = std::move(handle);  // the kernel reads the backing file; no handle needed here
    passthrough_opens_++;
  }
  const bool passthrough = o.passthrough;
  out->fh = next_fh_++;
  opens_[out->fh] = std::move(o);
  if (supervisor_ >= 0) {
    // Every open: a successor must know which inodes the kernel has open through us, as it
    // refuses passthrough opens of those.
    SendOpenUpdate(supervisor_, true, {out->fh, ino, passthrough}, in.backing_id);
  }
  return 0;
}

std::shared_ptr<FileSystem::FileHandle> OpenFiles::Handle(uint64_t fh) {
  absl::MutexLock lock(&mu_);
  auto it = opens_.find(fh);
  return it == opens_.end() ? nullptr : it->second.handle;
}

std::shared_ptr<FileSystem::FileHandle> OpenFiles::InodeHandle(uint64_t ino) {
  {
    absl::MutexLock lock(&mu_);
    auto it = stream_of_.find(ino);
    if (it != stream_of_.end()) {
      streams_.splice(streams_.begin(), streams_, it->second);
      return it->second->second;
    }
  }
  auto h = fs_->Open(ino, O_RDONLY);
  if (!h.ok()) return nullptr;
  std::shared_ptr<FileSystem::FileHandle> handle = std::move(*h);
  std::shared_ptr<FileSystem::FileHandle> dropped;  // destroyed after the lock
  absl::MutexLock lock(&mu_);
  auto [it, added] = stream_of_.try_emplace(ino);
  if (!added) return it->second->second;  // another reader of this file made it meanwhile
  streams_.emplace_front(ino, handle);
  it->second = streams_.begin();
  if (streams_.size() > kInodeStreams) {
    dropped = std::move(streams_.back().second);
    stream_of_.erase(streams_.back().first);
    streams_.pop_back();
  }
  return handle;
}

void OpenFiles::Release(uint64_t fh) {
  std::vector<std::shared_ptr<const void>> unhold;  // released after the lock
  std::shared_ptr<FileSystem::FileHandle> handle;   // likewise
  absl::MutexLock lock(&mu_);
  SweepLocked(&unhold);
  auto it = opens_.find(fh);
  if (it == opens_.end()) return;
  OpenRecord o = std::move(it->second);
  opens_.erase(it);
  handle = std::move(o.handle);
  auto in = inodes_.find(o.ino);
  if (in == inodes_.end()) {
    const bool reported = handle == nullptr || !handle->Volatile();  // Adopt reports none
    if (supervisor_ >= 0 && reported) {
      SendOpenUpdate(supervisor_, false, {fh, o.ino, o.passthrough}, 0);
    }
    return;
  }
  if (o.passthrough) {
    if (--in->second.passthrough_opens == 0 && in->second.backing_id > 0) {
      // Lingers: the next open within kLinger may reuse it (SweepLocked closes it after).
      in->second.idle_since = std::chrono::steady_clock::now();
      lingering_.emplace_back(o.ino, in->second.idle_since);
      if (lingering_.size() > kMaxLingering) {
        // The oldest lingering one goes now (its entry, stale or not, is dropped).
        const auto [ino, since] = lingering_.front();
        lingering_.pop_front();
        auto old = inodes_.find(ino);
        if (old != inodes_.end() && old->second.passthrough_opens == 0 &&
            old->second.backing_id > 0 && old->second.idle_since == since) {
          EndBackingLocked(old, &unhold);
        }
        in = inodes_.find(o.ino);
      }
    }
  } else if (in->second.cached_opens > 0) {
    in->second.cached_opens--;
  }
  // With the backing id still registered (lingering): a successor must know it, to close it.
  if (supervisor_ >= 0) {
    SendOpenUpdate(supervisor_, false, {fh, o.ino, o.passthrough}, in->second.backing_id);
  }
  if (in->second.passthrough_opens == 0 && in->second.cached_opens == 0 &&
      in->second.backing_id == 0) {
    inodes_.erase(in);
  }
}

void OpenFiles::SweepLocked(std::vector<std::shared_ptr<const void>>* unhold) {
  const auto now = std::chrono::steady_clock::now();
  while (!lingering_.empty() && now - lingering_.front().second >= kLinger) {
    const auto [ino, since] = lingering_.front();
    lingering_.pop_front();
    auto in = inodes_.find(ino);
    // Reopened since (idle_since reset or moved on): not this entry's to close.
    if (in == inodes_.end() || in->second.passthrough_opens > 0 || in->second.idle_since != since) {
      continue;
    }
    EndBackingLocked(in, unhold);
  }
}

void OpenFiles::EndBackingLocked(std::unordered_map<uint64_t, Inode>::iterator in,
                                 std::vector<std::shared_ptr<const void>>* unhold) {
  CloseBacking(in->second.backing_id);
  // The supervisor forgets the id (a release of no open file: fh 0 is never given out).
  if (supervisor_ >= 0) SendOpenUpdate(supervisor_, false, {0, in->first, false}, 0);
  in->second.backing_id = 0;
  in->second.idle_since = {};
  in->second.still_checked = nullptr;
  unhold->push_back(std::move(in->second.hold));
  if (in->second.cached_opens == 0) inodes_.erase(in);
}

void OpenFiles::CloseBacking(int32_t id) {
  if (id <= 0) return;
  uint32_t v = static_cast<uint32_t>(id);
  if (ioctl(fuse_fd_, kIocBackingClose, &v) != 0) {
    spdlog::debug("fuse: closing backing id {}: {}", id, strerror(errno));
  }
}

void OpenFiles::CloseAllBacking() {
  absl::MutexLock lock(&mu_);
  for (auto& [ino, in] : inodes_) CloseBacking(in.backing_id);
}

void OpenFiles::Snapshot(KernelFuseState* s) {
  absl::MutexLock lock(&mu_);
  SnapshotLocked(s);
}

void OpenFiles::SnapshotLocked(KernelFuseState* s) {
  s->next_fh = next_fh_;
  for (const auto& [fh, o] : opens_) s->open_files.push_back({fh, o.ino, o.passthrough});
  for (const auto& [ino, in] : inodes_) {
    if (in.backing_id > 0) s->backing_ids[ino] = in.backing_id;
  }
}

absl::Status OpenFiles::ReportState(KernelFuseState state) {
  absl::MutexLock lock(&mu_);
  if (supervisor_ < 0) return absl::OkStatus();
  SnapshotLocked(&state);
  return SendStateMessage(supervisor_, state);
}

OpenFiles::Stats OpenFiles::GetStats() {
  Stats s;
  s.passthrough = passthrough_;
  s.passthrough_opens = passthrough_opens_;
  s.daemon_opens = daemon_opens_;
  s.backing_registrations = backing_registrations_;
  std::vector<std::shared_ptr<const void>> unhold;  // released after the lock
  absl::MutexLock lock(&mu_);
  SweepLocked(&unhold);  // asked every few seconds (metrics, heartbeats): lingering ends
  for (const auto& [ino, in] : inodes_) {
    if (in.backing_id > 0 && in.passthrough_opens > 0) s.passthrough_files_open++;
  }
  return s;
}

}  // namespace ember::cachefs
