// WritableOrigin: where a volume's files are written back to (origin/, front door origin.h): a
// directory (a shared file system) or an S3 bucket prefix `s3://bucket/prefix`. What the node's
// uploader puts files there with, moves them with (a rename carried), deletes them with (an
// unlink carried), and what a node restores a file from when no node holds it.
//
// Each file put there has an identity (OriginCopy::id) no other put has: a directory's
// "st_ino:st_mtim" of the file the put made (a rename keeps both), an S3 object's
// x-amz-meta-ember-copy (a name made at the put; a server-side copy keeps it; objects put by
// something else: their ETag). Deletions name the identity, so a file someone put at that path
// since is not deleted (but a put that lands between the check and the delete can be: callers
// keep puts away from paths with a deletion pending).
//
// Paths are relative to the origin, "/"-separated. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ember::origin {

struct OriginCopy {
  std::string id;
  uint64_t size = 0;
};

// Fills buf with `len` bytes of the file at `offset`. A non-ok status stops the put.
using PieceFn = std::function<absl::Status(uint64_t offset, size_t len, char* buf)>;

class WritableOrigin {
 public:
  virtual ~WritableOrigin() = default;

  // Returns: Ok; Unavailable (a directory that is not there, which is never created here: a
  // shared file system not mounted; a bucket that does not answer or refuses us).
  virtual absl::Status Reachable() = 0;

  // Writes `size` bytes to `rel`, whole or not at all (a reader of the origin sees the file that
  // was there or the whole new one), durably (synced; S3: acknowledged), over what is there.
  // Takes the bytes from `fill`, in order, `piece` bytes at a time (the last piece shorter).
  // Returns: the copy; fill's error; Unavailable.
  virtual absl::StatusOr<OriginCopy> Put(const std::string& rel, uint64_t size, uint64_t piece,
                                         const PieceFn& fill) = 0;

  // Returns: the file at `rel`; NotFound; Unavailable.
  virtual absl::StatusOr<OriginCopy> Stat(const std::string& rel) = 0;

  // Moves the file at `from` to `to` (over what is there). Returns: the moved copy (the same
  // identity); NotFound when `from` is gone; Unimplemented when this origin cannot move it (an S3
  // object over 5 GiB: put it again); Unavailable.
  virtual absl::StatusOr<OriginCopy> Move(const std::string& from, const std::string& to) = 0;

  // Deletes the file at `rel` if it is `copy` (same id and size), and the directories that
  // leaves empty. Returns: Ok (also when nothing or another file is there); Unavailable.
  virtual absl::Status DeleteIf(const std::string& rel, const OriginCopy& copy) = 0;

  // Reads exactly `len` bytes at `offset` of `rel` into buf. Returns: Ok; NotFound;
  // Unavailable (I/O, short file, server).
  virtual absl::Status Read(const std::string& rel, uint64_t offset, size_t len, char* buf) = 0;
};

// "/abs/dir" or "s3://bucket/prefix" (S3 settings from the environment, as OpenRemoteOrigin).
// Returns: the origin; InvalidArgument (another scheme, relative); FailedPrecondition (no S3
// credentials).
absl::StatusOr<std::unique_ptr<WritableOrigin>> OpenWritableOrigin(const std::string& uri);

// The origin for `uri`, opened on first use and kept for the process (one HTTP client per
// bucket). Returns: as OpenWritableOrigin.
absl::StatusOr<std::shared_ptr<WritableOrigin>> SharedWritableOrigin(const std::string& uri);

}  // namespace ember::origin
