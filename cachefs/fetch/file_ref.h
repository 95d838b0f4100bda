// FileRef: a dataset file as the fill pipeline needs it: its block addresses (dataset, version,
// file id, block size) and what the origin must still match (origin.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/ids.h"
#include "origin/origin.h"

namespace ember::cachefs {

struct FileRef {
  uint32_t dataset_id = 0;
  uint32_t version = 0;
  uint64_t file_id = 0;
  uint64_t block_size = 0;
  origin::OriginFile origin;  // root, path, size, mtime
  std::string dataset_name;

  BlockAddr Block(uint64_t index) const { return {dataset_id, version, file_id, index}; }
  // Returns: how many blocks the file has.
  uint64_t Blocks() const { return (origin.size + block_size - 1) / block_size; }
  // Returns: block `index`'s length (the last block of a file, and a small file's only one, is
  // shorter than block_size).
  uint64_t BlockLength(uint64_t index) const {
    return std::min(block_size, origin.size - index * block_size);
  }
};

}  // namespace ember::cachefs
