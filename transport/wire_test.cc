#include "transport/wire.h"

#include <gtest/gtest.h>

namespace ember::transport {
namespace {

Request SampleRequest() {
  Request q;
  q.request_id = 42;
  q.addr = {3, 2, 99, 7};
  q.id = MakeBlockId(q.addr);
  q.offset = 4096;
  q.length = 1 << 20;
  q.remote_addr = 0x7f0000001000;
  q.rkey = 77;
  return q;
}

TEST(WireTest, RequestRoundTrip) {
  Request q = SampleRequest();
  std::string f = EncodeRequest(q);
  ASSERT_EQ(f.size(), kRequestSize);
  EXPECT_EQ(ClientFrameSize(f.substr(0, kHeaderSize)), kRequestSize);
  auto d = DecodeRequest(f);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->request_id, 42u);
  EXPECT_EQ(d->addr, q.addr);
  EXPECT_EQ(d->offset, 4096u);
  EXPECT_EQ(d->length, 1u << 20);
  EXPECT_EQ(d->remote_addr, q.remote_addr);
  EXPECT_EQ(d->rkey, 77u);
}

TEST(WireTest, RequestRejectsBadInput) {
  std::string good = EncodeRequest(SampleRequest());
  std::string bad_magic = good;
  bad_magic[0] ^= 1;
  EXPECT_FALSE(DecodeRequest(bad_magic));
  EXPECT_EQ(ClientFrameSize(bad_magic.substr(0, kHeaderSize)), 0u);
  std::string bad_version = good;
  bad_version[4] = 9;
  EXPECT_FALSE(DecodeRequest(bad_version));
  EXPECT_FALSE(DecodeRequest(good.substr(0, good.size() - 1)));  // truncated
  EXPECT_FALSE(DecodeRequest(good + "x"));
  EXPECT_FALSE(DecodeRequest(EncodeResponse(Response())));  // wrong type
  Request big = SampleRequest();
  big.length = kMaxLength + 1;
  EXPECT_FALSE(DecodeRequest(EncodeRequest(big)));
  Request overflow = SampleRequest();
  overflow.offset = ~0ull - 10;
  EXPECT_FALSE(DecodeRequest(EncodeRequest(overflow)));
  Request mismatch = SampleRequest();
  mismatch.id.lo ^= 1;  // id does not match the address
  EXPECT_FALSE(DecodeRequest(EncodeRequest(mismatch)));
}

TEST(WireTest, OtherFramesRoundTrip) {
  Hello h;
  h.nonce = RandomNonce();
  h.flags = 1;
  auto hd = DecodeHello(EncodeHello(h));
  ASSERT_TRUE(hd);
  EXPECT_EQ(hd->nonce, h.nonce);
  EXPECT_EQ(hd->flags, 1u);
  Auth a;
  a.mac = TokenMac("secret", h.nonce);
  EXPECT_EQ(DecodeAuth(EncodeAuth(a))->mac, a.mac);
  EXPECT_EQ(DecodeAuthReply(EncodeAuthReply({WireStatus::kUnauthorized}))->status,
            WireStatus::kUnauthorized);
  Response r;
  r.status = WireStatus::kNotFound;
  r.request_id = 5;
  r.block_checksum = 0xabc;
  r.block_length = 100;
  auto rd = DecodeResponse(EncodeResponse(r));
  ASSERT_TRUE(rd);
  EXPECT_EQ(rd->status, WireStatus::kNotFound);
  EXPECT_EQ(rd->block_checksum, 0xabcu);
  std::string bad_status = EncodeResponse(r);
  bad_status[8] = 99;
  EXPECT_FALSE(DecodeResponse(bad_status));
  QpInfo q;
  q.qp_num = 1234;
  q.lid = 7;
  q.gid[15] = 9;
  q.psn = 0x123456;
  q.addr = 0x1000;
  q.rkey = 55;
  q.mtu = 5;
  auto qd = DecodeQpInfo(EncodeQpInfo(q));
  ASSERT_TRUE(qd);
  EXPECT_EQ(qd->qp_num, 1234u);
  EXPECT_EQ(qd->gid[15], 9);
  EXPECT_EQ(qd->psn, 0x123456u);
  q.link = 2;
  EXPECT_EQ(DecodeQpInfo(EncodeQpInfo(q))->link, 2u);
  q.link = 3;  // no such link layer
  EXPECT_FALSE(DecodeQpInfo(EncodeQpInfo(q)));
  q.link = 1;
  q.mtu = 9;
  EXPECT_FALSE(DecodeQpInfo(EncodeQpInfo(q)));
}

TEST(WireTest, TokenMacBindsTokenAndNonce) {
  auto n1 = RandomNonce(), n2 = RandomNonce();
  EXPECT_NE(n1, n2);
  EXPECT_TRUE(MacEqual(TokenMac("t", n1), TokenMac("t", n1)));
  EXPECT_FALSE(MacEqual(TokenMac("t", n1), TokenMac("u", n1)));
  EXPECT_FALSE(MacEqual(TokenMac("t", n1), TokenMac("t", n2)));
}

}  // namespace
}  // namespace ember::transport
