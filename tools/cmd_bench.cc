// `ember bench au`: how many emulated accelerators a directory keeps busy (tools/au_bench.h), and
// `ember bench au generate` to make a workload's dataset.
#include <sys/sysinfo.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/units.h"
#include "tools/au_bench.h"
#include "tools/cli.h"

namespace ember::tools {

void AddBenchCommands(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Measure what this node can do");
  bench->require_subcommand(1);
  auto* au_cmd = bench->add_subcommand(
      "au",
      "How many emulated accelerators a directory keeps busy (MLPerf Storage's accelerator "
      "utilization): AU = compute time / wall time of each accelerator's training loop");
  struct Opts {
    std::string dir, workload = "unet3d", accelerator = "h100", size = "8GiB";
    uint32_t accelerators = 1, epochs = 1, readers = 0;
    uint64_t seed = 1;
    bool find_max = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  au_cmd->add_option("--dir", o->dir, "The dataset's directory (its files are under DIR/train)")
      ->required();
  au_cmd->add_option("--workload", o->workload, "unet3d, resnet50 or cosmoflow")
      ->capture_default_str();
  au_cmd->add_option("--accelerator", o->accelerator, "h100 or a100 (the per-batch compute time)")
      ->capture_default_str();
  auto* n = au_cmd->add_option("--accelerators", o->accelerators, "Emulated accelerators")
                ->capture_default_str();
  au_cmd
      ->add_flag("--find-max", o->find_max,
                 "Find the most accelerators that hold the workload's AU threshold")
      ->excludes(n);
  au_cmd->add_option("--epochs", o->epochs, "Epochs per run")->capture_default_str();
  au_cmd->add_option("--readers", o->readers,
                     "Reader threads per accelerator (default: the workload's)");
  au_cmd->add_option("--seed", o->seed, "Shuffle (and generation) seed")->capture_default_str();
  au_cmd->add_flag("--json", o->json, "Print JSON");
  auto* gen = au_cmd->add_subcommand("generate", "Write the workload's dataset under --dir/train");
  gen->fallthrough();  // --dir, --workload, --seed, --json given after `generate`
  gen->add_option("--size", o->size, "About this many bytes in all")->capture_default_str();

  gen->callback([o] {
    auto w = au::FindWorkload(o->workload);
    if (!w.ok()) Fail(w.status());
    auto bytes = ParseSize(o->size);
    if (!bytes.ok()) Fail(absl::StrCat("--size: ", bytes.status().message()));
    struct sysinfo si {};
    if (sysinfo(&si) == 0) {
      const uint64_t ram = static_cast<uint64_t>(si.totalram) * si.mem_unit;
      if (*bytes < 5 * ram) {
        std::cerr << "ember: warning: " << FormatBytes(*bytes)
                  << " is less than 5x this node's RAM (" << FormatBytes(ram)
                  << "): the page cache may serve later epochs\n";
      }
    }
    Progress p(absl::StrCat("writing ", o->workload, " under ", o->dir, "/train"), 100);
    auto total = au::Generate(*w, o->dir, *bytes, o->seed, [&](uint64_t done, uint64_t all) {
      p.Update(done * 100 / std::max<uint64_t>(all, 1), FormatBytes(done));
    });
    if (!total.ok()) Fail(total.status());
    p.Finish(FormatBytes(*total));
    if (o->json) {
      std::cout << nlohmann::json{{"workload", o->workload}, {"bytes", *total}}.dump(2) << "\n";
    }
  });

  au_cmd->callback([o, au_cmd] {
    if (au_cmd->got_subcommand("generate")) return;
    auto w = au::FindWorkload(o->workload);
    if (!w.ok()) Fail(w.status());
    auto compute = au::ComputeTime(*w, o->accelerator);
    if (!compute.ok()) Fail(compute.status());
    if (o->accelerators == 0 || o->epochs == 0) Fail("--accelerators and --epochs must be >= 1");
    auto samples = au::ListSamples(*w, o->dir);
    if (!samples.ok()) Fail(samples.status());
    au::RunOptions ro;
    ro.accelerators = o->accelerators;
    ro.epochs = o->epochs;
    ro.readers = o->readers > 0 ? o->readers : w->readers;
    ro.compute = *compute;
    ro.batch = w->batch;
    ro.seed = o->seed;
    const bool tty = isatty(STDERR_FILENO) == 1;
    ro.on_epoch = [&](uint32_t epoch, double a, double s) {
      std::cerr << absl::StrFormat("  %u accelerator(s), epoch %u: AU %.1f%% in %.1f s\n",
                                   ro.accelerators, epoch, a * 100, s);
    };
    if (!tty && o->json) ro.on_epoch = nullptr;
    nlohmann::json out{{"workload", o->workload},
                       {"accelerator", o->accelerator},
                       {"dir", o->dir},
                       {"samples", samples->size()},
                       {"threshold", w->threshold}};
    if (o->find_max) {
      nlohmann::json runs = nlohmann::json::array();
      auto most = au::FindMax(*samples, ro, w->threshold, au::ReadFile, [&](uint32_t k, double a) {
        runs.push_back({{"accelerators", k}, {"au", a}});
        std::cerr << absl::StrFormat("%u accelerator(s): AU %.1f%% (%s)\n", k, a * 100,
                                     a >= w->threshold ? "holds" : "below the threshold");
      });
      if (!most.ok()) Fail(most.status());
      out["max_accelerators"] = *most;
      out["runs"] = runs;
      if (o->json) {
        std::cout << out.dump(2) << "\n";
      } else {
        std::cout << absl::StrFormat("%s on %s: %u %s accelerator(s) held AU >= %.0f%%\n",
                                     o->workload, o->dir, *most, o->accelerator,
                                     w->threshold * 100);
      }
      return;
    }
    auto r = au::Run(*samples, ro, au::ReadFile);
    if (!r.ok()) Fail(r.status());
    nlohmann::json epochs = nlohmann::json::array();
    for (const auto& e : r->epochs) {
      epochs.push_back({{"au", e.au},
                        {"min_au", e.min_au},
                        {"seconds", e.seconds},
                        {"samples", e.samples},
                        {"bytes", e.bytes}});
    }
    out["accelerators"] = o->accelerators;
    out["au"] = r->au;
    out["passed"] = r->au >= w->threshold;
    out["samples_per_second"] = r->samples_per_second;
    out["bytes_per_second"] = r->bytes_per_second;
    out["epochs"] = epochs;
    if (o->json) {
      std::cout << out.dump(2) << "\n";
      return;
    }
    std::vector<std::vector<std::string>> rows{
        {"EPOCH", "AU", "LEAST BUSY", "SECONDS", "SAMPLES", "BYTES"}};
    for (size_t i = 0; i < r->epochs.size(); i++) {
      const auto& e = r->epochs[i];
      rows.push_back({absl::StrCat(i + 1), absl::StrFormat("%.1f%%", e.au * 100),
                      absl::StrFormat("%.1f%%", e.min_au * 100), absl::StrFormat("%.1f", e.seconds),
                      absl::StrCat(e.samples), FormatBytes(e.bytes)});
    }
    PrintTable(rows);
    std::cout << absl::StrFormat(
        "%s, %u %s accelerator(s): AU %.1f%% (%s %.0f%%), %.1f samples/s, %s/s\n", o->workload,
        o->accelerators, o->accelerator, r->au * 100, r->au >= w->threshold ? "holds" : "below",
        w->threshold * 100, r->samples_per_second,
        FormatBytes(static_cast<uint64_t>(r->bytes_per_second)));
  });
}

}  // namespace ember::tools
