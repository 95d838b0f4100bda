// Origin: where a dataset's bytes come from on a miss. POSIX directories today; object stores
// later behind the same interface. Implementations are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ember::cachefs {

// What the manifest says about the file being read: a fill must match it exactly.
struct OriginFile {
  std::string root;  // the dataset's origin
  std::string path;  // relative to root
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

class Origin {
 public:
  virtual ~Origin() = default;
  // Reads exactly `len` bytes at `offset` into buf.
  // Returns: Ok; NotFound (file gone); FailedPrecondition (file changed since the manifest:
  // size or mtime differ, or it became short); Unavailable (I/O error).
  virtual absl::Status Read(const OriginFile& file, uint64_t offset, size_t len, char* buf) = 0;
};

// Reads files under a local or mounted directory.
std::unique_ptr<Origin> NewPosixOrigin();

}  // namespace ember::cachefs
