// Identities of datasets, blocks and names.
//
// A block is addressed by (dataset id, version, file id, block index). Its 128-bit id is the XXH3
// of those four numbers, so a block's id never repeats for other bytes: dataset ids are never
// reused, and versions are immutable. All functions here are pure and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"

namespace ember {

inline constexpr uint64_t kDefaultBlockSize = 4ull << 20;
inline constexpr uint64_t kMinBlockSize = 64ull << 10;
inline constexpr uint64_t kMaxBlockSize = 64ull << 20;

// Where a block lives in the dataset model.
struct BlockAddr {
  uint32_t dataset_id = 0;
  uint32_t version = 0;
  uint64_t file_id = 0;
  uint64_t index = 0;

  friend bool operator==(const BlockAddr&, const BlockAddr&) = default;
  friend auto operator<=>(const BlockAddr&, const BlockAddr&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockAddr& a) {  // for absl's hash maps
    return H::combine(std::move(h), a.dataset_id, a.version, a.file_id, a.index);
  }
};

// The 128-bit block id used on the wire and in checksums.
struct BlockId {
  uint64_t hi = 0;
  uint64_t lo = 0;

  friend bool operator==(const BlockId&, const BlockId&) = default;
  // 32 lowercase hex digits.
  std::string ToHex() const;
};

BlockId MakeBlockId(const BlockAddr& addr);

// XXH3-64 of a block's bytes: the checksum meta records and every reader verifies.
uint64_t BlockChecksum(const void* data, size_t len);

// BlockChecksum of bytes that arrive in pieces (hashed while they are still in the CPU's
// cache, at about three times the speed of hashing them from memory after). Not thread-safe.
class BlockChecksummer {
 public:
  BlockChecksummer();
  ~BlockChecksummer();
  BlockChecksummer(const BlockChecksummer&) = delete;
  BlockChecksummer& operator=(const BlockChecksummer&) = delete;
  // Pieces of this size still sit in the CPU's cache when hashed right after they arrive.
  static constexpr size_t kPiece = 256u << 10;
  void Update(const void* data, size_t len);
  // Returns: BlockChecksum of everything given to Update.
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t
};

// Returns: Ok, or InvalidArgument naming what is wrong with `name`.
// A dataset name is 1-64 characters of [A-Za-z0-9._-], not starting with '.' or '-'.
absl::Status ValidateDatasetName(std::string_view name);

// Returns: Ok, or InvalidArgument. A power of two in [kMinBlockSize, kMaxBlockSize].
absl::Status ValidateBlockSize(uint64_t block_size);

// Orders relative paths as a pre-order walk with sorted children does ('/' sorts first), so
// two manifests can be diffed by one merge pass.
int ComparePaths(std::string_view a, std::string_view b);

}  // namespace ember
