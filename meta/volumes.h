// VolumeCatalog: writable volumes (checkpoints), their namespaces and the state of each file.
//
// A volume is a tree of directories and files kept in meta's store (column family `volumes`),
// so that every node sees the same tree and every change is one synced write batch: a rename
// of a whole directory is seen whole, by every node, or not at all. File contents are not here:
// a node writes a file's blocks into its own cache under the file's `writing_file_id` (given with
// the write lease) and then commits them: size, per-block checksums (recorded as claims at
// (volume id, kVolumeDataVersion, file_id, index), so peers and readers verify them as they do a
// dataset's blocks) and the nodes holding them. Every commit names a new file_id, so a block
// address always means the same bytes. Contents a change leaves behind (a commit replaced them,
// an unlink or a rename over the file removed them) are dropped from caches by their holders
// (nothing names them any more); when they were persisted, their copy in the origin is recorded
// as discarded (with which file there it is: origin_copy) until a node's uploader deletes it
// there and says so (VolumeOriginDeleted). A late upload of contents a file no longer has is
// recorded the same way; if it went where the file's own copy is, the file is uploaded again.
//
// One writer per file: the write lease (kLeaseMs, renewed by the writer's OpenWrite). Another
// node's OpenWrite while the lease lives gets EBUSY; a commit without the lease gets EIO.
//
// Errors a file system would give come back as ErrnoStatus (common/status.h): ENOENT, EEXIST,
// ENOTDIR, EISDIR, ENOTEMPTY, EINVAL (a directory moved into itself), ENAMETOOLONG, EBUSY, EIO.
// Other statuses are the store's (Unavailable, ResourceExhausted) or NotFound for an unknown
// volume.
//
// Keys (volume id and numbers big-endian, so a directory's entries scan in name order):
//   n/NAME                 -> rpc::Volume
//   d/VOL e PARENT NAME    -> ino          (directory entries)
//   d/VOL i INO            -> rpc::VolumeInode
//   d/VOL g FILE_ID        -> rpc::VolumeInode (contents unlinked or replaced whose copy is in the
//                             origin, at persisted_path: to delete there)
//
// Thread-safe. `mu_` serializes every change (read, decide, write one batch) and guards the
// volume records kept in memory; lookups, attributes and listings read the store without it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "meta/catalog.h"
#include "meta/meta.pb.h"
#include "meta/meta_client.h"  // kVolumeDataVersion, kVolumeRootIno
#include "meta/store.h"

namespace ember::meta {

class VolumeCatalog {
 public:
  static constexpr int64_t kLeaseMs = 30'000;
  static constexpr uint32_t kMaxReadDirPage = 1'000;

  using Clock = std::function<int64_t()>;  // unix ms; tests move it
  // REQUIRES: both outlive the catalog. `datasets`: names a volume must not take.
  VolumeCatalog(MetaStore* store, DatasetCatalog* datasets, Clock clock = {});

  // Loads the volume records. Returns: Ok, or the store's error.
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);

  // Returns: the volume; InvalidArgument (name, origin not a writable directory, replicas);
  // AlreadyExists (a volume or a dataset of that name).
  absl::StatusOr<rpc::Volume> Add(const rpc::AddVolumeRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<rpc::Volume> List() ABSL_LOCKS_EXCLUDED(mu_);
  // Returns: the volume; NotFound.
  absl::StatusOr<rpc::Volume> Get(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the volume's record, namespace and checksums. Returns: Ok; NotFound.
  absl::Status Remove(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a volume of that name exists (dataset add refuses the name).
  bool Has(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // One namespace operation (meta.proto, VolumeOpRequest). Returns: the reply with err = 0, or
  // an ErrnoStatus (above); NotFound for an unknown volume; InvalidArgument for no operation.
  absl::StatusOr<rpc::VolumeOpReply> Apply(const rpc::VolumeOpRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every file with its path (in `name`), how many bytes are not yet in the origin, and the
  // discarded contents whose origin copy is to be deleted.
  absl::StatusOr<rpc::VolumeStatusResponse> Status(const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Reads (no lock).
  absl::StatusOr<rpc::VolumeInode> Inode(uint32_t vol, uint64_t ino);
  absl::StatusOr<rpc::VolumeInode> LookupIn(uint32_t vol, uint64_t parent, const std::string& name);
  absl::Status ReadDir(uint32_t vol, const rpc::VolumeReadDir& op, rpc::VolumeOpReply* reply);

  // Changes: REQUIRES mu_; `vol` is the in-memory record, updated when the write succeeded.
  absl::Status Make(rpc::Volume* vol, const rpc::VolumeMake& op, bool dir,
                    rpc::VolumeOpReply* reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `fresh_id`: a new writing_file_id even for the node holding the lease.
  absl::Status OpenWrite(rpc::Volume* vol, uint64_t ino, const std::string& node,
                         rpc::VolumeOpReply* reply, bool fresh_id = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Commit(rpc::Volume* vol, const rpc::VolumeCommit& op, rpc::VolumeOpReply* reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Release(const rpc::Volume& vol, const rpc::VolumeRelease& op,
                       rpc::VolumeOpReply* reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Rename(const rpc::Volume& vol, const rpc::VolumeRename& op,
                      rpc::VolumeOpReply* reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Remove(const rpc::Volume& vol, const rpc::VolumeRemove& op, bool dir,
                      rpc::VolumeOpReply* reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SetAttr(const rpc::Volume& vol, const rpc::VolumeSetAttr& op,
                       rpc::VolumeOpReply* reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Persisted(const rpc::Volume& vol, const rpc::VolumePersisted& op,
                         rpc::VolumeOpReply* reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OriginDeleted(const rpc::Volume& vol, const rpc::VolumeOriginDeleted& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Copying(const rpc::Volume& vol, const rpc::VolumeCopying& op,
                       rpc::VolumeOpReply* reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `change` and then, if it wrote, the volume record in memory.
  absl::Status Write(MetaStore::VolumeChange* change, rpc::Volume* vol, const rpc::Volume& updated)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  int64_t NowMs() const;

  MetaStore* const store_;
  DatasetCatalog* const datasets_;
  const Clock clock_;
  absl::Mutex mu_;
  std::map<std::string, rpc::Volume> by_name_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::meta
