// `ember prefetch`, `ember unpin` and `ember locality`: warming datasets onto nodes and asking
// where they are warm.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <deque>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/units.h"
#include "meta/meta_client.h"
#include "tools/cli.h"

namespace ember::tools {
namespace {

std::atomic<bool> g_detach{false};
void OnInterrupt(int) { g_detach = true; }

struct Totals {
  uint64_t bytes_total = 0, bytes_done = 0, files_total = 0, files_done = 0, origin = 0, peers = 0;
  uint64_t failed = 0;
};

Totals Sum(const rpc::PrefetchJob& job) {
  Totals t;
  for (const auto& n : job.nodes()) {
    t.bytes_total += n.bytes_total();
    t.bytes_done += n.bytes_done();
    t.files_total += n.files_total();
    t.files_done += n.files_done();
    t.origin += n.bytes_from_origin();
    t.peers += n.bytes_from_peers();
    t.failed += n.blocks_failed();
  }
  return t;
}

const char* StateName(rpc::PrefetchJob::State s) {
  switch (s) {
    case rpc::PrefetchJob::RUNNING:
      return "running";
    case rpc::PrefetchJob::DONE:
      return "done";
    case rpc::PrefetchJob::CANCELLED:
      return "cancelled";
    default:
      return "?";
  }
}

// Prints the outcome; returns the exit code (1 if anything failed).
int Summary(const rpc::PrefetchJob& job, double seconds) {
  Totals t = Sum(job);
  std::cout << absl::StrFormat("prefetch %s %s: %s to %d node(s) in %.1fs (origin %s, peers %s)\n",
                               job.id(), StateName(job.state()), FormatBytes(t.bytes_done),
                               job.nodes_size(), seconds, FormatBytes(t.origin),
                               FormatBytes(t.peers));
  if (job.pin_until_unix_ms() > 0) {
    std::cout << "pinned until " << FormatTimeMs(job.pin_until_unix_ms()) << "\n";
  }
  int failures = 0;
  for (const auto& n : job.nodes()) {
    if (!n.note().empty() || n.blocks_failed() > 0) {
      std::cout << "  node " << n.node_id() << ": " << (n.note().empty() ? "" : n.note() + "; ")
                << n.blocks_failed() << " of " << n.blocks_total() << " blocks not prefetched\n";
      failures++;
    }
    for (const auto& f : n.failures()) std::cout << "    " << f << "\n";
  }
  return failures > 0 || job.state() == rpc::PrefetchJob::CANCELLED ? 1 : 0;
}

// Follows a job until it ends (or Ctrl-C detaches). Returns the exit code.
int Follow(meta::MetaClient& client, const std::string& id) {
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  bool tty = isatty(STDERR_FILENO) == 1;
  auto start = std::chrono::steady_clock::now();
  auto last_line = start - std::chrono::seconds(10);
  // Rate over the last few seconds, so the ETA follows the current speed.
  std::deque<std::pair<std::chrono::steady_clock::time_point, uint64_t>> samples;
  while (true) {
    auto job = client.GetPrefetch(id);
    if (!job.ok()) Fail(job.status());
    Totals t = Sum(*job);
    auto now = std::chrono::steady_clock::now();
    double secs = std::chrono::duration<double>(now - start).count();
    samples.emplace_back(now, t.bytes_done);
    while (samples.size() > 2 && now - samples.front().first > std::chrono::seconds(5)) {
      samples.pop_front();
    }
    double window = std::chrono::duration<double>(now - samples.front().first).count();
    double rate = window > 0 ? (t.bytes_done - samples.front().second) / window
                             : (secs > 0 ? t.bytes_done / secs : 0);
    double frac = t.bytes_total ? static_cast<double>(t.bytes_done) / t.bytes_total : 0;
    std::string eta = rate > 0 && t.bytes_total > t.bytes_done
                          ? absl::StrFormat("ETA %.0fs", (t.bytes_total - t.bytes_done) / rate)
                          : "";
    std::string text = absl::StrFormat(
        "%s/%s files %d/%d %.1f%% %s/s origin %s peers %s %s", FormatBytes(t.bytes_done),
        FormatBytes(t.bytes_total), t.files_done, t.files_total, frac * 100,
        FormatBytes(static_cast<uint64_t>(rate)), FormatBytes(t.origin), FormatBytes(t.peers), eta);
    if (tty) {
      int filled = static_cast<int>(frac * 25);
      std::fprintf(stderr, "\r\033[K[%s%s] %s", std::string(filled, '#').c_str(),
                   std::string(25 - filled, '.').c_str(), text.c_str());
    } else if (std::chrono::steady_clock::now() - last_line > std::chrono::seconds(2)) {
      std::fprintf(stderr, "prefetch %s: %s\n", id.c_str(), text.c_str());
      last_line = std::chrono::steady_clock::now();
    }
    if (job->state() != rpc::PrefetchJob::RUNNING) {
      if (tty) std::fprintf(stderr, "\r\033[K");
      return Summary(*job, secs);
    }
    if (g_detach) {
      if (tty) std::fprintf(stderr, "\r\033[K");
      std::cout << "detached; prefetch " << id << " goes on (ember prefetch status " << id << ")\n";
      return 0;
    }
    // A status call is cheap, and the command returns within 25 ms of the job's end.
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

}  // namespace

void AddPrefetchCommands(CLI::App& app) {
  {
    auto* c = app.add_subcommand(
        "prefetch",
        "Warm a dataset onto nodes: ember prefetch NAME [PATH...] | ls | status ID | cancel ID");
    auto args = std::make_shared<std::vector<std::string>>();
    auto nodes = std::make_shared<std::string>();
    auto all = std::make_shared<bool>(false);
    auto mode = std::make_shared<std::string>("full");
    auto replicas = std::make_shared<uint32_t>(1);
    auto rate = std::make_shared<std::string>();
    auto pin = std::make_shared<std::string>();
    auto version = std::make_shared<uint32_t>(0);
    auto detach = std::make_shared<bool>(false);
    auto meta_flags = std::make_shared<MetaFlags>();
    auto as_json = std::make_shared<bool>(false);
    c->add_option("ARGS", *args, "NAME [PATH...], or ls | status ID | cancel ID")->required();
    c->add_option("--nodes", *nodes, "Comma-separated node ids (default: every live node)");
    c->add_flag("--all", *all, "Every live node");
    c->add_option("--mode", *mode, "full (every node gets everything) or stripe")
        ->capture_default_str();
    c->add_option("--replicas", *replicas, "stripe: nodes per block")->capture_default_str();
    c->add_option("--origin-rate", *rate, "Cap on the cluster's origin reads, e.g. 500MiB (per s)");
    c->add_option("--pin", *pin, "Keep the blocks from eviction this long, e.g. 12h");
    c->add_option("--version", *version, "Dataset version (default: latest)");
    c->add_flag("--detach", *detach, "Start it and return");
    AddMetaFlags(c, meta_flags.get());
    c->add_flag("--json", *as_json, "ls: print JSON");
    c->callback([=] {
      auto client_ptr = ConnectMeta(*meta_flags);
      meta::MetaClient& client = *client_ptr;
      const std::string& first = (*args)[0];
      if (first == "ls" && args->size() == 1) {
        auto jobs = client.ListPrefetches();
        if (!jobs.ok()) Fail(jobs.status());
        if (*as_json) {
          nlohmann::json arr = nlohmann::json::array();
          for (const auto& j : *jobs) {
            Totals t = Sum(j);
            arr.push_back({{"id", j.id()},
                           {"dataset", j.spec().dataset()},
                           {"state", StateName(j.state())},
                           {"bytes_done", t.bytes_done},
                           {"bytes_total", t.bytes_total},
                           {"nodes", j.nodes_size()},
                           {"pin_until_unix_ms", j.pin_until_unix_ms()}});
          }
          std::cout << arr.dump(2) << "\n";
          return;
        }
        std::vector<std::vector<std::string>> rows{
            {"ID", "DATASET", "STATE", "PROGRESS", "NODES", "ORIGIN", "PEERS", "PINNED-UNTIL"}};
        for (const auto& j : *jobs) {
          Totals t = Sum(j);
          rows.push_back({j.id(), j.spec().dataset(), StateName(j.state()),
                          absl::StrCat(FormatBytes(t.bytes_done), "/", FormatBytes(t.bytes_total)),
                          std::to_string(j.nodes_size()), FormatBytes(t.origin),
                          FormatBytes(t.peers), FormatTimeMs(j.pin_until_unix_ms())});
        }
        PrintTable(rows);
        return;
      }
      if ((first == "status" || first == "cancel") && args->size() == 2) {
        if (first == "cancel") {
          auto j = client.CancelPrefetch((*args)[1]);
          if (!j.ok()) Fail(j.status());
          std::cout << "cancelled prefetch " << j->id() << "\n";
          return;
        }
        std::exit(Follow(client, (*args)[1]));
      }
      rpc::PrefetchSpec spec;
      spec.set_dataset(first);
      spec.set_version(*version);
      for (size_t i = 1; i < args->size(); i++) spec.add_paths((*args)[i]);
      if (*all && !nodes->empty()) Fail("--nodes and --all exclude each other");
      spec.set_all_nodes(*all || nodes->empty());
      for (const std::string& n :
           std::vector<std::string>(absl::StrSplit(*nodes, ',', absl::SkipEmpty()))) {
        spec.add_nodes(n);
      }
      if (*mode == "full") {
        spec.set_mode(rpc::PrefetchSpec::FULL);
      } else if (*mode == "stripe") {
        spec.set_mode(rpc::PrefetchSpec::STRIPE);
        spec.set_replicas(*replicas);
      } else {
        Fail(absl::StrCat("--mode '", *mode, "' must be full or stripe"));
      }
      if (!rate->empty()) {
        auto r = ParseSize(*rate);
        if (!r.ok()) Fail(r.status());
        spec.set_origin_rate(*r);
      }
      if (!pin->empty()) {
        auto d = ParseDuration(*pin);
        if (!d.ok()) Fail(d.status());
        if (d->count() <= 0) Fail("--pin must be longer than 0");
        spec.set_pin_ms(static_cast<uint64_t>(d->count()));
      }
      auto job = client.StartPrefetch(spec);
      if (!job.ok()) Fail(job.status());
      std::cout << "prefetch " << job->id() << ": " << FormatBytes(job->dataset_bytes()) << " in "
                << job->dataset_files() << " files to " << job->nodes_size() << " node(s) ("
                << absl::StrJoin(job->spec().nodes(), ",") << ")\n";
      std::cout.flush();
      if (*detach) return;
      std::exit(Follow(client, job->id()));
    });
  }
  {
    auto* c = app.add_subcommand("unpin", "Release pins: ember unpin NAME | --prefetch ID");
    auto name = std::make_shared<std::string>();
    auto id = std::make_shared<std::string>();
    auto meta_flags = std::make_shared<MetaFlags>();
    c->add_option("NAME", *name, "Dataset whose pins to release");
    c->add_option("--prefetch", *id, "Release the pin of one prefetch");
    AddMetaFlags(c, meta_flags.get());
    c->callback([=] {
      if (name->empty() == id->empty()) Fail("give a dataset NAME or --prefetch ID");
      auto client_ptr = ConnectMeta(*meta_flags);
      meta::MetaClient& client = *client_ptr;
      auto n = client.Unpin(*name, *id);
      if (!n.ok()) Fail(n.status());
      std::cout << "released " << *n << " pin(s)\n";
    });
  }
  {
    auto* c = app.add_subcommand("locality", "Where a dataset is warm: per node and overall");
    auto name = std::make_shared<std::string>();
    auto version = std::make_shared<uint32_t>(0);
    auto meta_flags = std::make_shared<MetaFlags>();
    auto as_json = std::make_shared<bool>(false);
    c->add_option("NAME", *name, "Dataset")->required();
    c->add_option("--version", *version, "Dataset version (default: latest)");
    AddMetaFlags(c, meta_flags.get());
    c->add_flag("--json", *as_json, "Print JSON");
    c->callback([=] {
      auto client_ptr = ConnectMeta(*meta_flags);
      meta::MetaClient& client = *client_ptr;
      auto l = client.Locality(*name, *version);
      if (!l.ok()) Fail(l.status());
      auto state = [](rpc::Node::State s) { return s == rpc::Node::ALIVE ? "alive" : "dead"; };
      if (*as_json) {
        nlohmann::json nodes = nlohmann::json::array();
        for (const auto& n : l->nodes()) {
          nlohmann::json labels = nlohmann::json::object();
          for (const auto& [k, v] : n.labels()) labels[k] = v;
          nodes.push_back({{"id", n.node_id()},
                           {"address", n.address()},
                           {"state", state(n.state())},
                           {"labels", labels},
                           {"resident_bytes", n.resident_bytes()},
                           {"resident_blocks", n.resident_blocks()},
                           {"fraction", n.fraction()},
                           {"pinned_bytes", n.pinned_bytes()}});
        }
        std::cout << nlohmann::json{{"dataset", l->dataset()},
                                    {"version", l->version()},
                                    {"dataset_bytes", l->dataset_bytes()},
                                    {"dataset_blocks", l->dataset_blocks()},
                                    {"resident_anywhere_bytes", l->resident_anywhere_bytes()},
                                    {"resident_anywhere_blocks", l->resident_anywhere_blocks()},
                                    {"replicas_histogram",
                                     std::vector<uint64_t>(l->replicas_histogram().begin(),
                                                           l->replicas_histogram().end())},
                                    {"nodes", nodes}}
                         .dump(2)
                  << "\n";
        return;
      }
      bool tty = isatty(STDOUT_FILENO) == 1;
      std::cout << "dataset " << l->dataset() << " version " << l->version() << ": "
                << FormatBytes(l->dataset_bytes()) << " in " << l->dataset_blocks()
                << " blocks; resident somewhere: " << FormatBytes(l->resident_anywhere_bytes())
                << "\n";
      std::vector<std::vector<std::string>> rows{
          {"NODE", "STATE", "LABELS", "RESIDENT", "FRACTION", "PINNED"}};
      for (const auto& n : l->nodes()) {
        std::vector<std::string> labels;
        for (const auto& [k, v] : n.labels()) labels.push_back(absl::StrCat(k, "=", v));
        std::sort(labels.begin(), labels.end());
        std::string frac = absl::StrFormat("%5.1f%%", n.fraction() * 100);
        if (tty) {
          int filled = static_cast<int>(n.fraction() * 20 + 0.5);
          frac = absl::StrCat("[", std::string(filled, '#'), std::string(20 - filled, ' '), "] ",
                              frac);
        }
        rows.push_back({n.node_id(), state(n.state()),
                        labels.empty() ? "-" : absl::StrJoin(labels, ","),
                        FormatBytes(n.resident_bytes()), frac, FormatBytes(n.pinned_bytes())});
      }
      PrintTable(rows);
      std::vector<std::string> hist;
      for (int i = 0; i < l->replicas_histogram_size(); i++) {
        hist.push_back(absl::StrCat(i, "x: ", l->replicas_histogram(i)));
      }
      std::cout << "blocks by live replicas: " << absl::StrJoin(hist, ", ") << "\n";
    });
  }
}

}  // namespace ember::tools
