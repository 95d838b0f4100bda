// VolumeFs: the writable volumes of a node's mount (/MOUNT/NAME for each `ember volume add`),
// the front door of cachefs/volume/. DatasetFs routes the root's volume names and every volume
// inode here. Owns: the file-system operations on volumes, each open file's staging and commit,
// and reading or copying a file's contents from the nodes that hold them. Must not touch: datasets'
// cache and fill pipeline, FUSE.
//
// How a write becomes visible (meta/volumes.h keeps the tree):
//   open for writing   takes the file's write lease from meta (EBUSY while another node writes
//                      it) and a new contents id; bytes go to a staging file of this node
//                      (VolumeStore), never to contents another node may read.
//   close / fsync      seal the staging file (synced, checksummed per block) and commit it in
//                      meta: size, checksums, this node as holder. Only then, and at once, an
//                      open anywhere sees the new contents (close-to-open); before, nobody does:
//                      no torn or mixed file is ever visible.
//   open elsewhere     asks meta for the inode (entries and attributes are never cached by the
//                      kernel: timeouts 0) and, when this node lacks the contents, reads them
//                      from the holders over the block transport into memory as the reader
//                      reads, every block checked against the checksums meta recorded at the
//                      commit, no copy kept here (volume_stream.h); only the origin's copy
//                      known: copied here in the background, reads taking each block as soon
//                      as it is in (volume_fetch.cc).
//   replicas           before the commit, `--replicas - 1` other nodes copy the sealed contents
//                      from the writer and sync them (volume_replicas.cc); the commit names them
//                      all, or fails with EIO when too few could (nothing is committed then).
//                      While a file is written straight on, they copy its blocks ahead (every
//                      32 MiB), and the commit's copy of the rest runs while the writer syncs.
//   upload             in the background, to the volume's origin directory (volume_upload.h);
//                      then `persisted`. An open on a node when no holder can give the contents
//                      reads the origin's copy of persisted ones, checked block by block.
//   meta away          lookups, attributes and listings answer as meta last did, so files this
//                      node holds, or read from holders before, stay readable; every change
//                      (and contents never read here, whose checksums are meta's) fails with
//                      EIO until meta is back.
// Not built yet (docs/architecture.md, "Where this is going"): keeping open write handles across
// an agent restart.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachefs/filesystem.h"
#include "cachefs/volume/volume_store.h"
#include "cachefs/volume/volume_upload.h"
#include "meta/meta_client.h"
#include "transport/block_transport.h"

namespace ember::cachefs {

// Meta's answer as the errno a reader sees: its own errno, else ENOENT for NotFound and EIO for
// the rest (meta away, ...).
absl::Status VolumeErrno(const absl::Status& st);

class VolumeFs {
 public:
  // Inodes of volumes: MakeIno(volume id, kView, inode in meta).
  static constexpr uint32_t kView = 0xffff;
  static bool IsVolumeIno(uint64_t ino);

  // All must outlive this. `node_id`: this node as meta knows it (write leases, holders).
  // `uploader` (may be null): nudged after each commit.
  VolumeFs(meta::MetaClient* meta, VolumeStore* store, transport::BlockTransport* transport,
           std::string node_id, VolumeUploader* uploader = nullptr);
  ~VolumeFs();  // waits for copies under way (StartCopy)

  // The volumes at the root, refreshed from meta at most every couple of seconds.
  std::vector<rpc::Volume> Volumes();
  // The root entry of volume `name`. Returns: NotFound when there is no such volume.
  absl::StatusOr<Entry> LookupVolume(const std::string& name);
  static Attr VolumeRootAttr(const rpc::Volume& v);

  absl::StatusOr<Entry> Lookup(uint64_t parent, const std::string& name);
  absl::StatusOr<Entry> GetAttr(uint64_t ino);
  absl::Status ReadDir(uint64_t ino, uint64_t offset,
                       const std::function<bool(const std::string&, const Attr&, uint64_t)>& fn);
  absl::StatusOr<std::unique_ptr<FileSystem::FileHandle>> Open(uint64_t ino, int flags);
  absl::StatusOr<ReadResult> Read(uint64_t ino, FileSystem::FileHandle* handle, uint64_t offset,
                                  size_t size, char* buf);
  absl::StatusOr<std::pair<Entry, std::unique_ptr<FileSystem::FileHandle>>> Create(
      uint64_t parent, const std::string& name, uint32_t mode, int flags, uint32_t uid,
      uint32_t gid);
  absl::StatusOr<Entry> MkDir(uint64_t parent, const std::string& name, uint32_t mode, uint32_t uid,
                              uint32_t gid);
  absl::Status Unlink(uint64_t parent, const std::string& name);
  absl::Status RmDir(uint64_t parent, const std::string& name);
  absl::Status Rename(uint64_t parent, const std::string& name, uint64_t new_parent,
                      const std::string& new_name, uint32_t flags);
  absl::StatusOr<size_t> Write(uint64_t ino, FileSystem::FileHandle* handle, uint64_t offset,
                               const char* data, size_t size);
  absl::Status Commit(uint64_t ino, FileSystem::FileHandle* handle);  // close and fsync
  absl::StatusOr<Entry> SetAttr(uint64_t ino, FileSystem::FileHandle* handle,
                                const FileSystem::SetAttrs& attrs);
  absl::StatusOr<std::string> GetXattr(uint64_t ino, const std::string& name);

  // A peer's call (transport::BlockSource::Call): VolumeReplicate, copy contents from the
  // writer, synced, before answering. Returns: the NodeCallReply (its error says what failed);
  // InvalidArgument for a request that is not a call this node knows.
  absl::StatusOr<std::string> ServeCall(std::string_view request);

 private:
  class File;
  friend class File;
  struct Ref {  // a volume inode
    uint32_t vol_id = 0;
    std::string volume;  // its name, what meta's operations take
    uint64_t ino = 0;    // in meta
  };
  absl::StatusOr<Ref> Resolve(uint64_t fuse_ino);
  absl::StatusOr<rpc::VolumeOpReply> Op(const Ref& at, rpc::VolumeOpRequest req);
  // Gives this node's write lease of `at` back (a no-op in meta when it holds none).
  absl::Status ReleaseLease(const Ref& at);
  Entry EntryOf(const Ref& at, const rpc::VolumeInode& n);
  // The contents of `n` on this disk, copied from a holder first if need be.
  absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> Local(uint32_t vol,
                                                                  const rpc::VolumeInode& n,
                                                                  uint64_t block_size);
  // Where a copy of `n`'s contents comes from: meta's checksums, the holders (not this node,
  // none meta knows are dead), the origin's copy when persisted. Returns: the plan; EIO when there
  // is no source.
  struct CopyPlan {
    std::vector<uint64_t> sums;
    std::vector<std::string> peers;  // addresses
    std::string origin;              // the volume's origin (a directory or s3://)
    std::string origin_path;         // the copy there, relative to it; "" when not persisted
  };
  absl::StatusOr<CopyPlan> PlanCopy(uint32_t vol, const rpc::VolumeInode& n, uint64_t block_size);
  // Copies by `plan`: from the holders, else the origin's copy: read once for all the nodes
  // restoring it at once (the first copies it, the others copy that copy as it lands, Copier).
  // `written(i)`: block i is checked and in the copy's file; `restart()`: the copy starts over
  // (a new file: what `written` said before no longer holds). Returns: the contents; EIO
  // naming what failed.
  absl::StatusOr<std::shared_ptr<const VolumeStore::Whole>> RunCopy(
      uint32_t vol, const rpc::VolumeInode& n, uint64_t block_size, const CopyPlan& plan,
      const std::function<void(uint64_t)>& written, const std::function<void()>& restart);
  // A copy for readers (an open of contents not here): runs in the background, and reads take
  // each block as soon as it is in (volume_fetch.cc), so the copy and the reads overlap.
  struct Copy {
    absl::Mutex mu;
    std::vector<bool> have ABSL_GUARDED_BY(mu);  // blocks checked and written
    uint64_t attempt ABSL_GUARDED_BY(mu) = 0;    // the copy's file was made anew this often
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);                              // once done
    std::shared_ptr<const VolumeStore::Whole> whole ABSL_GUARDED_BY(mu);  // once done, Ok
  };
  // Starts the copy of `n`'s contents by `plan` (or joins the one under way). Returns: it.
  absl::StatusOr<std::shared_ptr<Copy>> StartCopy(uint32_t vol, const rpc::VolumeInode& n,
                                                  uint64_t block_size, CopyPlan plan)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Which node copies `n`'s contents from the origin (VolumeCopying): "" for this node (also
  // when meta cannot say); `unreachable`: copiers this node could not copy from.
  std::string Copier(uint32_t vol, const rpc::VolumeInode& n,
                     const std::vector<std::string>& unreachable);
  // Reads blocks of contents `file_id` from `node` (at `peer`), the copier, as its copy lands:
  // asks again for blocks not in yet while it gets further. Unavailable when it does not.
  VolumeStore::BatchReader FromCopier(uint32_t vol, uint64_t file_id, std::string node,
                                      std::string peer);
  // Reads blocks from the origin's copy at `origin`/`path`; empty for "".
  static VolumeStore::BatchReader FromOrigin(std::string origin, std::string path,
                                             uint64_t block_size);
  absl::StatusOr<std::string> PeerAddress(const std::string& node_id);
  // Reads blocks of contents `file_id` from `peers`, each piece from the first that has it.
  VolumeStore::BatchReader FromPeers(uint32_t vol, uint64_t file_id,
                                     std::vector<std::string> peers);
  // The blocks `pieces` of contents `file_id` as transport asks for them (none asked yet).
  static std::vector<transport::FetchPiece> Wanted(uint32_t vol, uint64_t file_id,
                                                   const std::vector<VolumeStore::Piece>& pieces);
  // Asks `peer` for the pieces of `want` not in yet. Returns: how many came in.
  size_t FetchMissing(const std::string& peer, std::vector<transport::FetchPiece>& want);
  uint32_t ReplicasOf(uint32_t vol_id);
  // Other live nodes in the order copies of `file_id` go to (other failure domains first).
  absl::StatusOr<std::vector<rpc::Node>> ReplicaCandidates(uint64_t file_id);
  // A writer's copies ahead of its commit: what it sent, to whom, and the sending under way.
  struct Ahead {
    uint64_t offered = 0;            // blocks sent ahead so far
    bool off = false;                // nobody to send to (one copy), or no address
    std::vector<std::string> peers;  // chosen at the first sending
    std::string source;              // this node's address
    std::future<void> sending;
  };
  // Offers blocks 0 .. sums.size() - 1 of staging `file_id` (`fd`, written straight on, `sums`
  // of its whole blocks) and, once 32 MiB more than before are whole and no sending is under
  // way, has the replicas copy the new ones ahead (VolumePrecopy, in the background).
  void SendAhead(const Ref& at, uint64_t file_id, int fd, uint64_t block_size,
                 const std::vector<uint64_t>& sums, Ahead* a);
  // Copies sealed contents `file_id` of `at` (this node's) to the volume's `replicas - 1` other
  // nodes (volume_replicas.cc). Returns: the holders, this node first; EIO when too few nodes
  // took a copy (naming each failure).
  absl::StatusOr<std::vector<std::string>> Replicate(const Ref& at, uint64_t file_id, uint64_t size,
                                                     uint64_t block_size,
                                                     const std::vector<uint64_t>& sums);
  // A handle for writing `n` (whose lease this node holds): staging from empty or from its
  // current contents.
  absl::StatusOr<std::unique_ptr<File>> OpenForWrite(const Ref& at, const rpc::VolumeInode& n,
                                                     uint64_t block_size, bool truncate);
  void Forget(File* f) ABSL_LOCKS_EXCLUDED(mu_);

  meta::MetaClient* const meta_;
  VolumeStore* const store_;
  transport::BlockTransport* const transport_;
  const std::string node_id_;
  VolumeUploader* const uploader_;

  absl::Mutex mu_;
  std::vector<rpc::Volume> volumes_ ABSL_GUARDED_BY(mu_);
  int64_t listed_at_ms_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::string> peers_ ABSL_GUARDED_BY(mu_);  // node id -> address
  // What meta last said of each inode, name and listing, for while meta is away (volume_away.cc).
  void RememberLocked(uint32_t vol, const rpc::VolumeInode& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remember(uint32_t vol, const rpc::VolumeOpRequest& req, const rpc::VolumeOpReply& r)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<rpc::VolumeOpReply> Recall(uint32_t vol, const rpc::VolumeOpRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr size_t kRemembered = 500'000;
  std::map<std::pair<uint32_t, uint64_t>, rpc::VolumeInode> inodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<uint32_t, uint64_t, std::string>, uint64_t> names_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint32_t, uint64_t>, std::vector<rpc::VolumeInode>> listings_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint32_t, uint64_t>, std::weak_ptr<Copy>> copies_ ABSL_GUARDED_BY(mu_);
  // Checksums of contents read here from holders (contents never change): opened again while
  // meta is away, they are read from their holders still.
  static constexpr size_t kSumsKept = 10'000;
  std::map<std::pair<uint32_t, uint64_t>, std::vector<uint64_t>> sums_ ABSL_GUARDED_BY(mu_);
  std::vector<std::future<void>> copying_ ABSL_GUARDED_BY(mu_);  // StartCopy's threads
  // Files this node has open for writing, by fuse inode: their size is the staging file's.
  std::multimap<uint64_t, File*> writers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::cachefs
