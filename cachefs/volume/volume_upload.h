// VolumeUploader: the write-back of volumes (cachefs/volume/, front door volume_fs.h). Committed
// contents go to the volume's origin directory in the background, and meta marks them
// `persisted` (with the path they were put at).
//
// Who uploads a file: the first of its holders (meta's list, the writer first) that meta says is
// alive, so that when the writer dies a node holding a replica finishes the upload. Each pass
// (every couple of seconds, or at once when nudged after a commit) asks meta for every volume's
// files and, for those this node is to upload:
//   not persisted   copies the contents, every block checked against its checksum, to
//                   ORIGIN/DIR/.NAME.ember-ID.tmp, syncs it, renames it to ORIGIN/PATH and syncs
//                   the directory; then `Persisted` in meta (ignored there if the file changed).
//   persisted, but  (renamed since, e.g. a checkpoint's step.tmp/ -> step/): the origin's copy
//   at another path is renamed to the new path (uploaded again if it is gone there). Moves go
//                   before uploads, and nothing is written over the path another file's copy is
//                   at: a move onto it goes through a free name (.ember-moving-ID) first, an
//                   upload waits for the next pass.
// Write-back is background work: while this node has foreground work (a file open for writing,
// a replica being copied for a commit), uploads pause between blocks, for at most kYieldAtMost
// from when they began waiting (a file held open for hours does not stop write-back), and not
// while a writer waits for volume space (which uploads make).
//   discarded       (meta's list: files unlinked, renamed over or rewritten since their upload,
//                   and uploads that ended after their file was removed) the copy is deleted
//                   from the origin, by the first live node that held it (the first live node
//                   when none is left), and only if the file at that path is still that copy
//                   (inode, mtime and size as recorded at `persisted`): a later save put there
//                   is never deleted. Directories that leaves empty go too.
// The origin's own directory must exist: a missing one (a shared file system not mounted) is
// "origin unreachable", retried on the next pass, never created here.
//
// Thread-safe; one thread of its own.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachefs/volume/volume_store.h"
#include "meta/meta_client.h"

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
  // Which file in the origin a copy is (meta records it at `persisted`).
  struct OriginCopy {
    uint64_t ino = 0;
    int64_t mtime_ns = 0;
    uint64_t size = 0;
    static OriginCopy Of(const struct stat& st) {
      return {static_cast<uint64_t>(st.st_ino),
              static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
              static_cast<uint64_t>(st.st_size)};
    }
  };
  // Copies whole contents `w` of `n` to ORIGIN/path (temp + rename, synced).
  absl::Status Upload(const rpc::Volume& vol, const rpc::VolumeInode& n, const std::string& path,
                      OriginCopy* copy);
  // Renames the origin's copy of `n` (at its persisted_path) to `to_rel`. Returns: Ok (also when
  // a pass before did it without telling meta); NotFound when the copy is gone; Unavailable.
  absl::Status Move(const rpc::Volume& vol, const rpc::VolumeInode& n, const std::string& to_rel,
                    OriginCopy* copy);
  // Deletes the origin's copy of discarded contents `g` if the file at its path is still that
  // copy (inode, mtime, size), and the directories that leaves empty. Returns: Ok (also when
  // nothing was there, or another file is); Unavailable.
  absl::Status DeleteDiscarded(const rpc::Volume& vol, const rpc::VolumeInode& g);
  // Returns: Ok; ENOENT (ErrnoStatus) when the file was removed meanwhile; meta's error.
  absl::Status MarkPersisted(const rpc::Volume& vol, const rpc::VolumeInode& n,
                             const std::string& path, const OriginCopy& copy);

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
