// The mutating admission webhook (admission.k8s.io/v1) that places pods by cache locality
// without reconfiguring kube-scheduler: meta serves it on its HTTP(S) address at
// POST /webhook/mutate. A pure function of the request body, so it is testable without a
// server (meta/admission_test.cc applies the patches it returns).
//
// A Pod annotated `ember.io/dataset: NAME` gets node affinity by cache tier, as JSONPatch:
//   - preferred (default): weight 100 for nodes holding >= `ember.io/min-locality` (default 1.0)
//     of the dataset, 50 for the other nodes on a `switch` with such a holder, 20 for those on
//     its `rack` (Ember's topology labels); terms use kubernetes.io/hostname (Ember node ids are
//     Kubernetes node names, as the node DaemonSet runs them);
//   - `ember.io/data-mode: required`: the holders become a required term, ANDed into each term
//     the pod already has (adding a term of its own would OR it);
//   - `ember.io/mount-path: /data`: the dataset is added as a CSI inline volume (csi.ember.io,
//     read-only; `ember.io/version` picks a version) mounted there in every container.
// Pods without the annotation pass untouched. Nothing here ever refuses a pod: an unknown dataset,
// a dataset nobody holds yet, a malformed review or a body that is not JSON gets an allowed
// response with a warning (the manifest's failurePolicy is Ignore as well).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace ember::meta {

struct AdmissionContext {
  // Resident fraction per Ember node id, for a dataset name; nullopt if the dataset is unknown.
  std::function<std::optional<std::map<std::string, double>>(const std::string& dataset)> fractions;
  // Live nodes' topology labels (node id -> labels), for the switch and rack tiers.
  std::function<std::map<std::string, std::map<std::string, std::string>>()> labels;
};

// Returns an AdmissionReview (admission.k8s.io/v1) JSON body answering `body`.
std::string AdmissionMutate(const std::string& body, const AdmissionContext& ctx);

}  // namespace ember::meta
