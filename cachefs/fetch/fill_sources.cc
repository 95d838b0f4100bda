#include "cachefs/fetch/fill_sources.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace ember::cachefs {

absl::Status OriginChanged() {
  return absl::FailedPreconditionError(
      "origin bytes differ from those first read for this dataset version (origin changed)");
}

FillSources::FillSources(origin::Origin* origin, PeerFetcher* peers, ChecksumBook* checksums)
    : origin_(origin), peers_(peers), checksums_(checksums) {}

std::vector<FillSources::Fetched> FillSources::FetchFromPeers(
    const std::vector<std::pair<const FileRef*, uint64_t>>& blocks) {
  std::vector<Fetched> out(blocks.size());
  std::vector<PeerFetcher::Want> wants(blocks.size());
  for (size_t i = 0; i < blocks.size(); i++) {
    const auto& [file, index] = blocks[i];
    const size_t len = static_cast<size_t>(file->BlockLength(index));
    out[i].data = std::make_shared<BlockBuffer>(len);
    wants[i] = {file->Block(index), static_cast<uint32_t>(len), out[i].data->data()};
  }
  if (peers_ != nullptr) peers_->FetchMany(wants);
  for (size_t i = 0; i < blocks.size(); i++) {
    if (wants[i].result.ok()) {
      bytes_peers_ += wants[i].length;
      out[i].from_peer = true;
      out[i].checksum = *wants[i].result;
    } else {
      out[i].status = absl::NotFoundError("no peer holds the block yet");
      out[i].data.reset();
    }
  }
  return out;
}

FillSources::Fetched FillSources::Fetch(const FileRef& file, uint64_t index, FillRoute route,
                                        const std::function<void(uint64_t)>* before_origin) {
  const bool allow_origin = AllowsOrigin(route);
  const BlockAddr addr = file.Block(index);
  const uint64_t offset = index * file.block_size;
  const size_t len = static_cast<size_t>(file.BlockLength(index));
  Fetched f;
  f.data = std::make_shared<BlockBuffer>(len);
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
  // A peer first: the origin is read once for the whole cluster.
  absl::StatusOr<uint64_t> from_peer = absl::NotFoundError("no peers");
  if (peers_ != nullptr && !(allow_origin && peers_->LikelyUnheld(addr))) {
    from_peer = peers_->Fetch(addr, static_cast<uint32_t>(len), f.data->data(),
                              /*locate=*/route != FillRoute::kKnownPeersThenOrigin);
  }
  absl::Status& st = f.status;
  if (from_peer.ok()) {
    peer_fill->Observe(fill_seconds());
    bytes_peers_ += len;
    f.from_peer = true;
    f.checksum = *from_peer;
  } else if (!allow_origin) {
    st = absl::NotFoundError("no peer holds the block yet");
  } else {
    if (before_origin != nullptr && *before_origin) (*before_origin)(len);  // rate limit
    fill_start =
        std::chrono::steady_clock::now();  // the origin's time, not the peers' or the limiter's
    st = origin_->Read(file.origin, offset, len, f.data->data());
    if (st.ok()) {
      origin_fill->Observe(fill_seconds());
      OriginBytes(file, index, len, &f);
    }
  }
  if (!st.ok() && allow_origin) LogFailed(file, index, st);
  if (!st.ok()) f.data.reset();
  return f;
}

void FillSources::OriginBytes(const FileRef& file, uint64_t index, size_t len, Fetched* f) {
  const BlockAddr addr = file.Block(index);
  origin_reads_++;
  bytes_origin_ += len;
  f->checksum = BlockChecksum(f->data->data(), len);
  // Meta's checksum, when a Locate told it, is checked before anyone gets the bytes; else ours
  // is claimed after the reply (a writer thread, batched with other fills).
  std::optional<uint64_t> known = checksums_->Known(addr);
  if (checksums_->Conflicting(addr) || (known && *known != f->checksum)) {
    f->status = OriginChanged();
  } else {
    f->claim = !known;
  }
}

void FillSources::LogFailed(const FileRef& file, uint64_t index, const absl::Status& st) {
  spdlog::error("read: {} block {} of {}/{}: {}{}", file.dataset_name, index, file.origin.root,
                file.origin.path, std::string(st.message()),
                absl::IsFailedPrecondition(st)
                    ? absl::StrCat("; run `ember dataset refresh ", file.dataset_name, "`")
                    : "");
}

std::vector<FillSources::Fetched> FillSources::FetchFromOrigin(
    const std::vector<std::pair<const FileRef*, uint64_t>>& blocks) {
  static metrics::Histogram* const origin_fill = metrics::Global().GetHistogram(
      "ember_fill_seconds", "Block fills that succeeded, by source (peer fetch or origin read).",
      {{"source", "origin"}});
  std::vector<Fetched> out(blocks.size());
  std::vector<origin::Origin::ReadRequest> reqs(blocks.size());
  for (size_t i = 0; i < blocks.size(); i++) {
    const auto& [file, index] = blocks[i];
    const size_t len = static_cast<size_t>(file->BlockLength(index));
    // Room for whole pages: the origin may read a file's end around the page cache.
    out[i].data = std::make_shared<BlockBuffer>(len, origin::Origin::DirectReadRoom(len));
    reqs[i] = {&file->origin, index * file->block_size, len, out[i].data->data(),
               out[i].data->room()};
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<absl::Status> got = origin_->ReadMany(reqs);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < blocks.size(); i++) {
    const auto& [file, index] = blocks[i];
    Fetched& f = out[i];
    f.status = std::move(got[i]);
    if (f.status.ok()) {
      origin_fill->Observe(seconds);  // each waited for the batch
      OriginBytes(*file, index, reqs[i].len, &f);
    }
    if (!f.status.ok()) {
      LogFailed(*file, index, f.status);
      f.data.reset();
    }
  }
  return out;
}

}  // namespace ember::cachefs
