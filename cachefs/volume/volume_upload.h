// VolumeUploader: the write-back of volumes (cachefs/volume/, front door volume_fs.h). Committed
// contents go to the volume's origin (a directory or an S3 prefix: origin/writable.h) in the
// background, and meta marks them `persisted` (with the path they were put at and which file
// there the copy is).
//
// Who uploads a file: the first of its holders (meta's list, the writer first) that meta says is
// alive, so that when the writer dies a node holding a replica finishes the upload (an empty
// file, which no node holds: the first live node). Each pass
// (every couple of seconds, or at once when nudged after a commit) asks meta for every volume's
// files and, for those this node is to upload:
//   not persisted   puts the contents at PATH, every block checked against its checksum on the
//                   way, whole or not at all (a directory: a temp file, synced, renamed, the
//                   directory synced; S3: one PUT, or a multipart upload); then `Persisted` in
//                   meta (if the file changed or went meanwhile, meta lists the copy as
//                   discarded).
//   persisted, but  (renamed since, e.g. a checkpoint's step.tmp/ -> step/): the origin's copy
//   at another path is moved to the new path (S3: copied and deleted; uploaded again if it is
//                   gone there, or too large for S3 to copy). Moves go before uploads, and
//                   nothing is written over the path another file's copy is at: a move onto it
//                   goes through a free name (.ember-moving-ID) first, an upload waits for the
//                   next pass.
// and, of meta's list of discarded copies (files unlinked, renamed over or rewritten since their
// upload, and uploads that ended after their file changed), deletes those whose first live
// holder is this node (any live node's job, the first by id, when none is left), only if the
// file at that path is still that copy (a save put there since by something else stays), and
// puts nothing at such a path while its deletion is pending. Directories that leaves empty go
// too.
// Write-back is background work: while this node has foreground work (a file open for writing,
// a replica being copied for a commit), uploads pause between blocks, for at most kYieldAtMost
// from when they began waiting (a file held open for hours does not stop write-back), and not
// while a writer waits for volume space (which uploads make).
// An origin directory must exist: a missing one (a shared file system not mounted) is "origin
// unreachable", retried on the next pass, never created here; so is a bucket that does not answer.
//
// Thread-safe; one thread of its own.
#pragma once

#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachefs/volume/volume_store.h"
#include "meta/meta_client.h"
#include "origin/writable.h"

namespace ember::cachefs {

class VolumeUploader {
 public:
  // Both must outlive this. Starts its thread.
  VolumeUploader(meta::MetaClient* meta, VolumeStore* store, std::string node_id);
  ~VolumeUploader();  // stops and joins (an upload in progress finishes first)

  // A commit happened here: start a pass now.
  void Nudge() ABSL_LOCKS_EXCLUDED(mu_);
  // Foreground work on this node began (+1) or ended (-1).
  void Foreground(int delta) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kYieldAtMost = absl::Seconds(30);

  // One pass, on the caller's thread. Returns: how many files it uploaded or moved; meta's error.
  absl::StatusOr<int> Pass();

 private:
  void Loop();
  // Waits while there is foreground work (see above).
  void Yield() ABSL_LOCKS_EXCLUDED(mu_);
  // Puts whole contents of `n` at `path` in the origin, every block checked on the way.
  absl::StatusOr<origin::OriginCopy> Upload(origin::WritableOrigin& to_origin,
                                            const rpc::Volume& vol, const rpc::VolumeInode& n,
                                            const std::string& path);
  // Moves the origin's copy of `n` (at its persisted_path) to `to`. Returns: the copy (also
  // when a pass before moved it without telling meta); NotFound when it is gone; Unimplemented
  // when the origin cannot move it; Unavailable.
  absl::StatusOr<origin::OriginCopy> Move(origin::WritableOrigin& to_origin,
                                          const rpc::VolumeInode& n, const std::string& to);
  // Returns: Ok; ENOENT (ErrnoStatus) when the file was removed meanwhile; meta's error.
  absl::Status MarkPersisted(const rpc::Volume& vol, const rpc::VolumeInode& n,
                             const std::string& path, const origin::OriginCopy& copy);

  meta::MetaClient* const meta_;
  VolumeStore* const store_;
  const std::string node_id_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool nudged_ ABSL_GUARDED_BY(mu_) = false;
  int busy_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time yielding_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace ember::cachefs
