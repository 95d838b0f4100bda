// VolumeStream: reads of volume contents this node lacks, served from the nodes that hold them
// without a copy on this disk (cachefs/volume/, front door volume_fs.h; VolumeFs::Open makes one
// per open when a holder is known). A restore reads each checkpoint file once: storing a copy
// too would put a disk write and a read back on every byte's way to the reader, and on one
// node's disk the holder's reads and this copy's writes share the bandwidth.
//
// Each block is fetched with `read` (FetchMany of the holders, kBatch pipelined requests, two
// in flight), checked against meta's checksum and kept in memory; a READ's reply points into the
// block (ReadResult::holds), so the bytes are copied once on this node after the socket: into
// the reader's buffer. Blocks a READ covers are asked for first; a reader going straight on has
// up to kAhead bytes read ahead of it; blocks behind it are dropped. A block that fails from a
// source (unreachable, or bytes that do not match) is asked of the next (another holder, the
// origin's copy when uploaded); failing them all, the READ fails with EIO naming each, and the
// next READ asks again.
//
// Block buffers of dropped blocks, and of a closed stream, go to one pool every stream takes
// from (kBufferPool, kBufferIdle).
//
// Thread-safe. The destructor waits for the fetches in flight (no READ may be waiting then).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachefs/filesystem.h"
#include "cachefs/volume/volume_store.h"

namespace ember::cachefs {

class VolumeStream {
 public:
  // Where blocks come from, in the order they are asked (each holder, then the origin's copy).
  struct Source {
    std::string name;  // for messages: "node 127.0.0.2:7000", "the origin"
    VolumeStore::BatchReader read;
  };
  // `name`: for messages. `sums`: one per block of `size` bytes.
  VolumeStream(std::string name, uint64_t file_id, uint64_t size, uint64_t block_size,
               std::vector<uint64_t> sums, std::vector<Source> sources);
  ~VolumeStream();
  VolumeStream(const VolumeStream&) = delete;
  VolumeStream& operator=(const VolumeStream&) = delete;

  // Bytes [offset, offset + size) (clipped to the contents' size) as segments of checked
  // blocks held in `out`. Returns: Ok; EIO naming the block and why it could not be had.
  absl::Status Read(uint64_t offset, size_t size, ReadResult* out) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees block buffers of closed streams kept longer than kBufferIdle (VolumeUploader's loop
  // calls it every pass; taking or giving back a buffer does too).
  static void ReleaseIdleBuffers();

  // Read ahead of a reader going straight on, and asked of the holders in one request. Small
  // enough that a block is copied out to the reader while it is still in the CPU's caches: with
  // 64 and 32 MiB (512 MiB in flight over 4 restoring readers) a restore on 4 KiB pages (THP
  // off) made 1,170-1,393 MiB/s, with 16 and 8 MiB 1,736-1,766 and 40% less CPU; with huge
  // pages both the same (docs/benchmarks.md, Checkpoints, 2026-12-06 evening).
  static constexpr uint64_t kAhead = 16ull << 20;
  static constexpr uint64_t kBatch = 8ull << 20;
  static constexpr size_t kWorkers = 2;  // requests in flight
  // A closed stream's buffers wait for the next stream's blocks (a restore opens file after
  // file; new memory costs a fault per page, and on this VM each first touch an exit): up to
  // kBufferPool bytes of them, each for at most kBufferIdle.
  static constexpr uint64_t kBufferPool = 512ull << 20;
  static constexpr absl::Duration kBufferIdle = absl::Seconds(30);

 private:
  struct Block {
    std::shared_ptr<char[]> buf;
    size_t len = 0;
    bool ready = false;  // fetched and checked, or failed (status)
    absl::Status status;
  };
  // Asks for block `b` unless it is wanted or held already.
  void WantLocked(uint64_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker: fetches batches of wanted blocks (those a READ waits for first) until none are
  // left or the stream closes.
  void Work() ABSL_LOCKS_EXCLUDED(mu_);
  // Fetches `pieces` from the sources in turn, each piece until one gives the bytes its
  // checksum names. Returns: per piece, its status.
  std::vector<absl::Status> FetchChecked(std::vector<VolumeStore::Piece>& pieces);
  std::shared_ptr<char[]> BufferLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const uint64_t file_id_;
  const uint64_t size_;
  const uint64_t block_size_;
  const std::vector<uint64_t> sums_;
  const std::vector<Source> sources_;

  absl::Mutex mu_;
  std::map<uint64_t, Block> blocks_ ABSL_GUARDED_BY(mu_);  // wanted, in flight or held
  std::set<uint64_t> urgent_ ABSL_GUARDED_BY(mu_);         // wanted by a waiting READ
  std::set<uint64_t> ahead_ ABSL_GUARDED_BY(mu_);          // wanted ahead of a reader
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;       // the block after the last READ's (straight on?)
  uint64_t ahead_end_ ABSL_GUARDED_BY(mu_) = 0;  // read ahead asked up to here (exclusive)
  std::multiset<std::pair<uint64_t, uint64_t>> reading_ ABSL_GUARDED_BY(mu_);  // READs waiting
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);  // started as needed, kWorkers at most
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ember::cachefs
