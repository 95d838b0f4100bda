#include "meta/status_surface.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/units.h"
#include "meta/locality.h"
#include "meta/status_json.h"
#include "meta/status_page.h"

namespace ember::meta {
namespace {

constexpr const char* kMetricPrefixes[] = {"ember_meta_", "ember_scheduler_", "ember_prefetch_"};

}  // namespace

StatusSurface::StatusSurface(std::string meta_address, DatasetCatalog* catalog, NodeRegistry* nodes,
                             LocationIndex* locations, PrefetchJobs* prefetches, JobService* jobs)
    : meta_address_(std::move(meta_address)),
      catalog_(catalog),
      nodes_(nodes),
      locations_(locations),
      prefetches_(prefetches),
      jobs_(jobs) {}

StatusSurface::~StatusSurface() {
  for (const char* prefix : kMetricPrefixes) metrics::Global().RemoveCallbacks(prefix);
}

void StatusSurface::RegisterMetrics() {
  auto& r = metrics::Global();
  // Families that only count events: declared now so they show (as 0) before the first one.
  r.GetCounter("ember_meta_lease_expiries_total",
               "Nodes declared dead because their lease ran out.");
  r.GetHistogram("ember_scheduler_placement_seconds", "Time to place (or fail to place) one gang.");
  r.SetCollector("ember_meta_nodes", "Registered nodes by lease state.", "gauge", [this] {
    const NodeView view = nodes_->View();
    double alive = 0, dead = 0;
    for (bool a : view.alive) (a ? alive : dead) += 1;
    return metrics::Registry::Samples{{{{"state", "alive"}}, alive}, {{{"state", "dead"}}, dead}};
  });
  r.SetCallback("ember_meta_datasets", "Datasets.", "gauge", {},
                [this] { return static_cast<double>(catalog_->List().size()); });
  r.SetCallback("ember_scheduler_queue_length", "Jobs waiting for GPUs.", "gauge", {},
                [this] { return static_cast<double>(jobs_->QueueLength()); });
  r.SetCollector("ember_scheduler_jobs", "Jobs by state.", "gauge", [this] {
    metrics::Registry::Samples out;
    for (const auto& [state, n] : jobs_->CountByState()) {
      out.push_back({{{"state", state}}, static_cast<double>(n)});
    }
    return out;
  });
  r.SetCollector("ember_prefetch_done_ratio", "Running prefetches: blocks done / blocks to do.",
                 "gauge", [this] {
                   metrics::Registry::Samples out;
                   for (const auto& j : prefetches_->List()) {
                     if (j.state() != rpc::PrefetchJob::RUNNING) continue;
                     double done = 0, total = 0;
                     for (const auto& n : j.nodes()) {
                       done += static_cast<double>(n.blocks_done());
                       total += static_cast<double>(n.blocks_total());
                     }
                     out.push_back({{{"job", j.id()}, {"dataset", j.spec().dataset()}},
                                    total > 0 ? done / total : 0.0});
                   }
                   return out;
                 });
}

absl::StatusOr<std::unique_ptr<HttpServer>> StatusSurface::Serve(const std::string& listen,
                                                                 const HttpAccess& access,
                                                                 const HttpTls& tls) {
  return HttpServer::Start(
      listen, tls.cert_file.empty() ? "--http" : "--https",
      [this](httplib::Server& http) {
        http.Post("/scheduler/filter", [this](const httplib::Request& req, httplib::Response& res) {
          res.set_content(ExtenderFilter(req.body, Extender()), "application/json");
        });
        http.Post("/scheduler/prioritize",
                  [this](const httplib::Request& req, httplib::Response& res) {
                    res.set_content(ExtenderPrioritize(req.body, Extender()), "application/json");
                  });
        http.Post("/webhook/mutate", [this](const httplib::Request& req, httplib::Response& res) {
          res.set_content(AdmissionMutate(req.body, Admission()), "application/json");
        });
        http.Get("/", [](const httplib::Request&, httplib::Response& res) {
          res.set_content(StatusPageHtml(), "text/html; charset=utf-8");
        });
        http.Get("/api/status", [this](const httplib::Request&, httplib::Response& res) {
          res.set_content(StatusJson(), "application/json");
        });
      },
      access, tls);
}

void StatusSurface::Sample() {
  const auto now = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_);
    if (now - last_sample_ < std::chrono::seconds(5)) return;
    last_sample_ = now;
  }
  uint64_t hits = 0, misses = 0, cache = 0, peers = 0, origin = 0;
  for (const rpc::Node& n : nodes_->List()) {
    const auto& st = n.stats();
    hits += st.hits();
    misses += st.misses();
    cache += st.bytes_from_cache();
    peers += st.bytes_from_peers();
    origin += st.bytes_from_origin();
  }
  nlohmann::json t = {{"t_ms", NowUnixMs()},       {"hits", hits},
                      {"misses", misses},          {"bytes_from_cache", cache},
                      {"bytes_from_peers", peers}, {"bytes_from_origin", origin}};
  absl::MutexLock lock(&mu_);
  history_.push_back(std::move(t));
  while (history_.size() > 120) history_.pop_front();
}

std::string StatusSurface::StatusJson() {
  nlohmann::json nodes = nlohmann::json::array();
  for (const rpc::Node& n : nodes_->List()) nodes.push_back(NodeJson(n));
  nlohmann::json datasets = nlohmann::json::array();
  for (const rpc::Dataset& ds : catalog_->List()) {
    rpc::LocalityRequest req;
    req.set_dataset(ds.name());
    rpc::LocalityResponse loc;
    if (!ComputeLocality(catalog_, nodes_, locations_, req, &loc).ok()) continue;
    nlohmann::json fr = nlohmann::json::object();
    for (const auto& n : loc.nodes()) fr[n.node_id()] = n.fraction();
    datasets.push_back(
        {{"name", ds.name()},
         {"version", loc.version()},
         {"bytes", loc.dataset_bytes()},
         {"fractions", fr},
         {"anywhere", loc.dataset_bytes() > 0 ? static_cast<double>(loc.resident_anywhere_bytes()) /
                                                    static_cast<double>(loc.dataset_bytes())
                                              : 0.0}});
  }
  nlohmann::json prefetches = nlohmann::json::array();
  for (const rpc::PrefetchJob& j : prefetches_->List()) {
    uint64_t done = 0, total = 0;
    for (const auto& n : j.nodes()) {
      done += n.blocks_done();
      total += n.blocks_total();
    }
    prefetches.push_back(
        {{"id", j.id()},
         {"dataset", j.spec().dataset()},
         {"state", rpc::PrefetchJob::State_Name(j.state())},
         {"blocks_done", done},
         {"blocks_total", total},
         {"nodes", std::vector<std::string>(j.spec().nodes().begin(), j.spec().nodes().end())}});
  }
  nlohmann::json jobs = nlohmann::json::array();
  const rpc::ListJobsResponse all_jobs = jobs_->List();
  for (const rpc::Job& j : all_jobs.jobs()) {
    std::vector<std::string> workers;
    for (const auto& w : j.workers()) workers.push_back(absl::StrCat(w.index(), "@", w.node_id()));
    jobs.push_back({{"name", j.spec().name().empty() ? j.id() : j.spec().name()},
                    {"state", rpc::Job::State_Name(j.state())},
                    {"dataset", j.spec().dataset()},
                    {"workers", workers}});
  }
  nlohmann::json history = nlohmann::json::array();
  {
    absl::MutexLock lock(&mu_);
    for (const auto& h : history_) history.push_back(h);
  }
  return nlohmann::json{{"meta", meta_address_},    {"nodes", nodes}, {"datasets", datasets},
                        {"prefetches", prefetches}, {"jobs", jobs},   {"history", history}}
      .dump();
}

ExtenderContext StatusSurface::Extender() {
  ExtenderContext c;
  c.fractions = [this](const std::string& name) { return jobs_->Fractions(name); };
  c.known = [this](const std::string& node) { return nodes_->Known(node); };
  return c;
}

AdmissionContext StatusSurface::Admission() {
  AdmissionContext c;
  c.fractions = [this](const std::string& name) { return jobs_->Fractions(name); };
  c.labels = [this] {
    std::map<std::string, std::map<std::string, std::string>> out;
    for (const rpc::Node& n : nodes_->List()) {
      if (n.state() != rpc::Node::ALIVE) continue;
      out[n.id()] = {n.labels().begin(), n.labels().end()};
    }
    return out;
  };
  return c;
}

}  // namespace ember::meta
