// cachefs/volume/: writable volumes on a node (meta/volumes.h holds their namespace). Front door:
// volume_fs.h (the FileSystem part the mount routes volume inodes to). This file: the node's
// copies of volume file contents. Must not touch: datasets' cache (cache/), the fill pipeline
// (fetch/), FUSE (fuse/).
//
// VolumeStore keeps one file per contents id (a commit's file_id, meta/volumes.h):
//   DIR/<volume id>/<file id>        the bytes
//   DIR/<volume id>/<file id>.sums   header (magic, block size, size) + XXH3-64 of each block
// A contents id names bytes that never change once they are whole: `.sums` is written only after
// the bytes are, by Seal (a writer's commit: bytes, `.sums` and directory synced) or by Fetch (a
// copy from a peer, every block checked against meta's checksums; not synced: reads check every
// block again, so a copy torn by a power loss is found and copied anew; a replica, Fetch with
// `durable`, is synced like a writer's). A file without
// `.sums` is a writer's staging file, or a copy that never finished (never served).
//
// Thread-safe: files are the state; concurrent Fetches of one contents id are serialized.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/ids.h"

namespace ember::cachefs {

class VolumeStore {
 public:
  // Removes what a process that ended before finishing left in `dir`: staging files and copies
  // without their `.sums` (no write survives a restart of the agent), `.sums.tmp` files.
  explicit VolumeStore(std::string dir);

  // Whole contents on this disk, open for reading. Blocks are checked against `sums` before
  // they are served (CheckBlock): bytes on disk are not trusted.
  struct Whole {
    int fd = -1;
    uint64_t size = 0;
    uint64_t block_size = 0;
    std::vector<uint64_t> sums;
    bool verified = false;  // every block was just checked (a copy Fetch made): no need again
    ~Whole();
  };
  // Returns: the contents; NotFound when they are not whole here; DataLoss for a bad `.sums`.
  absl::StatusOr<std::shared_ptr<const Whole>> Open(uint32_t vol, uint64_t file_id);
  // Checks block `index` of `w` (reads it). Returns: Ok; DataLoss (the copy is dropped).
  absl::Status CheckBlock(const Whole& w, uint32_t vol, uint64_t file_id, uint64_t index);

  // A writer's staging file for `file_id`, created empty. Returns: the fd (the caller closes).
  absl::StatusOr<int> CreateStaging(uint32_t vol, uint64_t file_id);
  // A staging file for `to` holding a copy of whole contents `from` (a write after a commit,
  // or an open for writing without O_TRUNC). Returns: the fd.
  absl::StatusOr<int> CopyToStaging(uint32_t vol, uint64_t from, uint64_t to);
  // Makes staging `file_id` whole: syncs its bytes, checksums each block (or takes `known`, the
  // checksums of the file's blocks as they were written, when they cover its size), writes
  // `.sums`. Returns: the checksums (one per block; none for an empty file); IO errors.
  absl::StatusOr<std::vector<uint64_t>> Seal(uint32_t vol, uint64_t file_id, int fd,
                                             uint64_t block_size,
                                             const std::vector<uint64_t>* known = nullptr);

  // Copies whole contents from peers: `read_blocks(pieces)` fills each piece's block `index`
  // (len bytes into buf), a batch at a time; each block must match `sums`. Copies of one id are
  // serialized (the second finds the first's), of different ids run at once. `durable`: a
  // replica a writer's commit counts on: bytes, `.sums` and directory synced before it returns
  // (also when the contents were already here). `written(i)` (may be empty): block i is checked
  // and in the copy's file (PathOf), for readers that read it before the copy is whole.
  // Returns: the contents; the reader's error, or DataLoss for bytes that did not match.
  struct Piece {
    uint64_t index = 0;
    char* buf = nullptr;
    size_t len = 0;
    // Set by a reader that hashed the bytes as they arrived (the TCP transport does): their
    // BlockChecksum, so that the check need not read them again.
    std::optional<uint64_t> received_sum;
  };
  // The BlockChecksum of a piece as read: received_sum, else the bytes hashed now.
  static uint64_t SumOf(const Piece& p);
  using BatchReader = std::function<absl::Status(std::vector<Piece>& pieces)>;
  absl::StatusOr<std::shared_ptr<const Whole>> Fetch(
      uint32_t vol, uint64_t file_id, uint64_t size, uint64_t block_size,
      const std::vector<uint64_t>& sums, const BatchReader& read_blocks, bool durable = false,
      const std::function<void(uint64_t)>& written = nullptr);

  // ---- copies made ahead of a commit (volume_replicas.cc's writers send them) ----
  // Offers blocks 0 .. sums.size() - 1 of a writer's staging file (`fd`, still being written,
  // or being sealed: then `size` is its size and `sums` cover it) to peers: GetBlock serves
  // them, with `sums` (as written), until Withdraw, Drop or Rekey of the id, or the next Offer
  // (which replaces it).
  void Offer(uint32_t vol, uint64_t file_id, int fd, uint64_t block_size,
             std::vector<uint64_t> sums, uint64_t size = UINT64_MAX)
      ABSL_LOCKS_EXCLUDED(serving_mu_);
  void Withdraw(uint32_t vol, uint64_t file_id) ABSL_LOCKS_EXCLUDED(serving_mu_);
  // A replica's copy made while the writer still writes: blocks first .. first + sums.size() - 1
  // of contents `file_id`, read with `read_blocks`, checked against `sums` and written (not
  // synced) to what becomes the contents' file. A later Fetch of the id (the commit's copy)
  // asks only for blocks not copied ahead with the checksum the commit names. Copies ahead no
  // commit came for are dropped by DropUnreferenced, and at a restart. Returns: Ok; the
  // reader's error; DataLoss; ENOSPC.
  absl::Status Precopy(uint32_t vol, uint64_t file_id, uint64_t block_size, uint64_t first,
                       const std::vector<uint64_t>& sums, const BatchReader& read_blocks)
      ABSL_LOCKS_EXCLUDED(fetch_mu_);

  // Renames staging (or sealed, not committed) contents `from` to `to`, unsealed: a writer whose
  // commit failed writes on under a new id (copies of `from` made meanwhile are never named).
  // An fd open on it stays valid. Returns: Ok; EIO.
  absl::Status Rekey(uint32_t vol, uint64_t from, uint64_t to);
  // Removes a contents id's files (staging or whole).
  void Drop(uint32_t vol, uint64_t file_id);

  // For the block server: block `addr` (its dataset id is the volume's) if whole here, offered,
  // or already in a copy in progress (Fetch).
  struct Block {
    std::shared_ptr<const Whole> whole;
    uint64_t offset = 0;
    uint32_t length = 0;
    uint64_t checksum = 0;
  };
  std::optional<Block> GetBlock(const BlockAddr& addr);
  // Whether contents `file_id` are being copied here now (a Fetch, from its start: also while
  // it waits for room) and how many of their blocks are in; nullopt when no copy runs.
  std::optional<uint64_t> CopyProgress(uint32_t vol, uint64_t file_id)
      ABSL_LOCKS_EXCLUDED(serving_mu_);

  std::string PathOf(uint32_t vol, uint64_t file_id) const;

  // ---- space (volume_space.cc) ----
  // The bytes of every file here (staging, contents, copies) are held under `limit` (0: no
  // limit but the disk's). Contents in the origin (SetEvictable) are dropped, oldest first, to
  // make room; the rest (not yet uploaded) never are.
  // `wait`: how long a Reserve waits for room before it fails.
  void SetLimit(uint64_t limit, absl::Duration wait) ABSL_LOCKS_EXCLUDED(space_mu_);
  uint64_t Used() ABSL_LOCKS_EXCLUDED(space_mu_);
  // Takes `bytes` more (a write past a staging file's end, a copy). Without room even after
  // dropping evictable contents, waits (SetLimit's `wait`; uploads finishing make contents
  // evictable), then fails. Returns: Ok; ENOSPC naming the limit and what holds it (logged and
  // counted: ember_volume_enospc_total).
  absl::Status Reserve(uint64_t bytes) ABSL_LOCKS_EXCLUDED(space_mu_);
  // Whether a Reserve is waiting for room (uploads are what make it).
  bool Starved() ABSL_LOCKS_EXCLUDED(space_mu_);
  // Gives back bytes reserved and never written.
  void Unreserve(uint64_t bytes) ABSL_LOCKS_EXCLUDED(space_mu_);
  // Contents the origin holds (may be dropped for room): replaces the set given before.
  void SetEvictable(std::set<std::pair<uint32_t, uint64_t>> ids) ABSL_LOCKS_EXCLUDED(space_mu_);
  // Drops whole contents no file refers to any more: not in `live` (every contents id meta's
  // files name, committed or being written, as read after `sealed_before`) and sealed before
  // `sealed_before` (contents sealed since, e.g. a replica made for a commit in progress, are
  // not in `live` yet). Returns: how many were dropped.
  // Copies made ahead (Precopy) untouched since `sealed_before` are dropped unless their id
  // is in `writing` (contents ids being written now).
  int DropUnreferenced(const std::set<std::pair<uint32_t, uint64_t>>& live,
                       absl::Time sealed_before,
                       const std::set<std::pair<uint32_t, uint64_t>>& writing = {})
      ABSL_LOCKS_EXCLUDED(space_mu_);

 private:
  // Drops the oldest evictable contents until `bytes` more fit. REQUIRES space_mu_.
  bool MakeRoomLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(space_mu_);
  absl::Mutex space_mu_;  // taken before serving_mu_ when both are
  absl::CondVar room_;    // evictable contents or room appeared
  uint64_t limit_ ABSL_GUARDED_BY(space_mu_) = 0;
  uint64_t used_ ABSL_GUARDED_BY(space_mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(space_mu_) = 0;  // Reserves waiting for room
  absl::Duration wait_ ABSL_GUARDED_BY(space_mu_) = absl::Seconds(10);
  std::set<std::pair<uint32_t, uint64_t>> evictable_ ABSL_GUARDED_BY(space_mu_);

  absl::StatusOr<std::shared_ptr<Whole>> OpenWhole(uint32_t vol, uint64_t file_id);
  // `sync`: the file and the directory entry synced (a writer's commit), or not (a copy).
  absl::Status WriteSums(uint32_t vol, uint64_t file_id, uint64_t size, uint64_t block_size,
                         const std::vector<uint64_t>& sums, bool sync);

  const std::string dir_;
  // Contents lately served to peers, open (GetBlock is asked once per block: one open and
  // parse of `.sums` per file, not per block). Forgotten by Drop and a failed CheckBlock.
  static constexpr size_t kServing = 64;
  absl::Mutex serving_mu_;
  std::map<std::pair<uint32_t, uint64_t>, std::shared_ptr<const Whole>> serving_
      ABSL_GUARDED_BY(serving_mu_);
  void ForgetServing(uint32_t vol, uint64_t file_id) ABSL_LOCKS_EXCLUDED(serving_mu_);

  std::map<std::pair<uint32_t, uint64_t>, std::shared_ptr<const Whole>> offered_
      ABSL_GUARDED_BY(serving_mu_);  // staging files offered (sums: of the blocks offered)
  struct Partial {  // a Fetch in progress: the blocks checked and written so far are served
    std::shared_ptr<const Whole> whole;  // null until its file is made (after room is found)
    std::vector<bool> have;
    uint64_t in = 0;  // blocks set in `have`
  };
  std::map<std::pair<uint32_t, uint64_t>, Partial> copying_ ABSL_GUARDED_BY(serving_mu_);

  absl::Mutex fetch_mu_;
  std::set<std::pair<uint32_t, uint64_t>> fetching_ ABSL_GUARDED_BY(fetch_mu_);  // being copied
  absl::CondVar fetched_;                                                        // a copy ended
  // Waits until no copy of `key` runs, then marks one running until the returned object dies.
  std::shared_ptr<void> CopyTurn(std::pair<uint32_t, uint64_t> key) ABSL_LOCKS_EXCLUDED(fetch_mu_);
  struct Ahead {  // a copy made ahead of its commit (Precopy)
    uint64_t block_size = 0;
    std::map<uint64_t, uint64_t> sums;  // block -> checksum of what was written there
    uint64_t end = 0;                   // the file's size (reserved in space)
    absl::Time touched;
  };
  std::map<std::pair<uint32_t, uint64_t>, Ahead> ahead_ ABSL_GUARDED_BY(fetch_mu_);
  // Takes `key`'s copy ahead out of ahead_ (the caller holds its CopyTurn); one of another
  // block size is dropped instead. Returns: it, or nullopt.
  std::optional<Ahead> TakeAhead(std::pair<uint32_t, uint64_t> key, uint64_t block_size)
      ABSL_LOCKS_EXCLUDED(fetch_mu_);
};

}  // namespace ember::cachefs
