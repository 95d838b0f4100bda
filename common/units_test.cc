#include "common/units.h"

#include <gtest/gtest.h>

namespace ember {
namespace {

TEST(ParseSizeTest, Units) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("4M"), 4u << 20);
  EXPECT_EQ(*ParseSize("4MiB"), 4u << 20);
  EXPECT_EQ(*ParseSize("64k"), 64u << 10);
  EXPECT_EQ(*ParseSize("1.5G"), 3ull << 29);
  EXPECT_EQ(*ParseSize("2TiB"), 2ull << 40);
  EXPECT_EQ(*ParseSize("10MB"), 10'000'000u);
  EXPECT_EQ(*ParseSize(" 7 b "), 7u);
}

TEST(ParseSizeTest, Rejects) {
  for (const char* bad : {"", "4X", "M", "-1", "1.3", "4 MiBs", "99999999999999999999T", "1e6"}) {
    auto r = ParseSize(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_NE(ParseSize("4X").status().message().find("'4X'"), std::string::npos);
}

TEST(ParseDurationTest, Units) {
  using std::chrono::milliseconds;
  EXPECT_EQ(*ParseDuration("30s"), milliseconds(30'000));
  EXPECT_EQ(*ParseDuration("1h30m"), milliseconds(5'400'000));
  EXPECT_EQ(*ParseDuration("500ms"), milliseconds(500));
  EXPECT_EQ(*ParseDuration("2d"), milliseconds(172'800'000));
  EXPECT_EQ(*ParseDuration("1.5s"), milliseconds(1500));
  EXPECT_EQ(*ParseDuration("10"), milliseconds(10'000));
}

TEST(ParseDurationTest, Rejects) {
  for (const char* bad : {"", "s", "10x", "-5s", "1h30", "abc", "99999999999999d"}) {
    EXPECT_FALSE(ParseDuration(bad).ok()) << bad;
  }
}

TEST(FormatBytesTest, Readable) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(112 << 10), "112.0 KiB");
  EXPECT_EQ(FormatBytes(3ull << 29), "1.5 GiB");
}

}  // namespace
}  // namespace ember
