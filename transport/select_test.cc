// Transport selection, in builds with and without the RDMA unit (EMBER_RDMA_BUILT).
#include <gtest/gtest.h>

#include "transport/block_transport.h"

namespace ember::transport {
namespace {

TEST(SelectTransportTest, ParsesModes) {
  EXPECT_EQ(*ParseTransportMode("auto"), TransportMode::kAuto);
  EXPECT_EQ(*ParseTransportMode("tcp"), TransportMode::kTcp);
  EXPECT_EQ(*ParseTransportMode("rdma"), TransportMode::kRdma);
  EXPECT_EQ(ParseTransportMode("infiniband").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SelectTransportTest, AutoAndRdmaAgreeAndSayWhy) {
  TransportOptions o;
  std::string why;
  auto tcp = SelectTransport(TransportMode::kTcp, o, &why);
  ASSERT_TRUE(tcp.ok());
  EXPECT_STREQ((*tcp)->name(), "tcp");
  auto t = SelectTransport(TransportMode::kAuto, o, &why);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(why.empty());
  bool rdma_active = std::string((*t)->name()) == "rdma";
  auto rdma = SelectTransport(TransportMode::kRdma, o, &why);
  EXPECT_EQ(rdma.ok(), rdma_active);
  if (!rdma_active) {
    EXPECT_EQ(rdma.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(rdma.status().message().find("--transport rdma"), std::string::npos);
  }
}

#if !EMBER_RDMA_BUILT
TEST(SelectTransportTest, WithoutRdmaBuiltInAutoIsTcpAndRdmaSaysSo) {
  TransportOptions o;
  std::string why;
  auto t = SelectTransport(TransportMode::kAuto, o, &why);
  ASSERT_TRUE(t.ok());
  EXPECT_STREQ((*t)->name(), "tcp");
  EXPECT_NE(why.find("not built in"), std::string::npos) << why;
  auto rdma = SelectTransport(TransportMode::kRdma, o, &why);
  ASSERT_FALSE(rdma.ok());
  EXPECT_NE(rdma.status().message().find("EMBER_RDMA=OFF"), std::string::npos) << rdma.status();
}
#endif

}  // namespace
}  // namespace ember::transport
