// FillSources: where a missing block's bytes come from, and the checks they pass before anyone
// gets them. A peer first (PeerFetcher: its bytes must match meta's checksum), so the origin is
// read once for the whole cluster; else the origin, which refuses a file whose size, mtime or
// ETag changed. Origin bytes that differ from meta's checksum (ChecksumBook::Known) are refused,
// and so is every fill of a block known to conflict: the origin changed in place (EIO, with
// a hint to refresh the dataset). Origin bytes whose checksum meta did not tell are to be
// claimed (WriteBehind does, after the readers have them).
//
// Thread-safe: no state but counters.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "cachefs/cache/block_buffer.h"
#include "cachefs/fetch/checksum_book.h"
#include "cachefs/fetch/file_ref.h"
#include "cachefs/fetch/peer_fetcher.h"
#include "origin/origin.h"

namespace ember::cachefs {

// Where a fill may look for a block's bytes.
enum class FillRoute {
  kPeersThenOrigin,       // a peer meta names (asked now unless known), else the origin
  kPeersOnly,             // a peer, or NotFound (a prefetch waiting for the block's owner)
  kKnownPeersThenOrigin,  // a peer already located (no call to meta now), else the origin
};
inline bool AllowsOrigin(FillRoute r) { return r != FillRoute::kPeersOnly; }

// The error of a fill whose origin bytes differ from those first read for its dataset version.
absl::Status OriginChanged();

class FillSources {
 public:
  // `peers` may be null: misses then go straight to the origin. All must outlive this.
  FillSources(origin::Origin* origin, PeerFetcher* peers, ChecksumBook* checksums);

  struct Fetched {
    absl::Status status;
    std::shared_ptr<BlockBuffer> data;  // the whole block, when status is ok
    bool from_peer = false;
    uint64_t checksum = 0;  // of data
    bool claim = false;     // read from the origin with no checksum known: claim it in meta
  };
  // Fetches block `index` of `file` by `route`.
  // `before_origin` (may be null) runs before an origin read (a rate limit).
  // Returns (in status): Ok; NotFound when peer-only and no peer has it yet; the origin's error
  // (NotFound, FailedPrecondition, Unavailable: origin.h); FailedPrecondition (OriginChanged)
  // when the bytes differ from meta's checksum. Errors of fills that may read the origin are
  // logged with the file and, for a changed origin, the refresh hint.
  Fetched Fetch(const FileRef& file, uint64_t index, FillRoute route,
                const std::function<void(uint64_t bytes)>* before_origin);

  // Peer-only fetches of many blocks at once (PeerFetcher::FetchMany: one request per holder).
  // Returns: per block of `blocks` ((file, index)), as Fetch with FillRoute::kPeersOnly.
  std::vector<Fetched> FetchFromPeers(
      const std::vector<std::pair<const FileRef*, uint64_t>>& blocks);

  // Origin reads of many blocks at once (Origin::ReadMany: a cold folder of small files), each
  // checked as Fetch checks an origin read. Returns: per block of `blocks`, as Fetch with the
  // origin as its only source.
  std::vector<Fetched> FetchFromOrigin(
      const std::vector<std::pair<const FileRef*, uint64_t>>& blocks);
  // Whether FetchFromOrigin of the file's origin reads many about as fast as one.
  bool OriginReadsManyAtOnce(const FileRef& file) {
    return origin_->ReadsManyAtOnce(file.origin.root);
  }

  uint64_t bytes_from_peers() const { return bytes_peers_; }
  uint64_t bytes_from_origin() const { return bytes_origin_; }
  uint64_t origin_block_reads() const { return origin_reads_; }

 private:
  // An origin read of `len` bytes into f->data succeeded: counts it, sums it and checks it
  // against meta's checksum (FailedPrecondition in f->status when the origin changed).
  void OriginBytes(const FileRef& file, uint64_t index, size_t len, Fetched* f);
  // Logs a failed fill that may read the origin (with the refresh hint when it changed).
  static void LogFailed(const FileRef& file, uint64_t index, const absl::Status& st);

  origin::Origin* const origin_;
  PeerFetcher* const peers_;
  ChecksumBook* const checksums_;
  std::atomic<uint64_t> bytes_peers_{0}, bytes_origin_{0}, origin_reads_{0};
};

}  // namespace ember::cachefs
