// The CSI node plugin (`ember csi`, csi/csi_node.h) driven over its unix socket by a gRPC client,
// as kubelet drives it, against a real `ember meta` and `ember node` with a real FUSE mount:
// identity, node info, publish (inline ephemeral and static PV), reading the dataset through the
// target path, idempotency, unpublish, and the error codes.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "csi/csi.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/testing.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using ::csi::v1::VolumeCapability;
using testing::MetaProcess;
using testing::NodeProcess;
using testing::TempDir;

class CsiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "bind mounts need root";
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"));
    const std::string origin = dir_.Sub("origin");
    fs::create_directories(origin + "/train/a");
    testing::WriteRandomFile(origin + "/train/a/x.bin", 3 << 20, 7);
    testing::WriteFile(origin + "/README", "imagenet, the small kind\n");
    auto r = testing::RunEmber({"dataset", "add", "ds", origin, "--meta", meta_->address()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    origin_ = origin;
    node_ = std::make_unique<NodeProcess>(dir_.Sub("node"), meta_->address());
    ASSERT_TRUE(node_->Start());
    ASSERT_TRUE(testing::WaitFor([&] { return fs::exists(node_->mount() + "/ds/README"); }));
    socket_ = dir_.Sub("plugin/csi.sock");
    plugin_ = std::make_unique<testing::Process>(
        std::vector<std::string>{EMBER_BINARY, "csi", "--endpoint", "unix://" + socket_,
                                 "--node-id", "gpu-7", "--mount-root", node_->mount(), "--labels",
                                 "switch=s1,rack=r2"},
        dir_.Sub("csi"));
    auto channel = grpc::CreateChannel("unix://" + socket_, grpc::InsecureChannelCredentials());
    ASSERT_TRUE(
        channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20)))
        << plugin_->Stderr();
    identity_ = ::csi::v1::Identity::NewStub(channel);
    node_stub_ = ::csi::v1::Node::NewStub(channel);
  }
  void TearDown() override {
    for (const std::string& t : targets_) testing::ForceUnmount(t);
  }

  // A publish request as kubelet sends it for an inline volume with readOnly: true.
  ::csi::v1::NodePublishVolumeRequest Inline(const std::string& target,
                                             std::map<std::string, std::string> attrs) {
    ::csi::v1::NodePublishVolumeRequest req;
    req.set_volume_id("csi-5d6e1a3b2f");
    req.set_target_path(target);
    req.set_readonly(true);
    req.mutable_volume_capability()->mutable_mount();
    req.mutable_volume_capability()->mutable_access_mode()->set_mode(
        VolumeCapability::AccessMode::SINGLE_NODE_WRITER);  // what kubelet sends inline
    attrs["csi.storage.k8s.io/ephemeral"] = "true";
    attrs["csi.storage.k8s.io/pod.name"] = "trainer-0";
    for (auto& [k, v] : attrs) (*req.mutable_volume_context())[k] = v;
    targets_.push_back(target);
    return req;
  }
  grpc::Status Publish(const ::csi::v1::NodePublishVolumeRequest& req) {
    grpc::ClientContext ctx;
    ::csi::v1::NodePublishVolumeResponse out;
    return node_stub_->NodePublishVolume(&ctx, req, &out);
  }
  grpc::Status Unpublish(const std::string& target) {
    grpc::ClientContext ctx;
    ::csi::v1::NodeUnpublishVolumeRequest req;
    req.set_volume_id("csi-5d6e1a3b2f");
    req.set_target_path(target);
    ::csi::v1::NodeUnpublishVolumeResponse out;
    return node_stub_->NodeUnpublishVolume(&ctx, req, &out);
  }

  TempDir dir_;
  std::string origin_, socket_;
  std::unique_ptr<MetaProcess> meta_;
  std::unique_ptr<NodeProcess> node_;
  std::unique_ptr<testing::Process> plugin_;
  std::unique_ptr<::csi::v1::Identity::Stub> identity_;
  std::unique_ptr<::csi::v1::Node::Stub> node_stub_;
  std::vector<std::string> targets_;
};

TEST_F(CsiTest, IdentityAndNodeInfo) {
  {
    grpc::ClientContext ctx;
    ::csi::v1::GetPluginInfoResponse info;
    ASSERT_TRUE(identity_->GetPluginInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.name(), "csi.ember.io");
    EXPECT_FALSE(info.vendor_version().empty());
  }
  {
    grpc::ClientContext ctx;
    ::csi::v1::ProbeResponse probe;
    ASSERT_TRUE(identity_->Probe(&ctx, {}, &probe).ok());
    EXPECT_TRUE(probe.ready().value());
  }
  {
    grpc::ClientContext ctx;
    ::csi::v1::NodeGetInfoResponse info;
    ASSERT_TRUE(node_stub_->NodeGetInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.node_id(), "gpu-7");
    const auto& seg = info.accessible_topology().segments();
    EXPECT_EQ(seg.at("topology.ember.io/node"), "gpu-7");
    EXPECT_EQ(seg.at("topology.ember.io/switch"), "s1");
    EXPECT_EQ(seg.at("topology.ember.io/rack"), "r2");
  }
  {
    grpc::ClientContext ctx;
    ::csi::v1::NodeGetCapabilitiesResponse caps;
    ASSERT_TRUE(node_stub_->NodeGetCapabilities(&ctx, {}, &caps).ok());
    EXPECT_EQ(caps.capabilities_size(), 0);  // no staging
  }
  // The agent stops: the plugin is alive but not ready.
  ASSERT_TRUE(node_->Stop());
  grpc::ClientContext ctx;
  ::csi::v1::ProbeResponse probe;
  ASSERT_TRUE(identity_->Probe(&ctx, {}, &probe).ok());
  EXPECT_FALSE(probe.ready().value());
}

TEST_F(CsiTest, PublishReadUnpublish) {
  const std::string target = dir_.Sub("pods/p1/volumes/ds/mount");
  ASSERT_TRUE(Publish(Inline(target, {{"dataset", "ds"}})).ok());
  EXPECT_TRUE(testing::IsMounted(target));
  EXPECT_EQ(testing::ReadFile(target + "/train/a/x.bin"),
            testing::ReadFile(origin_ + "/train/a/x.bin"));
  EXPECT_EQ(testing::ReadFile(target + "/README"), "imagenet, the small kind\n");
  // Read-only, whatever the file system below would allow.
  errno = 0;
  EXPECT_EQ(::open((target + "/new").c_str(), O_CREAT | O_WRONLY, 0644), -1);
  EXPECT_EQ(errno, EROFS);
  // Publishing again is idempotent.
  ASSERT_TRUE(Publish(Inline(target, {{"dataset", "ds"}})).ok());
  // A sub-path and a version, at a second target.
  const std::string sub = dir_.Sub("pods/p2/volumes/ds/mount");
  ASSERT_TRUE(
      Publish(Inline(sub, {{"dataset", "ds"}, {"version", "1"}, {"path", "train/a"}})).ok());
  EXPECT_EQ(testing::ReadFile(sub + "/x.bin"), testing::ReadFile(origin_ + "/train/a/x.bin"));
  // Something else on the first target: ALREADY_EXISTS.
  EXPECT_EQ(Publish(Inline(target, {{"dataset", "ds"}, {"path", "train"}})).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  // Unpublish unmounts and removes the target; again is fine, as is a path never published.
  ASSERT_TRUE(Unpublish(target).ok());
  EXPECT_FALSE(testing::IsMounted(target));
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(Unpublish(target).ok());
  EXPECT_TRUE(Unpublish(dir_.Sub("pods/never/mount")).ok());
  ASSERT_TRUE(Unpublish(sub).ok());
  EXPECT_FALSE(fs::exists(sub));
}

TEST_F(CsiTest, StaticVolumeByHandle) {
  // A PV: volumeHandle ds@1, ReadOnlyMany, no attributes.
  ::csi::v1::NodePublishVolumeRequest req;
  req.set_volume_id("ds@1");
  req.set_target_path(dir_.Sub("pods/p3/volumes/pv/mount"));
  req.mutable_volume_capability()->mutable_mount();
  req.mutable_volume_capability()->mutable_access_mode()->set_mode(
      VolumeCapability::AccessMode::MULTI_NODE_READER_ONLY);
  targets_.push_back(req.target_path());
  ASSERT_TRUE(Publish(req).ok());
  EXPECT_EQ(testing::ReadFile(req.target_path() + "/README"), "imagenet, the small kind\n");
  ASSERT_TRUE(Unpublish(req.target_path()).ok());
}

TEST_F(CsiTest, ErrorCodes) {
  const std::string t = dir_.Sub("pods/bad/mount");
  auto code = [&](const ::csi::v1::NodePublishVolumeRequest& r) {
    grpc::Status s = Publish(r);
    EXPECT_FALSE(s.error_message().empty() && !s.ok());
    return s.error_code();
  };
  EXPECT_EQ(code(Inline(t, {{"dataset", "nope"}})), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code(Inline(t, {{"dataset", "ds"}, {"version", "9"}})), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code(Inline(t, {{"dataset", "ds"}, {"path", "train/missing"}})),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code(Inline(t, {{"dataset", "ds"}, {"path", "../../etc"}})),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(Inline(t, {{"dataset", "ds"}, {"path", "README"}})),
            grpc::StatusCode::INVALID_ARGUMENT);  // a file, not a folder
  EXPECT_EQ(code(Inline(t, {{"datset", "ds"}})), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(Inline(t, {})), grpc::StatusCode::INVALID_ARGUMENT);  // no dataset
  EXPECT_EQ(code(Inline(t, {{"dataset", "ds"}, {"version", "latest"}})),
            grpc::StatusCode::INVALID_ARGUMENT);
  auto writable = Inline(t, {{"dataset", "ds"}});
  writable.set_readonly(false);
  grpc::Status s = Publish(writable);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("read-only"), std::string::npos) << s.error_message();
  auto block = Inline(t, {{"dataset", "ds"}});
  block.mutable_volume_capability()->mutable_block();
  EXPECT_EQ(code(block), grpc::StatusCode::INVALID_ARGUMENT);
  auto relative = Inline("pods/rel", {{"dataset", "ds"}});
  EXPECT_EQ(code(relative), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(testing::IsMounted(t));
  // The agent gone: UNAVAILABLE, not NOT_FOUND.
  ASSERT_TRUE(node_->Stop());
  EXPECT_EQ(code(Inline(t, {{"dataset", "ds"}})), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace ember
