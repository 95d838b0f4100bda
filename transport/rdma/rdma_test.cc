// The RDMA unit: device choice, selection against a real probe, and the verbs data path where a
// device exists.
#include <gtest/gtest.h>

#include <cstring>

#include "transport/block_transport.h"
#include "transport/rdma/verbs.h"

namespace ember::transport {
namespace {

TEST(RdmaSelectionTest, ChoosesFirstActivePort) {
  std::string why;
  EXPECT_FALSE(ChooseRdmaDevice({}, &why));
  EXPECT_EQ(why, "no RDMA device found");
  std::vector<RdmaDeviceInfo> down = {{"mlx5_0", 1, false, false}};
  EXPECT_FALSE(ChooseRdmaDevice(down, &why));
  EXPECT_NE(why.find("none active"), std::string::npos);
  std::vector<RdmaDeviceInfo> mixed = {{"mlx5_0", 1, false, false}, {"mlx5_1", 2, true, true}};
  auto d = ChooseRdmaDevice(mixed, &why);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "mlx5_1");
  EXPECT_EQ(d->port, 2);
  EXPECT_NE(why.find("RoCE"), std::string::npos);
}

TEST(RdmaSelectionTest, AutoFallsBackToTcpWithAReason) {
  std::string error, why;
  bool have_device = ChooseRdmaDevice(ProbeRdmaDevices(&error), &why).has_value();
  TransportOptions o;
  auto t = SelectTransport(TransportMode::kAuto, o, &why);
  ASSERT_TRUE(t.ok());
  EXPECT_STREQ((*t)->name(), have_device ? "rdma" : "tcp");
  EXPECT_FALSE(why.empty());
  auto tcp = SelectTransport(TransportMode::kTcp, o, &why);
  EXPECT_STREQ((*tcp)->name(), "tcp");
  auto rdma = SelectTransport(TransportMode::kRdma, o, &why);
  EXPECT_EQ(rdma.ok(), have_device);
  if (!have_device) {
    EXPECT_NE(rdma.status().message().find("--transport rdma"), std::string::npos);
  }
}

// The data path needs a verbs device with an active port (none on machines without InfiniBand
// or RoCE, such as CI here).
TEST(RdmaDataTest, LoopbackWriteBetweenTwoQueuePairs) {
  std::string error, why;
  auto device = ChooseRdmaDevice(ProbeRdmaDevices(&error), &why);
  if (!device) GTEST_SKIP() << "no RDMA device: " << why;
  auto a = RdmaEndpoint::Create(*device, 1 << 20);
  auto b = RdmaEndpoint::Create(*device, 1 << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Connect((*b)->local()).ok());
  ASSERT_TRUE((*b)->Connect((*a)->local()).ok());
  std::memset((*a)->buffer(), 'r', 4096);
  ASSERT_TRUE(
      (*a)->WriteTo(4096, (*b)->local().addr, (*b)->local().rkey, std::chrono::seconds(5)).ok());
  EXPECT_EQ(std::string((*b)->buffer(), 4096), std::string(4096, 'r'));
}

}  // namespace
}  // namespace ember::transport
