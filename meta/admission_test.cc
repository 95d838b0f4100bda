#include "meta/admission.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"

namespace ember::meta {
namespace {

using nlohmann::json;

// gpu-1 holds all of imagenet, gpu-2 42%; gpu-2 shares gpu-1's switch, gpu-3 only its rack,
// gpu-4 neither. "empty" is a dataset nobody holds.
AdmissionContext Ctx() {
  AdmissionContext c;
  c.fractions = [](const std::string& ds) -> std::optional<std::map<std::string, double>> {
    if (ds == "empty") return std::map<std::string, double>{{"gpu-1", 0.0}};
    if (ds != "imagenet") return std::nullopt;
    return std::map<std::string, double>{{"gpu-1", 1.0}, {"gpu-2", 0.42}, {"gpu-3", 0.0}};
  };
  c.labels = [] {
    return std::map<std::string, std::map<std::string, std::string>>{
        {"gpu-1", {{"switch", "s1"}, {"rack", "r1"}}},
        {"gpu-2", {{"switch", "s1"}, {"rack", "r2"}}},
        {"gpu-3", {{"switch", "s2"}, {"rack", "r1"}}},
        {"gpu-4", {{"switch", "s3"}, {"rack", "r9"}}}};
  };
  return c;
}

json Pod(const json& annotations, const json& spec_extra = json::object()) {
  json spec = {{"containers", {{{"name", "train"}, {"image", "trainer:1"}}}}};
  spec.update(spec_extra);
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"generateName", "trainer-"}, {"namespace", "ml"}, {"annotations", annotations}}},
          {"spec", spec}};
}

// As the API server sends it for a pod CREATE.
std::string Review(const json& pod, const std::string& kind = "Pod") {
  return json{{"apiVersion", "admission.k8s.io/v1"},
              {"kind", "AdmissionReview"},
              {"request",
               {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
                {"kind", {{"group", ""}, {"version", "v1"}, {"kind", kind}}},
                {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
                {"namespace", "ml"},
                {"operation", "CREATE"},
                {"userInfo", {{"username", "system:serviceaccount:ml:trainer"}}},
                {"object", pod},
                {"oldObject", nullptr},
                {"dryRun", false}}}}
      .dump();
}

struct Answer {
  json response;
  json patched;  // the pod with the patch applied
  std::vector<std::string> warnings;
};

Answer Mutate(const json& pod, const std::string& kind = "Pod") {
  const json review = json::parse(AdmissionMutate(Review(pod, kind), Ctx()));
  EXPECT_EQ(review["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(review["kind"], "AdmissionReview");
  Answer a;
  a.response = review["response"];
  EXPECT_EQ(a.response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_EQ(a.response["allowed"], true);
  a.patched = pod;
  if (a.response.contains("patch")) {
    EXPECT_EQ(a.response["patchType"], "JSONPatch");
    std::string ops;
    EXPECT_TRUE(absl::Base64Unescape(a.response["patch"].get<std::string>(), &ops));
    a.patched = pod.patch(json::parse(ops));  // throws if an op does not apply
  }
  if (a.response.contains("warnings")) a.warnings = a.response["warnings"];
  return a;
}

json Hosts(std::initializer_list<const char*> names) {
  return {{{"key", "kubernetes.io/hostname"}, {"operator", "In"}, {"values", names}}};
}

TEST(AdmissionTest, PodsWithoutTheAnnotationPassUntouched) {
  Answer a = Mutate(Pod({{"team", "vision"}}));
  EXPECT_FALSE(a.response.contains("patch"));
  EXPECT_TRUE(a.warnings.empty());
  // Not a pod at all: untouched too.
  a = Mutate(Pod({{"ember.io/dataset", "imagenet"}}), "Deployment");
  EXPECT_FALSE(a.response.contains("patch"));
}

TEST(AdmissionTest, PreferredAffinityByCacheTier) {
  Answer a = Mutate(Pod({{"ember.io/dataset", "imagenet"}}));
  const json& pref = a.patched["spec"]["affinity"]["nodeAffinity"]
                              ["preferredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(pref.size(), 3u) << pref.dump();
  EXPECT_EQ(pref[0]["weight"], 100);
  EXPECT_EQ(pref[0]["preference"]["matchExpressions"], Hosts({"gpu-1"}));  // holds it all
  EXPECT_EQ(pref[1]["weight"], 50);
  EXPECT_EQ(pref[1]["preference"]["matchExpressions"], Hosts({"gpu-2"}));  // same switch
  EXPECT_EQ(pref[2]["weight"], 20);
  EXPECT_EQ(pref[2]["preference"]["matchExpressions"], Hosts({"gpu-3"}));  // same rack
  EXPECT_FALSE(a.patched["spec"]["affinity"]["nodeAffinity"].contains(
      "requiredDuringSchedulingIgnoredDuringExecution"));
  // A lower threshold makes gpu-2 a holder.
  a = Mutate(Pod({{"ember.io/dataset", "imagenet"}, {"ember.io/min-locality", "0.4"}}));
  EXPECT_EQ(a.patched["spec"]["affinity"]["nodeAffinity"]
                     ["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]
                     ["matchExpressions"],
            Hosts({"gpu-1", "gpu-2"}));
}

TEST(AdmissionTest, PreferredTermsAreAppendedToThePodsOwn) {
  json own = {{"weight", 5}, {"preference", {{"matchExpressions", Hosts({"cpu-9"})}}}};
  json extra = {{"affinity",
                 {{"nodeAffinity", {{"preferredDuringSchedulingIgnoredDuringExecution", {own}}}},
                  {"podAntiAffinity", json::object()}}}};
  Answer a = Mutate(Pod({{"ember.io/dataset", "imagenet"}}, extra));
  const json& pref = a.patched["spec"]["affinity"]["nodeAffinity"]
                              ["preferredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(pref.size(), 4u);
  EXPECT_EQ(pref[0], own);
  EXPECT_EQ(pref[1]["weight"], 100);
  EXPECT_TRUE(a.patched["spec"]["affinity"].contains("podAntiAffinity"));
}

TEST(AdmissionTest, RequiredModeAndsTheHoldersIntoEveryTerm) {
  json ann = {{"ember.io/dataset", "imagenet"}, {"ember.io/data-mode", "required"}};
  Answer a = Mutate(Pod(ann));
  EXPECT_EQ(a.patched["spec"]["affinity"]["nodeAffinity"]
                     ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
            json::array({{{"matchExpressions", Hosts({"gpu-1"})}}}));
  // The pod's own terms are ORed by Kubernetes: each gets the holders, none is added.
  json zone = {{"key", "topology.kubernetes.io/zone"}, {"operator", "In"}, {"values", {"a"}}};
  json extra = {{"affinity",
                 {{"nodeAffinity",
                   {{"requiredDuringSchedulingIgnoredDuringExecution",
                     {{"nodeSelectorTerms",
                       {{{"matchExpressions", {zone}}}, {{"matchFields", json::array()}}}}}}}}}}};
  a = Mutate(Pod(ann, extra));
  const json& terms =
      a.patched["spec"]["affinity"]["nodeAffinity"]
               ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
  ASSERT_EQ(terms.size(), 2u);
  EXPECT_EQ(terms[0]["matchExpressions"], json::array({zone, Hosts({"gpu-1"})[0]}));
  EXPECT_EQ(terms[1]["matchExpressions"], Hosts({"gpu-1"}));
  EXPECT_TRUE(terms[1].contains("matchFields"));
}

TEST(AdmissionTest, RequiredWithNoHolderWarnsAndDoesNotRestrict) {
  Answer a = Mutate(Pod({{"ember.io/dataset", "empty"}, {"ember.io/data-mode", "required"}}));
  EXPECT_FALSE(a.response.contains("patch"));
  ASSERT_EQ(a.warnings.size(), 1u);
  EXPECT_NE(a.warnings[0].find("no live node holds"), std::string::npos) << a.warnings[0];
}

TEST(AdmissionTest, UnknownDatasetIsAllowedWithAWarning) {
  Answer a = Mutate(Pod({{"ember.io/dataset", "nope"}, {"ember.io/min-locality", "lots"}}));
  EXPECT_FALSE(a.response.contains("patch"));
  ASSERT_EQ(a.warnings.size(), 2u);
  EXPECT_NE(a.warnings[0].find("min-locality"), std::string::npos);
  EXPECT_NE(a.warnings[1].find("'nope' is not known"), std::string::npos);
}

TEST(AdmissionTest, MountPathAddsTheDatasetVolumeToEveryContainer) {
  json extra = {{"containers",
                 {{{"name", "train"}, {"image", "t:1"}},
                  {{"name", "side"},
                   {"image", "s:1"},
                   {"volumeMounts", {{{"name", "scratch"}, {"mountPath", "/scratch"}}}}}}},
                {"volumes", {{{"name", "scratch"}, {"emptyDir", json::object()}}}}};
  Answer a = Mutate(Pod({{"ember.io/dataset", "imagenet"},
                         {"ember.io/version", "3"},
                         {"ember.io/mount-path", "/data"}},
                        extra));
  const json& vols = a.patched["spec"]["volumes"];
  ASSERT_EQ(vols.size(), 2u);
  EXPECT_EQ(vols[1]["csi"]["driver"], "csi.ember.io");
  EXPECT_EQ(vols[1]["csi"]["readOnly"], true);
  EXPECT_EQ(vols[1]["csi"]["volumeAttributes"], json({{"dataset", "imagenet"}, {"version", "3"}}));
  for (const json& c : a.patched["spec"]["containers"]) {
    const json& m = c["volumeMounts"].back();
    EXPECT_EQ(m["name"], vols[1]["name"]);
    EXPECT_EQ(m["mountPath"], "/data");
    EXPECT_EQ(m["readOnly"], true);
  }
  EXPECT_EQ(a.patched["spec"]["containers"][1]["volumeMounts"].size(), 2u);
  // Not absolute: warned, no volume.
  a = Mutate(Pod({{"ember.io/dataset", "imagenet"}, {"ember.io/mount-path", "data"}}));
  EXPECT_FALSE(a.patched["spec"].contains("volumes"));
  EXPECT_EQ(a.warnings.size(), 1u);
}

TEST(AdmissionTest, MalformedReviewsGetAnAllowedAnswer) {
  for (const std::string& body :
       {std::string("garbage{"), std::string("[]"), std::string("{\"request\": 7}"),
        std::string("{\"request\": {\"uid\": \"u1\", \"object\": {\"metadata\": {\"annotations\": "
                    "{\"ember.io/dataset\": \"imagenet\"}}}}}"),
        std::string()}) {
    const json review = json::parse(AdmissionMutate(body, Ctx()), nullptr, false);
    ASSERT_FALSE(review.is_discarded()) << body;
    EXPECT_EQ(review["kind"], "AdmissionReview");
    EXPECT_EQ(review["response"]["allowed"], true) << body;
    EXPECT_FALSE(review["response"].contains("patch")) << body;
    EXPECT_FALSE(review["response"]["warnings"].empty()) << body;
  }
}

}  // namespace
}  // namespace ember::meta
