// VolumeFs's replicas (volume_fs.h): before a commit, the writer asks `replicas - 1` other nodes
// to copy the sealed contents from it (a call over the block transport, VolumeReplicate); each
// pulls the blocks with pipelined block requests, checks every one against the checksums in the
// call, syncs its copy and only then answers. The commit names every node that answered.
// Ahead of that, while a file is written straight on (a checkpoint's save), the writer offers its
// whole blocks and, every 32 MiB, asks the same nodes to copy the new ones (VolumePrecopy, in
// the background, not synced): the disk and the network work while the writer writes, and the
// commit's copy takes only the blocks not copied ahead with the checksums it names. A copy ahead
// that fails costs nothing but time: the commit's copy takes those blocks.
//
// Which nodes: live ones, those in another `rack` (then another `switch`) than the writer first,
// so that the copies do not share a failure domain when the labels say there are several; among
// equals, a spread by contents id so that many writers do not all pick the same node.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <future>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cachefs/volume/volume_fs.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {

std::string Label(const rpc::Node& n, const std::string& key) {
  auto it = n.labels().find(key);
  return it == n.labels().end() ? "" : it->second;
}

// How long a peer may take to copy `size` bytes: generous (the disk is shared with the writer),
// but bounded so that a stuck peer fails the commit instead of hanging the close.
constexpr uint64_t kAheadMost = 4096;  // blocks in one VolumePrecopy call

std::chrono::milliseconds CopyTimeout(uint64_t size) {
  return std::chrono::milliseconds(30'000 + size / (20 << 10));  // 30 s + 20 MB/s
}

}  // namespace

VolumeStore::BatchReader VolumeFs::FromPeers(uint32_t vol, uint64_t file_id,
                                             std::vector<std::string> peers) {
  // A batch from the first peer that has it all; pieces it lacks from the next one.
  return [this, vol, file_id, peers = std::move(peers)](std::vector<VolumeStore::Piece>& pieces) {
    std::vector<transport::FetchPiece> want = Wanted(vol, file_id, pieces);
    for (const auto& peer : peers) FetchMissing(peer, want);
    for (size_t i = 0; i < want.size(); ++i) {
      RETURN_IF_ERROR(want[i].status);
      pieces[i].received_sum = want[i].info.received_checksum;
    }
    return absl::OkStatus();
  };
}

std::vector<transport::FetchPiece> VolumeFs::Wanted(uint32_t vol, uint64_t file_id,
                                                    const std::vector<VolumeStore::Piece>& pieces) {
  std::vector<transport::FetchPiece> want(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    want[i].addr = BlockAddr{vol, meta::kVolumeDataVersion, file_id, pieces[i].index};
    want[i].length = static_cast<uint32_t>(pieces[i].len);
    want[i].buf = pieces[i].buf;
    want[i].status = absl::UnavailableError("not asked yet");
  }
  return want;
}

size_t VolumeFs::FetchMissing(const std::string& peer, std::vector<transport::FetchPiece>& want) {
  std::vector<transport::FetchPiece> missing;
  std::vector<size_t> at;  // missing[k] is want[at[k]]
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].status.ok()) continue;
    missing.push_back(want[i]);
    at.push_back(i);
  }
  if (missing.empty()) return 0;
  transport_->FetchMany(peer, missing);
  size_t got = 0;
  for (size_t k = 0; k < missing.size(); ++k) {
    want[at[k]].status = missing[k].status;
    want[at[k]].info = missing[k].info;
    got += missing[k].status.ok();
  }
  return got;
}

uint32_t VolumeFs::ReplicasOf(uint32_t vol_id) {
  for (const auto& v : Volumes()) {
    if (v.id() == vol_id) return std::max<uint32_t>(1, v.replicas());
  }
  return 1;
}

absl::StatusOr<std::vector<rpc::Node>> VolumeFs::ReplicaCandidates(uint64_t file_id) {
  absl::StatusOr<std::vector<rpc::Node>> nodes = meta_->ListNodes();
  if (!nodes.ok()) return VolumeErrno(nodes.status());
  rpc::Node self;
  std::vector<rpc::Node> candidates;
  for (auto& n : *nodes) {
    if (n.id() == node_id_) {
      self = n;
    } else if (n.state() == rpc::Node::ALIVE && !n.address().empty()) {
      candidates.push_back(std::move(n));
    }
  }
  const std::string rack = Label(self, "rack"), sw = Label(self, "switch");
  auto rank = [&](const rpc::Node& n) {
    const bool same_rack = !rack.empty() && Label(n, "rack") == rack;
    const bool same_switch = !sw.empty() && Label(n, "switch") == sw;
    return std::make_tuple(same_rack, same_switch, absl::HashOf(file_id, n.id()));
  };
  std::sort(candidates.begin(), candidates.end(),
            [&](const rpc::Node& a, const rpc::Node& b) { return rank(a) < rank(b); });
  return candidates;
}

void VolumeFs::SendAhead(const Ref& at, uint64_t file_id, int fd, uint64_t block_size,
                         const std::vector<uint64_t>& sums, Ahead* a) {
  constexpr uint64_t kEvery = 32u << 20;
  if (a->off || sums.size() < a->offered + std::max<uint64_t>(1, kEvery / block_size)) return;
  if (a->sending.valid()) {
    if (a->sending.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    a->sending.get();
  }
  if (a->peers.empty()) {
    const uint32_t want = ReplicasOf(at.vol_id);
    absl::StatusOr<std::vector<rpc::Node>> chosen =
        want > 1 ? ReplicaCandidates(file_id) : absl::NotFoundError("one copy");
    absl::StatusOr<std::string> me = PeerAddress(node_id_);
    if (!chosen.ok() || !me.ok()) {
      a->off = true;  // the commit's copy takes every block
      return;
    }
    for (size_t i = 0; i < chosen->size() && a->peers.size() + 1 < want; ++i) {
      a->peers.push_back((*chosen)[i].address());
    }
    a->source = *me;
    if (a->peers.empty()) {
      a->off = true;
      return;
    }
  }
  store_->Offer(at.vol_id, file_id, fd, block_size, sums);
  const uint64_t upto = std::min<uint64_t>(sums.size(), a->offered + kAheadMost);
  rpc::NodeCall call;
  auto* p = call.mutable_precopy();
  p->set_volume(at.vol_id);
  p->set_file_id(file_id);
  p->set_block_size(block_size);
  p->set_first(a->offered);
  for (uint64_t i = a->offered; i < upto; ++i) p->add_checksums(sums[i]);
  p->set_source(a->source);
  const uint64_t bytes = (upto - a->offered) * block_size;
  a->offered = upto;
  a->sending = std::async(std::launch::async, [this, peers = a->peers, volume = at.volume,
                                               request = call.SerializeAsString(), bytes] {
    for (const auto& peer : peers) {  // a copy ahead that fails is taken by the commit's copy
      absl::StatusOr<std::string> answer = transport_->Call(peer, request, CopyTimeout(bytes));
      rpc::NodeCallReply reply;
      if (answer.ok() && reply.ParseFromString(*answer) && reply.error().empty()) continue;
      spdlog::debug("volume {}: {} did not copy ahead: {}", volume, peer,
                    answer.ok() ? reply.error() : std::string(answer.status().message()));
    }
  });
}

absl::StatusOr<std::vector<std::string>> VolumeFs::Replicate(const Ref& at, uint64_t file_id,
                                                             uint64_t size, uint64_t block_size,
                                                             const std::vector<uint64_t>& sums) {
  std::vector<std::string> holders = {node_id_};
  const uint32_t want = ReplicasOf(at.vol_id);
  if (want <= 1 || size == 0) return holders;
  ASSIGN_OR_RETURN(std::string me, PeerAddress(node_id_));
  ASSIGN_OR_RETURN(std::vector<rpc::Node> candidates, ReplicaCandidates(file_id));

  rpc::NodeCall call;
  auto* r = call.mutable_replicate();
  r->set_volume(at.vol_id);
  r->set_file_id(file_id);
  r->set_size(size);
  r->set_block_size(block_size);
  for (uint64_t s : sums) r->add_checksums(s);
  r->set_source(me);
  const std::string request = call.SerializeAsString();
  std::vector<std::string> failures;
  size_t next = 0;
  // As many copies at once as are missing; a node that fails is replaced by the next in order.
  while (holders.size() < want && next < candidates.size()) {
    std::vector<std::pair<const rpc::Node*, std::future<absl::Status>>> asked;
    while (holders.size() + asked.size() < want && next < candidates.size()) {
      const rpc::Node* n = &candidates[next++];
      asked.emplace_back(n, std::async(std::launch::async, [this, n, &request, size] {
                           absl::StatusOr<std::string> answer =
                               transport_->Call(n->address(), request, CopyTimeout(size));
                           if (!answer.ok()) return answer.status();
                           rpc::NodeCallReply reply;
                           if (!reply.ParseFromString(*answer)) {
                             return absl::DataLossError("a malformed answer");
                           }
                           if (!reply.error().empty()) return absl::UnavailableError(reply.error());
                           return absl::OkStatus();
                         }));
    }
    for (auto& [n, done] : asked) {
      absl::Status st = done.get();
      if (st.ok()) {
        holders.push_back(n->id());
      } else {
        failures.push_back(absl::StrCat(n->id(), ": ", st.message()));
        spdlog::warn("volume {}: node {} did not take a copy of contents {}: {}", at.volume,
                     n->id(), file_id, std::string(st.message()));
      }
    }
  }
  if (holders.size() < want) {
    return ErrnoStatus(
        EIO, absl::StrCat("volume ", at.volume, " keeps ", want, " copies of a file, but only ",
                          holders.size(), " could be made (", candidates.size(),
                          " other live nodes", failures.empty() ? "" : "; ",
                          absl::StrJoin(failures, "; "), "); the file was not committed"));
  }
  return holders;
}

absl::StatusOr<std::string> VolumeFs::ServeCall(std::string_view request) {
  rpc::NodeCall call;
  if (!call.ParseFromArray(request.data(), static_cast<int>(request.size())) ||
      (!call.has_replicate() && !call.has_precopy() && !call.has_copy_state())) {
    return absl::InvalidArgumentError("not a call this node knows");
  }
  rpc::NodeCallReply reply;
  if (call.has_copy_state()) {  // a node following this one's copy of the origin's (FromCopier)
    const rpc::VolumeCopyState& c = call.copy_state();
    if (std::optional<uint64_t> in = store_->CopyProgress(c.volume(), c.file_id())) {
      reply.set_copying(true);
      reply.set_blocks_in(*in);
    } else {
      reply.set_whole(store_->Open(c.volume(), c.file_id()).ok());
    }
    return reply.SerializeAsString();
  }
  // A volume of this node's list, of this block size.
  auto known = [this](uint32_t vol, uint64_t block_size) {
    bool found = false;
    for (const auto& v : Volumes()) found |= v.id() == vol && v.block_size() == block_size;
    return found && block_size > 0 && block_size <= (64u << 20);
  };
  if (call.has_precopy()) {
    const rpc::VolumePrecopy& p = call.precopy();
    if (!known(p.volume(), p.block_size()) || p.checksums_size() > static_cast<int>(kAheadMost)) {
      reply.set_error(absl::StrCat("node ", node_id_, ": a copy ahead of an unknown volume, ",
                                   "another block size, or too many blocks at once"));
      return reply.SerializeAsString();
    }
    const std::vector<uint64_t> sums(p.checksums().begin(), p.checksums().end());
    if (uploader_ != nullptr) uploader_->Foreground(+1);
    absl::Status st = store_->Precopy(p.volume(), p.file_id(), p.block_size(), p.first(), sums,
                                      FromPeers(p.volume(), p.file_id(), {p.source()}));
    if (uploader_ != nullptr) uploader_->Foreground(-1);
    if (!st.ok()) reply.set_error(absl::StrCat("node ", node_id_, ": ", st.message()));
    return reply.SerializeAsString();
  }
  const rpc::VolumeReplicate& r = call.replicate();
  const std::vector<uint64_t> sums(r.checksums().begin(), r.checksums().end());
  if (!known(r.volume(), r.block_size()) ||
      sums.size() != (r.size() + r.block_size() - 1) / r.block_size()) {
    reply.set_error(absl::StrCat("node ", node_id_, ": a copy asked for of an unknown volume, ",
                                 "another block size, or checksums not covering its size"));
    return reply.SerializeAsString();
  }
  // Contents here already with other checksums: a copy of an earlier seal of the same id (a
  // commit that failed and was written on): drop it, copy anew.
  if (auto have = store_->Open(r.volume(), r.file_id()); have.ok() && (*have)->sums != sums) {
    store_->Drop(r.volume(), r.file_id());
  }
  if (uploader_ != nullptr) uploader_->Foreground(+1);  // a commit waits for this copy
  auto whole = store_->Fetch(r.volume(), r.file_id(), r.size(), r.block_size(), sums,
                             FromPeers(r.volume(), r.file_id(), {r.source()}), /*durable=*/true);
  if (uploader_ != nullptr) uploader_->Foreground(-1);
  if (!whole.ok()) {
    reply.set_error(absl::StrCat("node ", node_id_, ": ", whole.status().message()));
  }
  return reply.SerializeAsString();
}

}  // namespace ember::cachefs
