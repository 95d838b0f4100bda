#include "meta/checksum_ledger.h"

#include <gtest/gtest.h>

#include "meta/meta_client.h"
#include "meta/store_fixture_test.h"

namespace ember::meta {
namespace {

using ChecksumLedgerTest = StoreFixture;

void Add(rpc::RecordChecksumsRequest* req, const BlockAddr& a, uint64_t sum) {
  auto* c = req->add_checksums();
  *c->mutable_block() = ToProto(a);
  c->set_checksum(sum);
}

TEST_F(ChecksumLedgerTest, FirstWriterWinsAndLaterValuesConflict) {
  ChecksumLedger ledger(store_.get());
  const BlockAddr a{1, 1, 2, 0}, b{1, 1, 2, 1};
  rpc::RecordChecksumsRequest first;
  Add(&first, a, 11);
  Add(&first, a, 12);  // the same block twice in one batch: the first value holds
  rpc::RecordChecksumsResponse resp;
  ASSERT_TRUE(ledger.Record(first, &resp).ok());
  ASSERT_EQ(resp.conflict_size(), 2);
  EXPECT_FALSE(resp.conflict(0));
  EXPECT_TRUE(resp.conflict(1));
  EXPECT_EQ(resp.recorded(1).checksum(), 11u);

  rpc::RecordChecksumsRequest second;
  Add(&second, a, 13);
  Add(&second, b, 21);
  ASSERT_TRUE(ledger.Record(second, &resp).ok());
  EXPECT_TRUE(resp.conflict(0));
  EXPECT_EQ(resp.recorded(0).checksum(), 11u);
  EXPECT_FALSE(resp.conflict(1));

  // Asked for conflicts only (what nodes ask): the same verdicts, no checksums sent back.
  rpc::RecordChecksumsRequest third;
  third.set_conflicts_only(true);
  Add(&third, a, 14);
  Add(&third, b, 21);
  Add(&third, BlockAddr{1, 1, 2, 3}, 31);
  ASSERT_TRUE(ledger.Record(third, &resp).ok());
  ASSERT_EQ(resp.conflict_size(), 3);
  EXPECT_TRUE(resp.conflict(0));
  EXPECT_FALSE(resp.conflict(1));
  EXPECT_FALSE(resp.conflict(2));
  EXPECT_EQ(resp.recorded_size(), 0);

  auto got = ledger.Get({a, b, BlockAddr{1, 1, 2, 2}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0], 11u);
  EXPECT_EQ((*got)[1], 21u);
  EXPECT_FALSE((*got)[2].has_value());
}

TEST_F(ChecksumLedgerTest, ARefusedWriteRecordsNothing) {
  Open(/*full=*/true);
  ChecksumLedger ledger(store_.get());
  rpc::RecordChecksumsRequest req;
  Add(&req, BlockAddr{1, 1, 2, 0}, 11);
  rpc::RecordChecksumsResponse resp;
  EXPECT_EQ(ledger.Record(req, &resp).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(resp.conflict_size(), 0);
  Open();
  ChecksumLedger after(store_.get());
  EXPECT_FALSE((*after.Get({BlockAddr{1, 1, 2, 0}}))[0].has_value());
}

}  // namespace
}  // namespace ember::meta
