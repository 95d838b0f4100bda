#include "meta/checksum_ledger.h"

#include <spdlog/spdlog.h>

#include <map>

#include "common/status.h"
#include "meta/meta_client.h"

namespace ember::meta {

absl::Status ChecksumLedger::Record(const rpc::RecordChecksumsRequest& req,
                                    rpc::RecordChecksumsResponse* resp) {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<BlockAddr, uint64_t>> to_write;
  std::map<BlockAddr, uint64_t> in_batch;
  rpc::RecordChecksumsResponse out;
  for (const auto& c : req.checksums()) {
    const BlockAddr addr = FromProto(c.block());
    std::optional<uint64_t> have;
    if (auto it = in_batch.find(addr); it != in_batch.end()) {
      have = it->second;
    } else {
      ASSIGN_OR_RETURN(have, store_->GetChecksum(addr));
    }
    if (!req.conflicts_only()) {
      rpc::BlockChecksum* recorded = out.add_recorded();
      *recorded->mutable_block() = c.block();
      recorded->set_checksum(have.value_or(c.checksum()));
    }
    if (!have) {
      to_write.emplace_back(addr, c.checksum());
      in_batch[addr] = c.checksum();
      out.add_conflict(false);
      continue;
    }
    out.add_conflict(*have != c.checksum());
    if (*have != c.checksum()) {
      spdlog::warn("meta: checksum conflict for block {}/{}/{}/{}: held {:016x}, got {:016x}",
                   addr.dataset_id, addr.version, addr.file_id, addr.index, *have, c.checksum());
    }
  }
  if (!to_write.empty()) RETURN_IF_ERROR(store_->PutChecksums(to_write));
  *resp = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::optional<uint64_t>>> ChecksumLedger::Get(
    const std::vector<BlockAddr>& addrs) {
  std::vector<std::optional<uint64_t>> out;
  out.reserve(addrs.size());
  for (const BlockAddr& a : addrs) {
    ASSIGN_OR_RETURN(std::optional<uint64_t> sum, store_->GetChecksum(a));
    out.push_back(sum);
  }
  return out;
}

}  // namespace ember::meta
