// ChecksumLedger: the XXH3-64 of every block's bytes as first recorded by the node that read it
// from the origin. First writer wins: a later, different value is answered as a conflict (the
// origin changed in place), so every node checks what it reads against the same value.
//
// Checksums live in the store only (no copy in memory: there is one per block of every dataset
// version). Thread-safe: `mu_` serializes check-and-set, and no other unit is called under it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/ids.h"
#include "meta/meta.pb.h"
#include "meta/store.h"

namespace ember::meta {

class ChecksumLedger {
 public:
  // REQUIRES: the store outlives the ledger.
  explicit ChecksumLedger(MetaStore* store) : store_(store) {}

  // Records the checksums not yet known and answers, per item, the value held now and whether
  // the caller's differed. The caller checks the addresses first (DatasetCatalog::CheckBlock).
  // Returns: Ok; the store's errors (nothing was recorded then).
  absl::Status Record(const rpc::RecordChecksumsRequest& req, rpc::RecordChecksumsResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns: per address, the checksum if one is recorded; the store's errors.
  absl::StatusOr<std::vector<std::optional<uint64_t>>> Get(const std::vector<BlockAddr>& addrs);

 private:
  MetaStore* const store_;
  absl::Mutex mu_;  // serializes check-and-set against the store
};

}  // namespace ember::meta
