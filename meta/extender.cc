#include "meta/extender.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

namespace ember::meta {
namespace {

using nlohmann::json;

struct Parsed {
  std::string error;
  std::string dataset;
  bool required = false;
  double min_locality = 1.0;
  bool have_items = false;
  std::vector<json> items;         // node objects when "Nodes" was given
  std::vector<std::string> names;  // node names, in input order
};

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

Parsed Parse(const std::string& body) {
  Parsed p;
  json args = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded() || !args.is_object()) {
    p.error = "request body is not a JSON object";
    return p;
  }
  const json* pod = args.contains("Pod") && args["Pod"].is_object() ? &args["Pod"] : nullptr;
  if (pod != nullptr && pod->contains("metadata") && (*pod)["metadata"].is_object()) {
    const json& md = (*pod)["metadata"];
    if (md.contains("annotations") && md["annotations"].is_object()) {
      const json& a = md["annotations"];
      p.dataset = Str(a, "ember.io/dataset");
      p.required = Str(a, "ember.io/data-mode") == "required";
      std::string min = Str(a, "ember.io/min-locality");
      if (!min.empty()) {
        char* end = nullptr;
        double v = std::strtod(min.c_str(), &end);
        if (end != min.c_str() && *end == '\0' && v >= 0 && v <= 1) p.min_locality = v;
      }
    }
  }
  if (args.contains("Nodes") && args["Nodes"].is_object() && args["Nodes"].contains("items") &&
      args["Nodes"]["items"].is_array()) {
    p.have_items = true;
    for (const auto& n : args["Nodes"]["items"]) {
      std::string name = n.is_object() && n.contains("metadata") && n["metadata"].is_object()
                             ? Str(n["metadata"], "name")
                             : "";
      if (name.empty()) continue;
      p.items.push_back(n);
      p.names.push_back(name);
    }
  } else if (args.contains("NodeNames") && args["NodeNames"].is_array()) {
    for (const auto& n : args["NodeNames"]) {
      if (n.is_string()) p.names.push_back(n.get<std::string>());
    }
  }
  return p;
}

}  // namespace

std::string ExtenderFilter(const std::string& body, const ExtenderContext& ctx) {
  Parsed p = Parse(body);
  json out = {{"Nodes", nullptr},
              {"NodeNames", nullptr},
              {"FailedNodes", json::object()},
              {"Error", p.error}};
  if (!p.error.empty()) return out.dump();
  std::optional<std::map<std::string, double>> fr;
  if (!p.dataset.empty()) {
    fr = ctx.fractions(p.dataset);
    if (!fr && p.required) {
      out["Error"] = "unknown Ember dataset '" + p.dataset + "'";
      return out.dump();
    }
  }
  json kept_items = json::array();
  json kept_names = json::array();
  for (size_t i = 0; i < p.names.size(); i++) {
    const std::string& name = p.names[i];
    std::string reason;
    if (p.required && fr) {
      if (!ctx.known(name)) {
        reason = "not an Ember node";
      } else {
        auto it = fr->find(name);
        double f = it == fr->end() ? 0 : it->second;
        if (f + 1e-9 < p.min_locality) {
          char buf[160];
          std::snprintf(buf, sizeof(buf), "holds %.0f%% of dataset %s, needs %.0f%%", f * 100,
                        p.dataset.c_str(), p.min_locality * 100);
          reason = buf;
        }
      }
    }
    if (!reason.empty()) {
      out["FailedNodes"][name] = reason;
      continue;
    }
    if (p.have_items) kept_items.push_back(p.items[i]);
    kept_names.push_back(name);
  }
  if (p.have_items) {
    out["Nodes"] = {{"apiVersion", "v1"}, {"kind", "NodeList"}, {"items", kept_items}};
  } else {
    out["NodeNames"] = kept_names;
  }
  return out.dump();
}

std::string ExtenderPrioritize(const std::string& body, const ExtenderContext& ctx) {
  Parsed p = Parse(body);
  json out = json::array();
  if (!p.error.empty()) return out.dump();
  std::optional<std::map<std::string, double>> fr;
  if (!p.dataset.empty()) fr = ctx.fractions(p.dataset);
  for (const auto& name : p.names) {
    int score = 0;
    if (fr) {
      auto it = fr->find(name);
      if (it != fr->end()) score = static_cast<int>(std::lround(it->second * 10));
    }
    out.push_back({{"Host", name}, {"Score", std::clamp(score, 0, 10)}});
  }
  return out.dump();
}

}  // namespace ember::meta
