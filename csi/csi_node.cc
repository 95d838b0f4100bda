#include "csi/csi_node.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "csi/csi.grpc.pb.h"

namespace ember::csinode {
namespace {

namespace fs = std::filesystem;
using ::csi::v1::VolumeCapability;

constexpr char kVendorVersion[] = "0.1.0";
constexpr long kFuseMagic = 0x65735546;  // statfs f_type of a FUSE mount
constexpr char kTopologyPrefix[] = "topology.ember.io/";

grpc::Status Error(grpc::StatusCode code, const std::string& message) { return {code, message}; }

// Mount points listed in /proc/self/mountinfo (the fifth field, octal escapes undone).
std::set<std::string> MountPoints() {
  std::set<std::string> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() < 5) continue;
    std::string p;
    for (size_t i = 0; i < f[4].size(); i++) {
      if (f[4][i] == '\\' && i + 3 < f[4].size()) {
        p.push_back(static_cast<char>(std::stoi(f[4].substr(i + 1, 3), nullptr, 8)));
        i += 3;
      } else {
        p.push_back(f[4][i]);
      }
    }
    out.insert(p);
  }
  return out;
}

bool IsMountPoint(const std::string& path) { return MountPoints().count(path) > 0; }

bool Writer(VolumeCapability::AccessMode::Mode m) {
  using M = VolumeCapability::AccessMode;
  return m == M::SINGLE_NODE_WRITER || m == M::MULTI_NODE_SINGLE_WRITER ||
         m == M::MULTI_NODE_MULTI_WRITER || m == M::SINGLE_NODE_SINGLE_WRITER ||
         m == M::SINGLE_NODE_MULTI_WRITER;
}

// A relative path inside a dataset: no "..", no absolute start. Returns: the normalized path.
absl::StatusOr<std::string> SubPath(const std::string& p) {
  std::string out;
  for (absl::string_view part : absl::StrSplit(p, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("path '", p, "' leaves the dataset (no '..' allowed)"));
    }
    absl::StrAppend(&out, out.empty() ? "" : "/", part);
  }
  return out;
}

}  // namespace

struct CsiServer::Services {
  class Identity final : public ::csi::v1::Identity::Service {
   public:
    explicit Identity(Services* s) : s_(s) {}
    grpc::Status GetPluginInfo(grpc::ServerContext*, const ::csi::v1::GetPluginInfoRequest*,
                               ::csi::v1::GetPluginInfoResponse* out) override {
      out->set_name(kDriverName);
      out->set_vendor_version(kVendorVersion);
      return grpc::Status::OK;
    }
    grpc::Status GetPluginCapabilities(grpc::ServerContext*,
                                       const ::csi::v1::GetPluginCapabilitiesRequest*,
                                       ::csi::v1::GetPluginCapabilitiesResponse*) override {
      return grpc::Status::OK;  // a node plugin only: no controller service
    }
    grpc::Status Probe(grpc::ServerContext*, const ::csi::v1::ProbeRequest*,
                       ::csi::v1::ProbeResponse* out) override {
      // Ready once the agent serves its mount (it may still be starting: not an error).
      out->mutable_ready()->set_value(s_->MountServed().ok());
      return grpc::Status::OK;
    }

   private:
    Services* s_;
  };

  class Node final : public ::csi::v1::Node::Service {
   public:
    explicit Node(Services* s) : s_(s) {}
    grpc::Status NodePublishVolume(grpc::ServerContext*,
                                   const ::csi::v1::NodePublishVolumeRequest* req,
                                   ::csi::v1::NodePublishVolumeResponse*) override {
      return s_->Publish(*req);
    }
    grpc::Status NodeUnpublishVolume(grpc::ServerContext*,
                                     const ::csi::v1::NodeUnpublishVolumeRequest* req,
                                     ::csi::v1::NodeUnpublishVolumeResponse*) override {
      return s_->Unpublish(*req);
    }
    grpc::Status NodeGetCapabilities(grpc::ServerContext*,
                                     const ::csi::v1::NodeGetCapabilitiesRequest*,
                                     ::csi::v1::NodeGetCapabilitiesResponse*) override {
      return grpc::Status::OK;  // no staging: kubelet publishes straight to the pod's path
    }
    grpc::Status NodeGetInfo(grpc::ServerContext*, const ::csi::v1::NodeGetInfoRequest*,
                             ::csi::v1::NodeGetInfoResponse* out) override {
      out->set_node_id(s_->options.node_id);
      auto* seg = out->mutable_accessible_topology()->mutable_segments();
      (*seg)[absl::StrCat(kTopologyPrefix, "node")] = s_->options.node_id;
      for (const auto& [k, v] : s_->options.labels) (*seg)[absl::StrCat(kTopologyPrefix, k)] = v;
      return grpc::Status::OK;
    }

   private:
    Services* s_;
  };

  explicit Services(const CsiOptions& o) : options(o), identity(this), node(this) {}

  // Ok when the mount root is the agent's live FUSE mount.
  absl::Status MountServed() const {
    struct statfs st;
    if (statfs(options.mount_root.c_str(), &st) != 0) {
      return absl::UnavailableError(absl::StrCat("the Ember mount ", options.mount_root, ": ",
                                                 strerror(errno), " (is the node agent running?)"));
    }
    if (st.f_type != kFuseMagic) {
      return absl::UnavailableError(absl::StrCat("nothing serves datasets at ", options.mount_root,
                                                 " (is the node agent running, and is its "
                                                 "--mount the plugin's --mount-root?)"));
    }
    return absl::OkStatus();
  }

  grpc::Status Publish(const ::csi::v1::NodePublishVolumeRequest& req) {
    using grpc::StatusCode;
    if (req.volume_id().empty())
      return Error(StatusCode::INVALID_ARGUMENT, "volume_id is required");
    const std::string& target = req.target_path();
    if (target.empty() || target[0] != '/') {
      return Error(StatusCode::INVALID_ARGUMENT, "target_path must be an absolute path");
    }
    if (!req.has_volume_capability()) {
      return Error(StatusCode::INVALID_ARGUMENT, "volume_capability is required");
    }
    const VolumeCapability& cap = req.volume_capability();
    if (cap.has_block()) {
      return Error(StatusCode::INVALID_ARGUMENT,
                   "block volumes are not offered: an Ember dataset is a file system "
                   "(use volumeMode: Filesystem)");
    }
    // The dataset and version: attributes, else the volume id (a static PV's handle NAME[@V]).
    std::string name, version, path;
    bool ephemeral = false;
    for (const auto& [k, v] : req.volume_context()) {
      if (k == "dataset") {
        name = v;
      } else if (k == "version") {
        version = v;
      } else if (k == "path") {
        path = v;
      } else if (k == "csi.storage.k8s.io/ephemeral") {
        ephemeral = v == "true";
      } else if (!absl::StartsWith(k, "csi.storage.k8s.io/")) {
        return Error(StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("unknown volume attribute '", k,
                                  "' (csi.ember.io takes dataset, version, path)"));
      }
    }
    if (name.empty()) {
      if (ephemeral) {
        return Error(StatusCode::INVALID_ARGUMENT,
                     "volumeAttributes.dataset is required for an inline volume");
      }
      const std::string& id = req.volume_id();
      const size_t at = id.find('@');
      name = id.substr(0, at);
      if (at != std::string::npos && version.empty()) version = id.substr(at + 1);
    }
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('@') != std::string::npos) {
      return Error(StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("'", name, "' is not a dataset name"));
    }
    if (!version.empty() &&
        (version.size() > 9 || !std::all_of(version.begin(), version.end(), absl::ascii_isdigit))) {
      return Error(StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("version '", version, "' is not a version number"));
    }
    auto sub = SubPath(path);
    if (!sub.ok()) return Error(StatusCode::INVALID_ARGUMENT, std::string(sub.status().message()));
    if (Writer(cap.access_mode().mode()) && !req.readonly()) {
      return Error(StatusCode::FAILED_PRECONDITION,
                   absl::StrCat("dataset '", name,
                                "' is read-only: publish it read-only (readOnly: true in the "
                                "pod's csi volume, or a ReadOnlyMany PV)"));
    }
    if (auto s = MountServed(); !s.ok()) {
      return Error(StatusCode::UNAVAILABLE, std::string(s.message()));
    }
    const std::string dataset = version.empty() ? name : absl::StrCat(name, "@", version);
    const std::string source =
        absl::StrCat(options.mount_root, "/", dataset, sub->empty() ? "" : "/", *sub);
    struct stat src;
    if (stat(source.c_str(), &src) != 0) {
      const int err = errno;
      if (err == ENOENT) {
        return Error(StatusCode::NOT_FOUND,
                     absl::StrCat(sub->empty() ? "" : absl::StrCat("path '", *sub, "' of "),
                                  "dataset '", dataset, "' is not on this node's mount (", source,
                                  "): see `ember dataset ls`"));
      }
      return Error(StatusCode::UNAVAILABLE, absl::StrCat(source, ": ", strerror(err)));
    }
    if (!S_ISDIR(src.st_mode)) {
      return Error(StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("path '", *sub, "' of dataset '", dataset, "' is not a folder"));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (IsMountPoint(target)) {
      struct stat t;
      if (stat(target.c_str(), &t) == 0 && t.st_dev == src.st_dev && t.st_ino == src.st_ino) {
        return grpc::Status::OK;  // published already: idempotent
      }
      return Error(StatusCode::ALREADY_EXISTS,
                   absl::StrCat("another volume is mounted at ", target));
    }
    std::error_code ec;
    fs::create_directories(target, ec);
    if (ec) {
      return Error(StatusCode::INTERNAL,
                   absl::StrCat("cannot create ", target, ": ", ec.message()));
    }
    if (mount(source.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return Error(StatusCode::INTERNAL,
                   absl::StrCat("bind mount of ", source, " on ", target, ": ", strerror(errno)));
    }
    // A bind mount takes its flags only from a remount.
    if (mount(nullptr, target.c_str(), nullptr,
              MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
      const int err = errno;
      umount2(target.c_str(), MNT_DETACH);
      return Error(StatusCode::INTERNAL,
                   absl::StrCat("read-only remount of ", target, ": ", strerror(err)));
    }
    spdlog::info("csi: published {} ({}) at {}", dataset, req.volume_id(), target);
    return grpc::Status::OK;
  }

  grpc::Status Unpublish(const ::csi::v1::NodeUnpublishVolumeRequest& req) {
    using grpc::StatusCode;
    if (req.volume_id().empty())
      return Error(StatusCode::INVALID_ARGUMENT, "volume_id is required");
    const std::string& target = req.target_path();
    if (target.empty() || target[0] != '/') {
      return Error(StatusCode::INVALID_ARGUMENT, "target_path must be an absolute path");
    }
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < 8 && IsMountPoint(target); i++) {  // stacked mounts: each one
      if (umount2(target.c_str(), 0) != 0) {
        const int err = errno;
        // Still busy (the pod's processes are gone, a straggler is not): detach it.
        if (err != EBUSY || umount2(target.c_str(), MNT_DETACH) != 0) {
          return Error(StatusCode::INTERNAL,
                       absl::StrCat("unmount of ", target, ": ", strerror(errno)));
        }
      }
    }
    if (rmdir(target.c_str()) != 0 && errno != ENOENT) {
      return Error(StatusCode::INTERNAL,
                   absl::StrCat("cannot remove ", target, ": ", strerror(errno)));
    }
    spdlog::info("csi: unpublished {} from {}", req.volume_id(), target);
    return grpc::Status::OK;
  }

  const CsiOptions options;
  Identity identity;
  Node node;
  std::mutex mu;
};

absl::StatusOr<std::unique_ptr<CsiServer>> CsiServer::Start(const CsiOptions& options) {
  if (options.node_id.empty()) return absl::InvalidArgumentError("--node-id is required");
  std::string path = options.endpoint;
  if (absl::StartsWith(path, "unix://")) {
    path = path.substr(7);
  } else if (absl::StartsWith(path, "unix:")) {
    path = path.substr(5);
  } else if (path.find("://") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--endpoint '", options.endpoint, "': CSI plugins listen on unix://PATH"));
  }
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--endpoint '", options.endpoint, "': needs an absolute socket path"));
  }
  std::unique_ptr<CsiServer> s(new CsiServer());
  s->socket_path_ = path;
  s->services_ = std::make_unique<Services>(options);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  unlink(path.c_str());  // a socket left by an earlier plugin
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(absl::StrCat("unix://", path), grpc::InsecureServerCredentials(),
                           &bound);
  builder.RegisterService(&s->services_->identity);
  builder.RegisterService(&s->services_->node);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on unix://", path));
  }
  spdlog::info("csi: {} for node {} on unix://{}, datasets from {}", kDriverName, options.node_id,
               path, options.mount_root);
  return s;
}

CsiServer::~CsiServer() { Shutdown(); }

void CsiServer::Wait() {
  if (server_) server_->Wait();
}

void CsiServer::Shutdown() {
  if (server_) server_->Shutdown();
}

}  // namespace ember::csinode
