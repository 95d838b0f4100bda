// `ember job submit|ls|show|cancel|complete`: the scheduler's front end.
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "meta/meta_client.h"
#include "tools/cli.h"

namespace ember::tools {
namespace {

const char* JobState(rpc::Job::State s) {
  switch (s) {
    case rpc::Job::QUEUED:
      return "queued";
    case rpc::Job::WARMING:
      return "warming";
    case rpc::Job::RUNNING:
      return "running";
    case rpc::Job::COMPLETED:
      return "completed";
    case rpc::Job::CANCELLED:
      return "cancelled";
    default:
      return "?";
  }
}

// Reads a job spec from YAML. Fails with the file and the problem on bad input.
rpc::JobSpec ParseSpec(const std::string& path) {
  YAML::Node y;
  try {
    y = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    Fail(absl::StrCat(path, ": ", e.what()));
  }
  if (!y.IsMap()) Fail(absl::StrCat(path, ": expected a mapping of job fields"));
  rpc::JobSpec spec;
  static const std::set<std::string> known = {"name",      "workers",  "gpus",    "gpus_per_worker",
                                              "cpu",       "memory",   "dataset", "version",
                                              "data_mode", "dataMode", "topology"};
  try {
    for (const auto& kv : y) {
      std::string key = kv.first.as<std::string>();
      if (!known.count(key)) Fail(absl::StrCat(path, ": unknown field '", key, "'"));
    }
    if (!y["name"]) Fail(absl::StrCat(path, ": 'name' is required"));
    spec.set_name(y["name"].as<std::string>());
    spec.set_workers(y["workers"] ? y["workers"].as<uint32_t>() : 1);
    if (y["gpus"]) spec.set_gpus_per_worker(y["gpus"].as<uint32_t>());
    if (y["gpus_per_worker"]) spec.set_gpus_per_worker(y["gpus_per_worker"].as<uint32_t>());
    if (!y["gpus"] && !y["gpus_per_worker"]) spec.set_gpus_per_worker(1);
    if (y["cpu"]) spec.set_cpu(y["cpu"].as<double>());
    if (y["memory"]) spec.set_memory(y["memory"].as<std::string>());
    if (y["dataset"]) spec.set_dataset(y["dataset"].as<std::string>());
    if (y["version"]) spec.set_version(y["version"].as<uint32_t>());
    if (y["data_mode"]) spec.set_data_mode(y["data_mode"].as<std::string>());
    if (y["dataMode"]) spec.set_data_mode(y["dataMode"].as<std::string>());
    if (y["topology"]) spec.set_topology(y["topology"].as<std::string>());
  } catch (const YAML::Exception& e) {
    Fail(absl::StrCat(path, ": ", e.what()));
  }
  return spec;
}

nlohmann::json JobJson(const rpc::Job& j) {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& w : j.workers()) {
    workers.push_back({{"index", w.index()},
                       {"node", w.node_id()},
                       {"locality", w.locality()},
                       {"switch", w.switch_label()},
                       {"rack", w.rack()},
                       {"free_gpus_after", w.free_gpus_after()}});
  }
  auto cand = [](const rpc::CandidateSummary& c) {
    return nlohmann::json{{"domain", c.domain()},
                          {"nodes", std::vector<std::string>(c.nodes().begin(), c.nodes().end())},
                          {"locality", c.locality()},
                          {"switches", c.switches()},
                          {"racks", c.racks()},
                          {"leftover_gpus", c.leftover_gpus()}};
  };
  nlohmann::json runners = nlohmann::json::array();
  for (const auto& c : j.runners_up()) runners.push_back(cand(c));
  return {{"id", j.id()},
          {"name", j.spec().name()},
          {"state", JobState(j.state())},
          {"workers", workers},
          {"gpus_per_worker", j.spec().gpus_per_worker()},
          {"dataset", j.spec().dataset()},
          {"data_mode", j.spec().data_mode()},
          {"topology", j.spec().topology()},
          {"chosen", cand(j.chosen())},
          {"runners_up", runners},
          {"prefetch", j.prefetch_id()},
          {"events", std::vector<std::string>(j.events().begin(), j.events().end())}};
}

void Show(const rpc::Job& j) {
  std::cout << "job " << j.id() << " (" << j.spec().name() << "): " << JobState(j.state()) << ", "
            << j.spec().workers() << " x " << j.spec().gpus_per_worker() << " GPUs";
  if (!j.spec().dataset().empty()) {
    std::cout << ", dataset " << j.spec().dataset() << "@" << j.spec().version() << " ("
              << j.spec().data_mode() << ")";
  }
  std::cout << "\n";
  if (j.workers_size() > 0) {
    std::cout << absl::StrFormat(
        "chosen: %s, locality %.2f, %d switch(es), %d rack(s), %d GPUs "
        "left free on those nodes\n",
        j.chosen().domain(), j.chosen().locality(), j.chosen().switches(), j.chosen().racks(),
        j.chosen().leftover_gpus());
    std::vector<std::vector<std::string>> rows{
        {"WORKER", "NODE", "LOCALITY", "SWITCH", "RACK", "FREE-GPUS-AFTER"}};
    for (const auto& w : j.workers()) {
      rows.push_back({std::to_string(w.index()), w.node_id(), absl::StrFormat("%.2f", w.locality()),
                      w.switch_label().empty() ? "-" : w.switch_label(),
                      w.rack().empty() ? "-" : w.rack(), std::to_string(w.free_gpus_after())});
    }
    PrintTable(rows);
    for (const auto& c : j.runners_up()) {
      std::cout << absl::StrFormat("runner-up: %s [%s], locality %.2f, %d switch(es), %d rack(s)\n",
                                   c.domain(), absl::StrJoin(c.nodes(), ","), c.locality(),
                                   c.switches(), c.racks());
    }
  }
  for (const auto& e : j.events()) std::cout << "  " << e << "\n";
}

}  // namespace

void AddJobCommands(CLI::App& app) {
  auto* job = app.add_subcommand("job", "Schedule training jobs where their data is warm");
  job->require_subcommand(1);
  auto meta_flags = std::make_shared<MetaFlags>();
  auto as_json = std::make_shared<bool>(false);
  auto client = [meta_flags] { return ConnectMeta(*meta_flags); };
  auto common = [&](CLI::App* c) {
    AddMetaFlags(c, meta_flags.get());
    c->add_flag("--json", *as_json, "Print JSON");
  };
  {
    auto* c = job->add_subcommand("submit", "Submit a job from a YAML spec");
    auto path = std::make_shared<std::string>();
    c->add_option("SPEC", *path, "YAML: name, workers, gpus, dataset, data_mode, topology")
        ->required();
    common(c);
    c->callback([=] {
      auto j = client()->SubmitJob(ParseSpec(*path));
      if (!j.ok()) Fail(j.status());
      if (*as_json) {
        std::cout << JobJson(*j).dump(2) << "\n";
      } else {
        Show(*j);
      }
    });
  }
  {
    auto* c = job->add_subcommand("ls", "List jobs");
    common(c);
    c->callback([=] {
      auto r = client()->ListJobs();
      if (!r.ok()) Fail(r.status());
      if (*as_json) {
        nlohmann::json arr = nlohmann::json::array();
        for (const auto& j : r->jobs()) arr.push_back(JobJson(j));
        std::cout << nlohmann::json{{"queue_length", r->queue_length()}, {"jobs", arr}}.dump(2)
                  << "\n";
        return;
      }
      std::vector<std::vector<std::string>> rows{
          {"ID", "NAME", "STATE", "WORKERS", "GPUS", "DATASET", "LOCALITY", "NODES"}};
      for (const auto& j : r->jobs()) {
        std::set<std::string> nodes;
        for (const auto& w : j.workers()) nodes.insert(w.node_id());
        rows.push_back({j.id(), j.spec().name(), JobState(j.state()),
                        std::to_string(j.spec().workers()),
                        std::to_string(j.spec().gpus_per_worker()),
                        j.spec().dataset().empty() ? "-" : j.spec().dataset(),
                        j.workers_size() ? absl::StrFormat("%.2f", j.chosen().locality()) : "-",
                        nodes.empty() ? "-" : absl::StrJoin(nodes, ",")});
      }
      PrintTable(rows);
      std::cout << r->queue_length() << " job(s) queued\n";
    });
  }
  for (const char* verb : {"show", "cancel", "complete"}) {
    auto* c = job->add_subcommand(
        verb, std::string(verb) == "show"     ? "Show a job and why it was placed there"
              : std::string(verb) == "cancel" ? "Cancel a job (frees its GPUs)"
                                              : "Mark a job finished (frees its GPUs)");
    auto ref = std::make_shared<std::string>();
    c->add_option("JOB", *ref, "Job id or name")->required();
    common(c);
    std::string v = verb;
    c->callback([=] {
      auto cl = client();
      auto j = v == "show"     ? cl->GetJob(*ref)
               : v == "cancel" ? cl->CancelJob(*ref)
                               : cl->CompleteJob(*ref);
      if (!j.ok()) Fail(j.status());
      if (*as_json) {
        std::cout << JobJson(*j).dump(2) << "\n";
      } else {
        Show(*j);
      }
    });
  }
}

}  // namespace ember::tools
