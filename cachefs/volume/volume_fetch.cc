// VolumeFs's copies of a file's contents from the nodes holding them (volume_fs.h).
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cachefs/volume/volume_fs.h"
#include "common/file_io.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {
constexpr uint32_t kChecksumBatch = 10'000;
}  // namespace

absl::Status VolumeErrno(const absl::Status& st) {
  if (st.ok() || CarriedErrno(st) != 0) return st;
  if (absl::IsNotFound(st)) return ErrnoStatus(ENOENT, std::string(st.message()));
  return ErrnoStatus(EIO, std::string(st.message()));
}

absl::StatusOr<std::string> VolumeFs::PeerAddress(const std::string& node_id) {
  for (int pass = 0; pass < 2; ++pass) {
    {
      absl::MutexLock lock(&mu_);
      if (auto it = peers_.find(node_id); it != peers_.end()) return it->second;
    }
    if (pass == 1) break;
    ASSIGN_OR_RETURN(std::vector<rpc::Node> nodes, meta_->ListNodes());
    absl::MutexLock lock(&mu_);
    for (const auto& n : nodes) peers_[n.id()] = n.address();
  }
  return absl::NotFoundError(absl::StrCat("node ", node_id, " is not registered"));
}

absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> VolumeFs::Local(uint32_t vol,
                                                                          const rpc::VolumeInode& n,
                                                                          uint64_t block_size) {
  if (auto have = store_->Open(vol, n.file_id()); have.ok()) return have;
  if (block_size == 0) return ErrnoStatus(EIO, "no block size known for the volume");
  const uint64_t blocks = (n.size() + block_size - 1) / block_size;
  std::vector<uint64_t> sums;
  for (uint64_t first = 0; first < blocks; first += kChecksumBatch) {
    rpc::GetChecksumsRequest req;
    for (uint64_t i = first; i < std::min<uint64_t>(blocks, first + kChecksumBatch); ++i) {
      *req.add_blocks() = meta::ToProto(BlockAddr{vol, meta::kVolumeDataVersion, n.file_id(), i});
    }
    absl::StatusOr<rpc::GetChecksumsResponse> got = meta_->GetChecksums(req);
    if (!got.ok()) return VolumeErrno(got.status());
    for (int i = 0; i < got->checksums_size(); ++i) {
      if (!got->present(i)) {
        return ErrnoStatus(EIO, absl::StrCat("meta has no checksum of block ", first + i,
                                             " of contents ", n.file_id()));
      }
      sums.push_back(got->checksums(i));
    }
  }
  std::vector<std::string> peers;
  for (const auto& h : n.holders()) {
    if (h == node_id_) continue;  // our copy is gone (dropped as corrupt): others only
    if (auto addr = PeerAddress(h); addr.ok()) peers.push_back(*addr);
  }
  absl::Status st = ErrnoStatus(
      EIO, absl::StrCat("'", n.name(), "': no other node holding its contents is known"));
  if (!peers.empty()) {
    auto whole = store_->Fetch(vol, n.file_id(), n.size(), block_size, sums,
                               FromPeers(vol, n.file_id(), peers));
    if (whole.ok()) return whole;
    spdlog::warn("volume: contents of '{}' could not be copied from {}: {}", n.name(),
                 peers.front(), std::string(whole.status().message()));
    st = ErrnoStatus(EIO, std::string(whole.status().message()));
  }
  // No holder could give them: the origin's copy, if they were uploaded.
  std::string origin;
  for (const auto& v : Volumes()) {
    if (v.id() == vol) origin = v.origin();
  }
  if (n.state() != rpc::VolumeInode::PERSISTED || n.persisted_path().empty() || origin.empty()) {
    return st;
  }
  const std::string path = absl::StrCat(origin, "/", n.persisted_path());
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return ErrnoStatus(EIO, absl::StrCat(st.message(), "; and the origin's copy '", path,
                                         "' cannot be opened: ", strerror(errno)));
  }
  auto read_origin = [fd, block_size](std::vector<VolumeStore::Piece>& pieces) -> absl::Status {
    for (const auto& p : pieces) {
      if (!PreadFull(fd, p.index * block_size, p.len, p.buf)) {
        return absl::UnavailableError(absl::StrCat("cannot read the origin's copy: ",
                                                   errno == 0 ? "short file" : strerror(errno)));
      }
    }
    return absl::OkStatus();
  };
  auto whole = store_->Fetch(vol, n.file_id(), n.size(), block_size, sums, read_origin);
  close(fd);
  if (!whole.ok()) {
    spdlog::warn("volume: contents of '{}' could not be read from the origin '{}': {}", n.name(),
                 path, std::string(whole.status().message()));
    return ErrnoStatus(EIO, std::string(whole.status().message()));
  }
  return whole;
}

}  // namespace ember::cachefs
