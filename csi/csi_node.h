// csi/: the CSI node plugin, so Kubernetes pods get datasets as volumes (driver csi.ember.io).
// This is the folder's front door.
//
// Owns: serving the CSI Identity and Node services (csi.proto, spec v1) on a unix socket, and
// publishing a dataset as a volume: a read-only bind mount of the node agent's
// `MOUNT_ROOT/NAME[@V][/PATH]` onto the target path kubelet gives, and its unmount. It knows the
// agent only by its mount (a dataset is published when it is there); it never talks to meta.
// Depends only on common/.
//
// Volumes:
//   - ephemeral inline (pod spec `csi: {driver: csi.ember.io, readOnly: true,
//     volumeAttributes: {dataset: NAME, version: "3", path: "train"}}`), and
//   - static PVs (volumeHandle NAME or NAME@V; the same attributes may refine it).
// Datasets are read-only: a writable publish (readonly false with a writer access mode) is
// refused with FAILED_PRECONDITION; an unknown dataset is NOT_FOUND; bad attributes, a block
// volume or a path outside the dataset are INVALID_ARGUMENT; another volume already on the
// target is ALREADY_EXISTS; a mount root that the agent does not serve is UNAVAILABLE. Publish
// and unpublish are idempotent.
//
// Thread-safe: publishes and unpublishes are serialized.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class Server;
}

namespace ember::csinode {

inline constexpr char kDriverName[] = "csi.ember.io";

struct CsiOptions {
  std::string endpoint = "unix:///csi/csi.sock";  // unix://PATH or a plain path
  std::string node_id;                            // this node's name (as kubelet knows it)
  std::string mount_root = "/mnt/ember";          // where the node agent serves datasets
  // Topology labels (switch, rack, ...): NodeGetInfo reports each as topology.ember.io/KEY,
  // with topology.ember.io/node = node_id.
  std::map<std::string, std::string> labels;
};

class CsiServer {
 public:
  // Listens on the endpoint (a stale socket file there is replaced) and serves.
  // Returns: InvalidArgument (no node id; an endpoint that is not a unix socket);
  // Unavailable (cannot listen there).
  static absl::StatusOr<std::unique_ptr<CsiServer>> Start(const CsiOptions& options);
  ~CsiServer();
  // The socket's path.
  const std::string& socket_path() const { return socket_path_; }
  void Wait();
  void Shutdown();

 private:
  struct Services;
  CsiServer() = default;
  std::string socket_path_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace ember::csinode
