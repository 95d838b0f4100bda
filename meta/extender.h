// The kube-scheduler extender protocol (filter and prioritize verbs), answered from Ember's
// locality. Pure functions of the request body, so they are testable without a server; meta
// serves them over HTTP (POST /scheduler/filter, POST /scheduler/prioritize).
//
// Requests are upstream's ExtenderArgs: {"Pod": <v1 Pod>, "Nodes": <v1 NodeList> | null,
// "NodeNames": [..] | null}; keys are the Go field names. The dataset comes from the pod
// annotation `ember.io/dataset`; `ember.io/data-mode: required` filters out nodes holding less
// than `ember.io/min-locality` (default 1.0) of it. Every input, however malformed, gets a valid
// protocol answer (an Error field, or an empty list), never an exception.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace ember::meta {

struct ExtenderContext {
  // Resident fraction per Ember node id, for a dataset name; nullopt if the dataset is unknown.
  std::function<std::optional<std::map<std::string, double>>(const std::string& dataset)> fractions;
  // True if the node name is an Ember node.
  std::function<bool(const std::string& node)> known;
};

// Returns an ExtenderFilterResult JSON body.
std::string ExtenderFilter(const std::string& body, const ExtenderContext& ctx);
// Returns a HostPriorityList JSON body (scores 0..10).
std::string ExtenderPrioritize(const std::string& body, const ExtenderContext& ctx);

}  // namespace ember::meta
