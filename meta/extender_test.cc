#include "meta/extender.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace ember::meta {
namespace {

using nlohmann::json;

ExtenderContext Ctx() {
  ExtenderContext c;
  c.fractions = [](const std::string& ds) -> std::optional<std::map<std::string, double>> {
    if (ds != "imagenet") return std::nullopt;
    return std::map<std::string, double>{{"gpu-1", 1.0}, {"gpu-2", 0.42}};
  };
  c.known = [](const std::string& n) { return n.rfind("gpu-", 0) == 0; };
  return c;
}

// Shaped as kube-scheduler sends it: a full v1 Pod and a v1 NodeList.
std::string Args(const std::string& annotations, bool names_only = false) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", "trainer-0"},
                {"namespace", "ml"},
                {"uid", "4f1c-..."},
                {"annotations", json::parse(annotations)}}},
              {"spec",
               {{"schedulerName", "default-scheduler"},
                {"containers",
                 {{{"name", "train"},
                   {"image", "trainer:1"},
                   {"resources", {{"limits", {{"nvidia.com/gpu", "8"}}}}}}}}}},
              {"status", {{"phase", "Pending"}}}};
  json nodes = {{"apiVersion", "v1"}, {"kind", "NodeList"}, {"items", json::array()}};
  for (const char* n : {"gpu-1", "gpu-2", "gpu-3", "cpu-9"}) {
    nodes["items"].push_back(
        {{"apiVersion", "v1"},
         {"kind", "Node"},
         {"metadata", {{"name", n}, {"labels", {{"kubernetes.io/hostname", n}}}}},
         {"status", {{"allocatable", {{"nvidia.com/gpu", "8"}}}}}});
  }
  json args = {{"Pod", pod}};
  if (names_only) {
    args["Nodes"] = nullptr;
    args["NodeNames"] = {"gpu-1", "gpu-2", "gpu-3", "cpu-9"};
  } else {
    args["Nodes"] = nodes;
    args["NodeNames"] = nullptr;
  }
  return args.dump();
}

TEST(ExtenderTest, RequiredModeFiltersNodesWithoutTheData) {
  json r = json::parse(ExtenderFilter(
      Args(R"({"ember.io/dataset":"imagenet","ember.io/data-mode":"required"})"), Ctx()));
  EXPECT_EQ(r["Error"], "");
  ASSERT_TRUE(r["Nodes"].is_object());
  ASSERT_EQ(r["Nodes"]["items"].size(), 1u);
  EXPECT_EQ(r["Nodes"]["items"][0]["metadata"]["name"], "gpu-1");
  EXPECT_EQ(r["Nodes"]["items"][0]["status"]["allocatable"]["nvidia.com/gpu"], "8");  // intact
  EXPECT_EQ(r["FailedNodes"].size(), 3u);
  EXPECT_NE(r["FailedNodes"]["gpu-2"].get<std::string>().find("42%"), std::string::npos);
  EXPECT_EQ(r["FailedNodes"]["cpu-9"], "not an Ember node");
  // A lower bar lets the partly warm node through; NodeNames in, NodeNames out.
  r = json::parse(ExtenderFilter(Args(R"({"ember.io/dataset":"imagenet",
      "ember.io/data-mode":"required","ember.io/min-locality":"0.4"})",
                                      true),
                                 Ctx()));
  EXPECT_EQ(r["NodeNames"], json({"gpu-1", "gpu-2"}));
  EXPECT_TRUE(r["Nodes"].is_null());
}

TEST(ExtenderTest, PreferredModeKeepsAllAndScoresByLocality) {
  std::string args = Args(R"({"ember.io/dataset":"imagenet"})");
  json f = json::parse(ExtenderFilter(args, Ctx()));
  EXPECT_EQ(f["Nodes"]["items"].size(), 4u);
  json p = json::parse(ExtenderPrioritize(args, Ctx()));
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0], json({{"Host", "gpu-1"}, {"Score", 10}}));
  EXPECT_EQ(p[1], json({{"Host", "gpu-2"}, {"Score", 4}}));
  EXPECT_EQ(p[2]["Score"], 0);
}

TEST(ExtenderTest, BadInputGetsValidAnswers) {
  json f = json::parse(ExtenderFilter("{not json", Ctx()));
  EXPECT_FALSE(f["Error"].get<std::string>().empty());
  EXPECT_TRUE(json::parse(ExtenderPrioritize("{not json", Ctx())).empty());
  EXPECT_TRUE(json::parse(ExtenderPrioritize("[1,2]", Ctx())).empty());
  // A pod without the annotation: nothing filtered, all scores 0.
  f = json::parse(ExtenderFilter(Args("{}"), Ctx()));
  EXPECT_EQ(f["Nodes"]["items"].size(), 4u);
  for (auto& h : json::parse(ExtenderPrioritize(Args("{}"), Ctx()))) EXPECT_EQ(h["Score"], 0);
  // Unknown dataset in required mode: an Error, not a crash.
  f = json::parse(ExtenderFilter(
      Args(R"({"ember.io/dataset":"nope","ember.io/data-mode":"required"})"), Ctx()));
  EXPECT_NE(f["Error"].get<std::string>().find("nope"), std::string::npos);
  // Odd shapes.
  for (const char* body : {"{}", R"({"Pod":5,"Nodes":{"items":7}})", R"({"NodeNames":[1,null]})",
                           "null", R"({"Nodes":{"items":[{"metadata":null},{}]}})"}) {
    json r = json::parse(ExtenderFilter(body, Ctx()));
    EXPECT_TRUE(r.contains("Error")) << body;
    EXPECT_TRUE(json::parse(ExtenderPrioritize(body, Ctx())).is_array()) << body;
  }
}

}  // namespace
}  // namespace ember::meta
