// The block cache's index records (RocksDB under CACHE/index): one per resident block.
//
//   key   (24 bytes): dataset id (4) | version (4) | file id (8) | block index (8), big-endian
//   value (32 bytes): checksum (8) | offset in the cache file (8) | length (4) | pinned until,
//                     unix ms (8) | segment (4): 0 for a block in its file's own cache file, else
//                     the small-object segment holding it; 20- and 28-byte values (no pin, no
//                     segment) are from older agents.
// A record is written only after its bytes are in the cache file, so it is the commit point of
// a fill. Decoding checks sizes and bounds: a damaged record is dropped, never trusted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/ids.h"

namespace ember::cachefs {

struct IndexRecord {
  BlockAddr addr;
  uint64_t checksum = 0;
  uint64_t offset = 0;  // == addr.index * block size, or the offset in the segment
  uint32_t length = 0;
  int64_t pinned_until_ms = 0;
  uint32_t segment = 0;  // 0: the file's own cache file
};

std::string EncodeIndexKey(const BlockAddr& addr);
std::string EncodeIndexValue(const IndexRecord& r);
// nullopt for wrong sizes, a zero file id, a length of 0 or over kMaxBlockSize, an offset that
// is not a multiple of the length's block or would overflow, or a segment block that is not its
// file's only block.
std::optional<IndexRecord> DecodeIndexRecord(std::string_view key, std::string_view value);

}  // namespace ember::cachefs
