#include "common/metrics.h"

#include <gtest/gtest.h>

namespace ember::metrics {
namespace {

TEST(MetricsTest, RendersCountersCallbacksAndCumulativeHistograms) {
  Registry r;
  r.GetCounter("ember_x_total", "Things.", {{"op", "read"}})->Inc(3);
  r.GetCounter("ember_x_total", "Things.", {{"op", "read"}})->Inc();  // same series
  r.GetCounter("ember_x_total", "Things.", {{"op", "say \"hi\"\n"}})->Inc();
  r.SetCallback("ember_cache_bytes", "Bytes.", "gauge", {}, [] { return 1536.0; });
  Histogram* h = r.GetHistogram("ember_fill_seconds", "Fills.", {{"source", "peer"}});
  h->Observe(0.0003);  // bucket 0.0005
  h->Observe(0.002);   // bucket 0.0025
  h->Observe(100);     // +Inf
  std::string out = r.Render();
  EXPECT_NE(out.find("# HELP ember_x_total Things.\n# TYPE ember_x_total counter\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ember_x_total{op=\"read\"} 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ember_x_total{op=\"say \\\"hi\\\"\\n\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ember_cache_bytes 1536\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ember_fill_seconds_bucket{source=\"peer\",le=\"0.00025\"} 0\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ember_fill_seconds_bucket{source=\"peer\",le=\"0.0005\"} 1\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ember_fill_seconds_bucket{source=\"peer\",le=\"0.0025\"} 2\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ember_fill_seconds_bucket{source=\"peer\",le=\"60\"} 2\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find("ember_fill_seconds_bucket{source=\"peer\",le=\"+Inf\"} 3\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ember_fill_seconds_count{source=\"peer\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ember_fill_seconds_sum{source=\"peer\"} 100.0023"), std::string::npos) << out;
  // HELP/TYPE once per family.
  EXPECT_EQ(out.find("# TYPE ember_x_total"), out.rfind("# TYPE ember_x_total"));
  r.RemoveCallbacks("ember_cache_");
  EXPECT_EQ(r.Render().find("ember_cache_bytes"), std::string::npos);
}

}  // namespace
}  // namespace ember::metrics
