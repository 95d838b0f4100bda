// `ember csi`: the CSI node plugin (csi/csi_node.h) as a process, beside the node agent.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "csi/csi_node.h"
#include "tools/cli.h"

namespace ember::tools {

void AddCsiCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "csi", "Serve the CSI node plugin (driver csi.ember.io): datasets as Kubernetes volumes");
  auto o = std::make_shared<csinode::CsiOptions>();
  auto labels = std::make_shared<std::string>();
  cmd->add_option("--endpoint", o->endpoint, "unix://PATH of the plugin's socket (kubelet's)")
      ->capture_default_str();
  cmd->add_option("--node-id", o->node_id, "This node's name, as Kubernetes knows it")->required();
  cmd->add_option("--mount-root", o->mount_root,
                  "Where the node agent serves datasets (its --mount)")
      ->capture_default_str();
  cmd->add_option("--labels", *labels,
                  "Topology labels reported to Kubernetes as topology.ember.io/KEY, e.g. "
                  "rack=r1,switch=s1 (as the agent's --labels)");
  cmd->callback([o, labels] {
    for (const std::string& part :
         std::vector<std::string>(absl::StrSplit(*labels, ',', absl::SkipEmpty()))) {
      const size_t eq = part.find('=');
      if (eq == std::string::npos || eq == 0) {
        Fail(absl::StrCat("--labels: '", part, "' is not KEY=VALUE"));
      }
      o->labels[part.substr(0, eq)] = part.substr(eq + 1);
    }
    auto server = csinode::CsiServer::Start(*o);
    if (!server.ok()) Fail(server.status());
    std::thread waiter([&] {
      int sig = WaitForTerminationSignal();
      spdlog::info("csi: signal {}, shutting down", sig);
      (*server)->Shutdown();
    });
    (*server)->Wait();
    waiter.join();
  });
}

}  // namespace ember::tools
