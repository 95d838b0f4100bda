#include "cachefs/volume/volume_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/memory.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {

constexpr uint64_t kSumsMagic = 0x31736d7573766d65;  // "emvsums1"
constexpr size_t kHeader = 24;
constexpr size_t kCopyChunk = 4u << 20;
constexpr uint64_t kFetchBytes = 32u << 20;  // asked of a peer in one pipelined request

absl::Status Errno(const std::string& what, const std::string& path) {
  const int err = errno;
  return ErrnoStatus(err == ENOSPC ? ENOSPC : EIO,
                     absl::StrCat(what, " '", path, "': ", strerror(err)));
}

void PutLe(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLe(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

VolumeStore::Whole::~Whole() {
  if (fd >= 0) close(fd);
}

VolumeStore::VolumeStore(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  size_t removed = 0;
  uint64_t used = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(dir_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string path = it->path().string();
    const bool tmp = absl::EndsWith(path, ".sums.tmp");
    const bool unfinished =
        !absl::EndsWith(path, ".sums") && !tmp && !std::filesystem::exists(path + ".sums", ec);
    if ((tmp || unfinished) && unlink(path.c_str()) == 0) {
      removed++;
    } else if (!tmp && !absl::EndsWith(path, ".sums")) {
      used += it->file_size(ec);
    }
  }
  {
    absl::MutexLock lock(&space_mu_);
    used_ = used;
  }
  if (removed > 0) {
    spdlog::info("volume: removed {} unfinished staging file(s) or copies from {}", removed, dir_);
  }
}

std::string VolumeStore::PathOf(uint32_t vol, uint64_t file_id) const {
  return absl::StrCat(dir_, "/", vol, "/", file_id);
}

absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> VolumeStore::Open(uint32_t vol,
                                                                            uint64_t file_id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Whole> w, OpenWhole(vol, file_id));
  return std::shared_ptr<const Whole>(std::move(w));
}

absl::StatusOr<std::shared_ptr<VolumeStore::Whole>> VolumeStore::OpenWhole(uint32_t vol,
                                                                           uint64_t file_id) {
  const std::string path = PathOf(vol, file_id);
  int sfd = open((path + ".sums").c_str(), O_RDONLY | O_CLOEXEC);
  if (sfd < 0) return absl::NotFoundError(absl::StrCat("contents ", file_id, " not here"));
  struct stat st;
  std::string sums;
  if (fstat(sfd, &st) == 0 && st.st_size >= static_cast<off_t>(kHeader)) {
    sums.resize(static_cast<size_t>(st.st_size));
    if (!PreadFull(sfd, 0, sums.size(), sums.data())) sums.clear();
  }
  close(sfd);
  auto w = std::make_shared<Whole>();
  if (sums.size() < kHeader || GetLe(sums.data()) != kSumsMagic) {
    return absl::DataLossError(absl::StrCat("'", path, ".sums' is not a checksum file"));
  }
  w->block_size = GetLe(sums.data() + 8);
  w->size = GetLe(sums.data() + 16);
  const uint64_t blocks = w->block_size == 0 ? 0 : (w->size + w->block_size - 1) / w->block_size;
  if (w->block_size == 0 || sums.size() != kHeader + 8 * blocks) {
    return absl::DataLossError(absl::StrCat("'", path, ".sums' does not match its header"));
  }
  for (uint64_t i = 0; i < blocks; ++i) w->sums.push_back(GetLe(sums.data() + kHeader + 8 * i));
  w->fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (w->fd < 0) return absl::NotFoundError(absl::StrCat("'", path, "' is gone"));
  if (fstat(w->fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != w->size) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not ", w->size, " bytes"));
  }
  return w;
}

absl::Status VolumeStore::CheckBlock(const Whole& w, uint32_t vol, uint64_t file_id,
                                     uint64_t index) {
  if (index >= w.sums.size()) return absl::OkStatus();
  const uint64_t off = index * w.block_size;
  const size_t len = static_cast<size_t>(std::min(w.block_size, w.size - off));
  std::unique_ptr<char[]> buf(new char[len]);
  if (PreadFull(w.fd, off, len, buf.get()) && BlockChecksum(buf.get(), len) == w.sums[index]) {
    return absl::OkStatus();
  }
  spdlog::error(
      "volume: block {} of contents {}/{} on disk does not match its checksum; the "
      "copy is dropped",
      index, vol, file_id);
  ForgetServing(vol, file_id);
  const std::string path = PathOf(vol, file_id);
  unlink((path + ".sums").c_str());
  return absl::DataLossError(absl::StrCat("block ", index, " of '", path, "' is corrupt"));
}

absl::StatusOr<int> VolumeStore::CreateStaging(uint32_t vol, uint64_t file_id) {
  std::error_code ec;
  std::filesystem::create_directories(absl::StrCat(dir_, "/", vol), ec);
  const std::string path = PathOf(vol, file_id);
  unlink((path + ".sums").c_str());
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", path);
  return fd;
}

absl::StatusOr<int> VolumeStore::CopyToStaging(uint32_t vol, uint64_t from, uint64_t to) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Whole> src, Open(vol, from));
  // The source is checked first: a bad block must not become part of new contents.
  for (uint64_t i = 0; i < src->sums.size(); ++i) {
    if (absl::Status st = CheckBlock(*src, vol, from, i); !st.ok()) {
      return ErrnoStatus(EIO, std::string(st.message()));
    }
  }
  RETURN_IF_ERROR(Reserve(src->size));
  ASSIGN_OR_RETURN(int fd, CreateStaging(vol, to));
  std::unique_ptr<char[]> buf(new char[kCopyChunk]);
  for (uint64_t off = 0; off < src->size; off += kCopyChunk) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kCopyChunk, src->size - off));
    if (!PreadFull(src->fd, off, len, buf.get()) || !PwriteFull(fd, off, buf.get(), len)) {
      absl::Status st = Errno("cannot copy into", PathOf(vol, to));
      close(fd);
      return st;
    }
  }
  return fd;
}

absl::Status VolumeStore::WriteSums(uint32_t vol, uint64_t file_id, uint64_t size,
                                    uint64_t block_size, const std::vector<uint64_t>& sums,
                                    bool sync) {
  std::string data;
  PutLe(&data, kSumsMagic);
  PutLe(&data, block_size);
  PutLe(&data, size);
  for (uint64_t s : sums) PutLe(&data, s);
  const std::string path = PathOf(vol, file_id) + ".sums";
  const std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", tmp);
  const bool ok = PwriteFull(fd, 0, data.data(), data.size()) && (!sync || fdatasync(fd) == 0);
  absl::Status st = ok ? absl::OkStatus() : Errno("cannot write", tmp);
  close(fd);
  if (st.ok() && rename(tmp.c_str(), path.c_str()) != 0) st = Errno("cannot rename", tmp);
  if (st.ok() && sync) st = SyncPath(absl::StrCat(dir_, "/", vol));
  if (!st.ok()) unlink(tmp.c_str());
  return st;
}

absl::StatusOr<std::vector<uint64_t>> VolumeStore::Seal(uint32_t vol, uint64_t file_id, int fd,
                                                        uint64_t block_size,
                                                        const std::vector<uint64_t>* known) {
  const std::string path = PathOf(vol, file_id);
  if (fdatasync(fd) != 0) return Errno("cannot sync", path);
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("cannot stat", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t blocks = (size + block_size - 1) / block_size;
  if (known != nullptr && known->size() == blocks) {
    RETURN_IF_ERROR(WriteSums(vol, file_id, size, block_size, *known, /*sync=*/true));
    return *known;
  }
  std::vector<uint64_t> sums;
  std::unique_ptr<char[]> buf(new char[block_size]);
  for (uint64_t off = 0; off < size; off += block_size) {
    const size_t len = static_cast<size_t>(std::min(block_size, size - off));
    if (!PreadFull(fd, off, len, buf.get())) return Errno("cannot read", path);
    sums.push_back(BlockChecksum(buf.get(), len));
  }
  RETURN_IF_ERROR(WriteSums(vol, file_id, size, block_size, sums, /*sync=*/true));
  return sums;
}

namespace {

// Reads blocks `want` (ascending) with `read_blocks`, a batch at a time (one pipelined request to
// a peer; the next batch is asked for while this one is checked and written, so that the network
// and the disk work at once), checks each against `expect[i]` and writes it at its offset in
// `fd`. Returns: Ok; the reader's error; DataLoss; the write's errno.
absl::Status CopyIn(int fd, const std::string& path, uint64_t file_id,
                    const std::vector<uint64_t>& want, uint64_t block_size, uint64_t size,
                    const std::function<uint64_t(uint64_t)>& expect,
                    const VolumeStore::BatchReader& read_blocks,
                    const std::function<void(uint64_t)>& written = nullptr) {
  using Piece = VolumeStore::Piece;
  const size_t batch = static_cast<size_t>(std::max<uint64_t>(1, kFetchBytes / block_size));
  std::shared_ptr<char[]> bufs[2] = {NewBulkBuffer(batch * block_size),
                                     NewBulkBuffer(batch * block_size)};
  auto ask = [&](size_t at, int which) {
    std::vector<Piece> pieces;
    for (size_t k = at; k < std::min(want.size(), at + batch); ++k) {
      const uint64_t off = want[k] * block_size;
      pieces.push_back(Piece{want[k], bufs[which].get() + (k - at) * block_size,
                             static_cast<size_t>(std::min(block_size, size - off))});
    }
    return std::async(std::launch::async, [&read_blocks, pieces = std::move(pieces)]() mutable {
      absl::Status got = read_blocks(pieces);
      return std::make_pair(got, std::move(pieces));
    });
  };
  absl::Status st;
  std::future<std::pair<absl::Status, std::vector<Piece>>> next;
  if (!want.empty()) next = ask(0, 0);
  for (size_t at = 0, which = 0; at < want.size() && st.ok(); at += batch, which ^= 1) {
    auto [got, pieces] = next.get();
    if (got.ok() && at + batch < want.size()) next = ask(at + batch, static_cast<int>(which ^ 1));
    st = got;
    for (const Piece& p : pieces) {
      if (!st.ok()) break;
      if (VolumeStore::SumOf(p) != expect(p.index)) {
        st = absl::DataLossError(absl::StrCat("block ", p.index, " of contents ", file_id,
                                              " from a peer does not match its checksum"));
      } else if (!PwriteFull(fd, p.index * block_size, p.buf, p.len)) {
        st = Errno("cannot write", path);
      } else if (written) {
        written(p.index);
      }
    }
  }
  if (next.valid()) next.wait();  // a batch asked for before a failure: its buffer is ours
  return st;
}

}  // namespace

uint64_t VolumeStore::SumOf(const Piece& p) {
  return p.received_sum.has_value() ? *p.received_sum : BlockChecksum(p.buf, p.len);
}

std::optional<VolumeStore::Ahead> VolumeStore::TakeAhead(std::pair<uint32_t, uint64_t> key,
                                                         uint64_t block_size) {
  {
    absl::MutexLock lock(&fetch_mu_);
    auto it = ahead_.find(key);
    if (it == ahead_.end()) return std::nullopt;
    if (it->second.block_size == block_size) {
      Ahead ahead = std::move(it->second);
      ahead_.erase(it);
      return ahead;
    }
  }
  Drop(key.first, key.second);  // of another block size: of no use (Drop frees its room)
  return std::nullopt;
}

std::shared_ptr<void> VolumeStore::CopyTurn(std::pair<uint32_t, uint64_t> key) {
  absl::MutexLock lock(&fetch_mu_);
  while (fetching_.count(key) > 0) fetched_.Wait(&fetch_mu_);
  fetching_.insert(key);
  return std::shared_ptr<void>(nullptr, [this, key](void*) {
    absl::MutexLock lock(&fetch_mu_);
    fetching_.erase(key);
    fetched_.SignalAll();
  });
}

absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> VolumeStore::Fetch(
    uint32_t vol, uint64_t file_id, uint64_t size, uint64_t block_size,
    const std::vector<uint64_t>& sums, const BatchReader& read_blocks, bool durable,
    const std::function<void(uint64_t)>& written) {
  // One copy of a contents id at a time; copies of different ids run side by side.
  const std::pair<uint32_t, uint64_t> key{vol, file_id};
  std::shared_ptr<void> turn = CopyTurn(key);
  if (auto have = Open(vol, file_id); have.ok()) {
    if (!durable) return have;
    // A copy made for reading was not synced: make it what a replica promises.
    const std::string path = PathOf(vol, file_id);
    RETURN_IF_ERROR(SyncPath(path));
    RETURN_IF_ERROR(SyncPath(path + ".sums"));
    RETURN_IF_ERROR(SyncPath(absl::StrCat(dir_, "/", vol)));
    return have;
  }
  const uint64_t blocks = (size + block_size - 1) / block_size;
  if (sums.size() != blocks) {
    return absl::InternalError(absl::StrCat("contents ", file_id, " of ", size, " bytes need ",
                                            blocks, " checksums, have ", sums.size()));
  }
  // Listed from here on, before room is found: a node following this copy (FromCopier) asks
  // whether it runs (CopyProgress) and waits for it rather than reading the origin too.
  {
    absl::MutexLock lock(&serving_mu_);
    copying_[key] = Partial{nullptr, std::vector<bool>(blocks), 0};
  }
  absl::Cleanup unlist = [this, key] {
    absl::MutexLock lock(&serving_mu_);
    copying_.erase(key);
  };
  std::optional<Ahead> ahead = TakeAhead(key, block_size);  // copied ahead of this commit
  const std::string path = PathOf(vol, file_id);
  int fd = -1;
  if (ahead) {
    if (size > ahead->end) {
      if (absl::Status room = Reserve(size - ahead->end); !room.ok()) {
        Drop(vol, file_id);
        return room;
      }
    }
    fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0 || (ahead->end > size && ftruncate(fd, static_cast<off_t>(size)) != 0)) {
      absl::Status st = Errno("cannot open", path);
      if (fd >= 0) close(fd);
      Drop(vol, file_id);
      Unreserve(size > ahead->end ? size - ahead->end : 0);
      return st;
    }
    if (ahead->end > size) Unreserve(ahead->end - size);
  } else {
    RETURN_IF_ERROR(Reserve(size));
    ASSIGN_OR_RETURN(fd, CreateStaging(vol, file_id));
  }
  // Peers may take each block as soon as it is in (nodes restoring the file at once copy the
  // copy this node makes of the origin's, GetBlock).
  {
    auto partial = std::make_shared<Whole>();
    partial->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    partial->size = size;
    partial->block_size = block_size;
    partial->sums = sums;
    absl::MutexLock lock(&serving_mu_);
    if (partial->fd >= 0) copying_[key].whole = std::move(partial);
  }
  auto in = [&](uint64_t i) {
    {
      absl::MutexLock lock(&serving_mu_);
      if (auto it = copying_.find(key); it != copying_.end() && !it->second.have[i]) {
        it->second.have[i] = true;
        ++it->second.in;
      }
    }
    if (written) written(i);
  };
  std::vector<uint64_t> want;
  for (uint64_t i = 0; i < blocks; ++i) {
    if (ahead) {
      auto it = ahead->sums.find(i);
      if (it != ahead->sums.end() && it->second == sums[i]) {  // here already
        in(i);
        continue;
      }
    }
    want.push_back(i);
  }
  absl::Status st = CopyIn(
      fd, path, file_id, want, block_size, size, [&sums](uint64_t i) { return sums[i]; },
      read_blocks, in);
  if (st.ok() && durable && fdatasync(fd) != 0) st = Errno("cannot sync", path);
  close(fd);
  // A copy for reading is not synced: its reads check every block against `sums` (a copy torn
  // by a power loss is dropped then and copied again). A replica is (the commit counts on it).
  if (st.ok()) st = WriteSums(vol, file_id, size, block_size, sums, /*sync=*/durable);
  if (!st.ok()) {
    struct stat got;
    const uint64_t on_disk = stat(path.c_str(), &got) == 0 ? static_cast<uint64_t>(got.st_size) : 0;
    Drop(vol, file_id);  // gives back what is on disk; the rest of the reservation here
    Unreserve(size - std::min(size, on_disk));
    return st;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Whole> whole, OpenWhole(vol, file_id));
  whole->verified = ahead == std::nullopt;  // blocks copied ahead were checked, but earlier
  return std::shared_ptr<const Whole>(std::move(whole));
}

absl::Status VolumeStore::Precopy(uint32_t vol, uint64_t file_id, uint64_t block_size,
                                  uint64_t first, const std::vector<uint64_t>& sums,
                                  const BatchReader& read_blocks) {
  const std::pair<uint32_t, uint64_t> key{vol, file_id};
  std::shared_ptr<void> turn = CopyTurn(key);
  const std::string path = PathOf(vol, file_id);
  struct stat st;
  if (stat((path + ".sums").c_str(), &st) == 0) return absl::OkStatus();  // whole already
  Ahead ahead = TakeAhead(key, block_size).value_or(Ahead{block_size, {}, 0, absl::Now()});
  std::error_code ec;
  std::filesystem::create_directories(absl::StrCat(dir_, "/", vol), ec);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", path);
  absl::Cleanup closing = [fd] { close(fd); };
  std::vector<uint64_t> want;
  for (uint64_t i = first; i < first + sums.size(); ++i) {
    auto it = ahead.sums.find(i);
    if (it == ahead.sums.end() || it->second != sums[i - first]) want.push_back(i);
  }
  const uint64_t end = (first + sums.size()) * block_size;
  absl::Status result;
  if (end > ahead.end) {
    result = Reserve(end - ahead.end);
    if (result.ok()) ahead.end = end;
  }
  if (result.ok()) {
    for (uint64_t i : want) ahead.sums.erase(i);  // rewritten below, or of unknown bytes
    result = CopyIn(
        fd, path, file_id, want, block_size, end, [&](uint64_t i) { return sums[i - first]; },
        read_blocks);
    // What was written before a failure is known only as far as the reader got: keep none of
    // this call's blocks then (the commit's Fetch asks for them).
    if (result.ok()) {
      for (uint64_t i : want) ahead.sums[i] = sums[i - first];
    }
  }
  ahead.touched = absl::Now();
  absl::MutexLock lock(&fetch_mu_);
  ahead_[key] = std::move(ahead);
  return result;
}

void VolumeStore::Offer(uint32_t vol, uint64_t file_id, int fd, uint64_t block_size,
                        std::vector<uint64_t> sums, uint64_t size) {
  auto w = std::make_shared<Whole>();
  w->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (w->fd < 0) return;  // not offered: the commit's copy takes every block
  w->block_size = block_size;
  w->size = std::min<uint64_t>(size, sums.size() * block_size);
  w->sums = std::move(sums);
  absl::MutexLock lock(&serving_mu_);
  offered_[{vol, file_id}] = std::move(w);
}

void VolumeStore::Withdraw(uint32_t vol, uint64_t file_id) {
  std::shared_ptr<const Whole> gone;  // closed after the lock
  absl::MutexLock lock(&serving_mu_);
  if (auto it = offered_.find({vol, file_id}); it != offered_.end()) {
    gone = std::move(it->second);
    offered_.erase(it);
  }
}

absl::Status VolumeStore::Rekey(uint32_t vol, uint64_t from, uint64_t to) {
  ForgetServing(vol, from);
  Withdraw(vol, from);
  const std::string path = PathOf(vol, from);
  unlink((path + ".sums").c_str());
  if (rename(path.c_str(), PathOf(vol, to).c_str()) != 0) return Errno("cannot rename", path);
  return absl::OkStatus();
}

void VolumeStore::Drop(uint32_t vol, uint64_t file_id) {
  ForgetServing(vol, file_id);
  Withdraw(vol, file_id);
  uint64_t ahead_end = 0;  // a copy ahead holds room up to here, written or not
  {
    absl::MutexLock lock(&fetch_mu_);
    if (auto it = ahead_.find({vol, file_id}); it != ahead_.end()) {
      ahead_end = it->second.end;
      ahead_.erase(it);
    }
  }
  const std::string path = PathOf(vol, file_id);
  struct stat st;
  const uint64_t size = stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  unlink((path + ".sums").c_str());
  const bool gone = unlink(path.c_str()) == 0;
  if (gone || ahead_end > 0) {
    absl::MutexLock lock(&space_mu_);
    used_ -= std::min(used_, std::max(gone ? size : 0, ahead_end));
    evictable_.erase({vol, file_id});
    room_.SignalAll();
  }
}

void VolumeStore::ForgetServing(uint32_t vol, uint64_t file_id) {
  absl::MutexLock lock(&serving_mu_);
  serving_.erase({vol, file_id});
}

std::optional<uint64_t> VolumeStore::CopyProgress(uint32_t vol, uint64_t file_id) {
  absl::MutexLock lock(&serving_mu_);
  auto it = copying_.find({vol, file_id});
  if (it == copying_.end()) return std::nullopt;
  return it->second.in;
}

std::optional<VolumeStore::Block> VolumeStore::GetBlock(const BlockAddr& addr) {
  const std::pair<uint32_t, uint64_t> key{addr.dataset_id, addr.file_id};
  std::shared_ptr<const Whole> w;
  {
    absl::MutexLock lock(&serving_mu_);
    if (auto it = serving_.find(key); it != serving_.end()) w = it->second;
    if (auto it = offered_.find(key);
        w == nullptr && it != offered_.end() && addr.index < it->second->sums.size()) {
      w = it->second;
    }
    if (auto it = copying_.find(key); w == nullptr && it != copying_.end()) {
      if (it->second.whole == nullptr || addr.index >= it->second.have.size() ||
          !it->second.have[addr.index]) {
        return std::nullopt;  // not in yet: the peer asks again
      }
      w = it->second.whole;
    }
  }
  if (w == nullptr) {
    auto opened = Open(addr.dataset_id, addr.file_id);
    if (!opened.ok()) return std::nullopt;
    w = std::move(*opened);
    absl::MutexLock lock(&serving_mu_);
    if (serving_.size() >= kServing) serving_.erase(serving_.begin());
    serving_[key] = w;
  }
  if (addr.index >= w->sums.size()) return std::nullopt;
  Block b;
  b.offset = addr.index * w->block_size;
  b.length = static_cast<uint32_t>(std::min(w->block_size, w->size - b.offset));
  b.checksum = w->sums[addr.index];
  b.whole = std::move(w);
  return b;
}

}  // namespace ember::cachefs
