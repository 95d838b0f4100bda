// BlockDirectory: the fill pipeline's narrow seam to meta, for blocks only: which live nodes hold
// a block (with meta's checksum of it), recording the checksums of blocks first read from the
// origin, and reporting which blocks this node holds. PeerFetcher, ChecksumBook and the agent's
// reports (agent_reports.h) use it; NewMetaBlockDirectory is the one implementation, over
// meta::MetaClient; unit tests use a fake.
//
// Implementations are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ids.h"

namespace ember::meta {
class MetaClient;
}

namespace ember::cachefs {

class BlockDirectory {
 public:
  // A live node that holds a block.
  struct Holder {
    std::string id, address, sw, rack;  // sw, rack: its `switch` and `rack` labels
  };
  // What meta knows of one block.
  struct Location {
    std::vector<Holder> holders;       // live holders; may include this node
    std::optional<uint64_t> checksum;  // meta's checksum of the block, if it has one
    bool dataset_unheld = false;       // no other live node holds any block of its version
  };
  struct Claim {
    BlockAddr addr;
    uint64_t checksum = 0;
  };
  // A file of a dataset version with resident blocks: bit i of `bitmap` = block i.
  struct ResidentFile {
    uint32_t dataset_id = 0;
    uint32_t version = 0;
    uint64_t file_id = 0;
    std::string bitmap;
  };

  virtual ~BlockDirectory() = default;

  // Returns: one Location per address, in order (fewer if meta answered fewer); the error when
  // meta cannot be asked (Unavailable naming its address, ...).
  virtual absl::StatusOr<std::vector<Location>> Locate(const std::vector<BlockAddr>& addrs) = 0;
  // Records the checksums of blocks this node read from the origin (first writer wins).
  // Returns: per claim, whether meta holds a different checksum (a conflict); Unavailable when
  // meta cannot be reached; NotFound / InvalidArgument when a dataset version is gone.
  virtual absl::StatusOr<std::vector<bool>> RecordChecksums(const std::vector<Claim>& claims) = 0;
  // Replaces what meta knows this node holds with `files` (a full report, sent in pages).
  // Returns: Ok; meta's error (the next full report makes up for a partial one).
  virtual absl::Status ReportResident(const std::vector<ResidentFile>& files) = 0;
  // Blocks this node stored and lost since its last report. Returns: Ok; meta's error.
  virtual absl::Status ReportChanges(const std::vector<BlockAddr>& added,
                                     const std::vector<BlockAddr>& removed) = 0;
};

// The directory over meta's gRPC API, speaking for node `node_id`. `meta` must outlive it.
std::unique_ptr<BlockDirectory> NewMetaBlockDirectory(meta::MetaClient* meta, std::string node_id);

}  // namespace ember::cachefs
