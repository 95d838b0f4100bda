// StatusSurface: meta's HTTP face (--http): the status page (`/`) and the JSON it draws
// (`/api/status`), the kube-scheduler extender (`/scheduler/filter`, `/scheduler/prioritize`),
// the mutating admission webhook (`/webhook/mutate`, meta/admission.h),
// Prometheus `/metrics` (with meta's figures read at scrape time) and `/healthz`. It reads the
// other units and owns only the page's history of cluster totals (10 minutes, every 5 s).
//
// Thread-safe; its one mutex guards the history and is never held across a call into another
// unit.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/http_server.h"
#include "meta/admission.h"
#include "meta/catalog.h"
#include "meta/extender.h"
#include "meta/job_service.h"
#include "meta/location_index.h"
#include "meta/node_registry.h"
#include "meta/prefetch_jobs.h"

namespace ember::meta {

class StatusSurface {
 public:
  // REQUIRES: every unit passed in outlives this. `meta_address` is shown on the page.
  StatusSurface(std::string meta_address, DatasetCatalog* catalog, NodeRegistry* nodes,
                LocationIndex* locations, PrefetchJobs* prefetches, JobService* jobs);
  // Removes the metric callbacks that point at the units.
  ~StatusSurface();

  // Registers meta's gauges with the metrics registry (read at scrape time).
  void RegisterMetrics();
  // Serves the routes on `listen` under `access` (the cluster token), over HTTPS with `tls`.
  // Returns: the server; the errors of HttpServer::Start.
  absl::StatusOr<std::unique_ptr<HttpServer>> Serve(const std::string& listen,
                                                    const HttpAccess& access,
                                                    const HttpTls& tls = {});

  // Records cluster totals for the page's charts, at most every 5 s (called by meta's loop).
  void Sample();
  std::string StatusJson();
  ExtenderContext Extender();
  AdmissionContext Admission();

 private:
  const std::string meta_address_;
  DatasetCatalog* const catalog_;
  NodeRegistry* const nodes_;
  LocationIndex* const locations_;
  PrefetchJobs* const prefetches_;
  JobService* const jobs_;
  absl::Mutex mu_;
  std::deque<nlohmann::json> history_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_sample_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace ember::meta
