#include "meta/admission.h"

#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ember::meta {
namespace {

using nlohmann::json;

constexpr char kHostname[] = "kubernetes.io/hostname";
constexpr char kVolumeName[] = "ember-dataset";
constexpr char kNodeAffinity[] = "/spec/affinity/nodeAffinity";
constexpr int kWeightHolder = 100, kWeightSwitch = 50, kWeightRack = 20;

std::string Str(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

const json* Object(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? &*it : nullptr;
}

const json* Array(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it != j.end() && it->is_array() ? &*it : nullptr;
}

json Op(const std::string& path, json value) {
  return {{"op", "add"}, {"path", path}, {"value", std::move(value)}};
}

json HostIn(const std::set<std::string>& nodes) {
  return {{"key", kHostname}, {"operator", "In"}, {"values", nodes}};
}

// Where the pod's annotations ask for: the dataset's holders and their neighbours.
struct Tiers {
  std::set<std::string> holders, same_switch, same_rack;
};

Tiers Place(const std::map<std::string, double>& fractions, double min_locality,
            const std::map<std::string, std::map<std::string, std::string>>& labels) {
  Tiers t;
  for (const auto& [node, f] : fractions) {
    if (f > 0 && f >= min_locality) t.holders.insert(node);
  }
  std::set<std::string> switches, racks;
  for (const std::string& h : t.holders) {
    auto it = labels.find(h);
    if (it == labels.end()) continue;
    if (auto s = it->second.find("switch"); s != it->second.end()) switches.insert(s->second);
    if (auto r = it->second.find("rack"); r != it->second.end()) racks.insert(r->second);
  }
  for (const auto& [node, l] : labels) {
    if (t.holders.count(node)) continue;
    auto s = l.find("switch");
    auto r = l.find("rack");
    if (s != l.end() && switches.count(s->second)) {
      t.same_switch.insert(node);
    } else if (r != l.end() && racks.count(r->second)) {
      t.same_rack.insert(node);
    }
  }
  return t;
}

// Preferred terms, highest tier first; appended to what the pod has.
void Prefer(const json& spec, const Tiers& t, json* ops) {
  json terms = json::array();
  auto term = [&](int weight, const std::set<std::string>& nodes) {
    if (!nodes.empty()) {
      terms.push_back(
          {{"weight", weight}, {"preference", {{"matchExpressions", {HostIn(nodes)}}}}});
    }
  };
  term(kWeightHolder, t.holders);
  term(kWeightSwitch, t.same_switch);
  term(kWeightRack, t.same_rack);
  if (terms.empty()) return;
  const json* affinity = Object(spec, "affinity");
  const json* na = affinity != nullptr ? Object(*affinity, "nodeAffinity") : nullptr;
  if (affinity == nullptr) {
    ops->push_back(
        Op("/spec/affinity",
           {{"nodeAffinity", {{"preferredDuringSchedulingIgnoredDuringExecution", terms}}}}));
  } else if (na == nullptr) {
    ops->push_back(Op(kNodeAffinity, {{"preferredDuringSchedulingIgnoredDuringExecution", terms}}));
  } else if (Array(*na, "preferredDuringSchedulingIgnoredDuringExecution") == nullptr) {
    ops->push_back(
        Op(absl::StrCat(kNodeAffinity, "/preferredDuringSchedulingIgnoredDuringExecution"), terms));
  } else {
    for (const json& x : terms) {
      ops->push_back(
          Op(absl::StrCat(kNodeAffinity, "/preferredDuringSchedulingIgnoredDuringExecution/-"), x));
    }
  }
}

// The holders as a requirement, ANDed into every term the pod already requires.
void Require(const json& spec, const std::set<std::string>& holders, json* ops) {
  const json expr = HostIn(holders);
  const json fresh = {{"nodeSelectorTerms", {{{"matchExpressions", {expr}}}}}};
  const json* affinity = Object(spec, "affinity");
  const json* na = affinity != nullptr ? Object(*affinity, "nodeAffinity") : nullptr;
  const json* req =
      na != nullptr ? Object(*na, "requiredDuringSchedulingIgnoredDuringExecution") : nullptr;
  const json* terms = req != nullptr ? Array(*req, "nodeSelectorTerms") : nullptr;
  if (affinity == nullptr) {
    ops->push_back(
        Op("/spec/affinity",
           {{"nodeAffinity", {{"requiredDuringSchedulingIgnoredDuringExecution", fresh}}}}));
  } else if (na == nullptr) {
    ops->push_back(Op(kNodeAffinity, {{"requiredDuringSchedulingIgnoredDuringExecution", fresh}}));
  } else if (terms == nullptr || terms->empty()) {
    ops->push_back(
        Op(absl::StrCat(kNodeAffinity, "/requiredDuringSchedulingIgnoredDuringExecution"), fresh));
  } else {
    for (size_t i = 0; i < terms->size(); i++) {
      const std::string at = absl::StrCat(
          kNodeAffinity, "/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/", i,
          "/matchExpressions");
      if (Array((*terms)[i], "matchExpressions") != nullptr) {
        ops->push_back(Op(at + "/-", expr));
      } else {
        ops->push_back(Op(at, json::array({expr})));
      }
    }
  }
}

// The dataset as a CSI inline volume, mounted at `path` in every container.
void Mount(const json& spec, const std::string& dataset, const std::string& version,
           const std::string& path, json* ops) {
  if (const json* vols = Array(spec, "volumes")) {
    for (const json& v : *vols) {
      if (Str(v, "name") == kVolumeName) return;  // already there (a second pass)
    }
  }
  json attrs = {{"dataset", dataset}};
  if (!version.empty()) attrs["version"] = version;
  const json vol = {
      {"name", kVolumeName},
      {"csi", {{"driver", "csi.ember.io"}, {"readOnly", true}, {"volumeAttributes", attrs}}}};
  if (Array(spec, "volumes") != nullptr) {
    ops->push_back(Op("/spec/volumes/-", vol));
  } else {
    ops->push_back(Op("/spec/volumes", json::array({vol})));
  }
  const json mount = {{"name", kVolumeName}, {"mountPath", path}, {"readOnly", true}};
  for (const char* kind : {"initContainers", "containers"}) {
    const json* cs = Array(spec, kind);
    if (cs == nullptr) continue;
    for (size_t i = 0; i < cs->size(); i++) {
      const std::string at = absl::StrCat("/spec/", kind, "/", i, "/volumeMounts");
      if (const json* mounts = Array((*cs)[i], "volumeMounts")) {
        bool taken = false;
        for (const json& m : *mounts) taken |= Str(m, "mountPath") == path;
        if (!taken) ops->push_back(Op(at + "/-", mount));
      } else {
        ops->push_back(Op(at, json::array({mount})));
      }
    }
  }
}

}  // namespace

std::string AdmissionMutate(const std::string& body, const AdmissionContext& ctx) {
  json response = {{"uid", ""}, {"allowed", true}};
  std::vector<std::string> warnings;
  json ops = json::array();
  auto answer = [&] {
    if (!warnings.empty()) response["warnings"] = warnings;
    if (!ops.empty()) {
      response["patchType"] = "JSONPatch";
      response["patch"] = absl::Base64Escape(ops.dump());
    }
    return json{
        {"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"response", response}}
        .dump();
  };
  const json review = json::parse(body, nullptr, /*allow_exceptions=*/false);
  const json* request = review.is_discarded() ? nullptr : Object(review, "request");
  if (request == nullptr) {
    warnings.push_back(
        "ember webhook: the body is not an AdmissionReview; the pod was not changed");
    return answer();
  }
  response["uid"] = Str(*request, "uid");
  const json* kind = Object(*request, "kind");
  if (kind != nullptr && Str(*kind, "kind") != "Pod") return answer();  // only pods are placed
  const json* pod = Object(*request, "object");
  const json* md = pod != nullptr ? Object(*pod, "metadata") : nullptr;
  const json* ann = md != nullptr ? Object(*md, "annotations") : nullptr;
  const std::string dataset = ann != nullptr ? Str(*ann, "ember.io/dataset") : "";
  if (dataset.empty()) return answer();  // not ours
  const json* spec = Object(*pod, "spec");
  if (spec == nullptr) {
    warnings.push_back("ember webhook: the pod has no spec; it was not changed");
    return answer();
  }
  const bool required = Str(*ann, "ember.io/data-mode") == "required";
  double min_locality = 1.0;
  if (std::string min = Str(*ann, "ember.io/min-locality"); !min.empty()) {
    char* end = nullptr;
    const double v = std::strtod(min.c_str(), &end);
    if (end != min.c_str() && *end == '\0' && v >= 0 && v <= 1) {
      min_locality = v;
    } else {
      warnings.push_back(absl::StrCat("ember webhook: ember.io/min-locality '", min,
                                      "' is not a number in [0, 1]; using 1.0"));
    }
  }
  const auto fractions = ctx.fractions(dataset);
  if (!fractions) {
    warnings.push_back(absl::StrCat("ember webhook: dataset '", dataset,
                                    "' is not known to Ember; placed without cache locality"));
  } else {
    std::map<std::string, std::map<std::string, std::string>> labels;
    if (ctx.labels) labels = ctx.labels();
    const Tiers t = Place(*fractions, min_locality, labels);
    if (required && t.holders.empty()) {
      warnings.push_back(absl::StrCat("ember webhook: no live node holds ", min_locality * 100,
                                      "% of dataset '", dataset,
                                      "' yet (run `ember prefetch`); the pod is not restricted"));
    } else if (required) {
      Require(*spec, t.holders, &ops);
    } else {
      Prefer(*spec, t, &ops);
    }
  }
  const std::string path = Str(*ann, "ember.io/mount-path");
  if (!path.empty()) {
    if (path[0] != '/') {
      warnings.push_back(absl::StrCat("ember webhook: ember.io/mount-path '", path,
                                      "' is not an absolute path; no volume added"));
    } else {
      Mount(*spec, dataset, Str(*ann, "ember.io/version"), path, &ops);
    }
  }
  return answer();
}

}  // namespace ember::meta
