// `ember status`: the cluster's nodes and their caches.
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/units.h"
#include "meta/meta_client.h"
#include "meta/status_json.h"
#include "tools/cli.h"

namespace ember::tools {

namespace {

// "pass 3, 41%" / "off".
std::string ScrubProgress(const rpc::NodeStats& s) {
  if (s.scrub_rate() == 0) return s.fuse_binding().empty() ? "-" : "off";
  const uint64_t pct =
      s.scrub_pass_total() == 0
          ? 0
          : std::min<uint64_t>(100, 100 * s.scrub_pass_done() / s.scrub_pass_total());
  return absl::StrCat("pass ", s.scrub_passes() + 1, ", ", pct, "%");
}

}  // namespace

void AddStatusCommand(CLI::App& app) {
  auto* c = app.add_subcommand("status", "Show nodes: state, labels, cache use and traffic");
  auto meta_flags = std::make_shared<MetaFlags>();
  auto as_json = std::make_shared<bool>(false);
  AddMetaFlags(c, meta_flags.get());
  c->add_flag("--json", *as_json, "Print JSON");
  c->callback([=] {
    auto client_ptr = ConnectMeta(*meta_flags);
    meta::MetaClient& client = *client_ptr;
    auto nodes = client.ListNodes();
    if (!nodes.ok()) Fail(nodes.status());
    if (*as_json) {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& n : *nodes) arr.push_back(meta::NodeJson(n));
      std::cout << nlohmann::json{{"meta", client.address()}, {"nodes", arr}}.dump(2) << "\n";
      return;
    }
    std::cout << "meta " << client.address() << ": " << nodes->size() << " node(s)\n";
    if (nodes->empty()) return;
    std::vector<std::vector<std::string>> rows{
        {"NODE", "ADDRESS", "STATE", "LABELS", "GPUS", "CAPACITY", "USED", "BLOCKS", "HITS",
         "MISSES", "FROM-CACHE", "FROM-PEERS", "FROM-ORIGIN", "PASSTHROUGH", "CORRUPT", "SCRUB"}};
    for (const auto& n : *nodes) {
      std::vector<std::string> labels;
      for (const auto& [k, v] : n.labels()) labels.push_back(absl::StrCat(k, "=", v));
      std::sort(labels.begin(), labels.end());
      const auto& s = n.stats();
      rows.push_back({n.id(), n.address(), meta::NodeStateName(n.state()),
                      labels.empty() ? "-" : absl::StrJoin(labels, ","), std::to_string(n.gpus()),
                      FormatBytes(n.capacity_bytes()), FormatBytes(s.used_bytes()),
                      std::to_string(s.resident_blocks()), std::to_string(s.hits()),
                      std::to_string(s.misses()), FormatBytes(s.bytes_from_cache()),
                      FormatBytes(s.bytes_from_peers()), FormatBytes(s.bytes_from_origin()),
                      s.passthrough()
                          ? absl::StrCat(s.passthrough_opens(), " of ",
                                         s.passthrough_opens() + s.daemon_opens(), " opens")
                          : (s.fuse_binding().empty() ? "-" : "off"),
                      std::to_string(s.checksum_failures()), ScrubProgress(s)});
    }
    PrintTable(rows);
    // Bad blocks the caches found (each was quarantined and refilled from a peer or the origin).
    for (const auto& n : *nodes) {
      for (const auto& event : n.stats().corruptions()) {
        std::cout << "corrupt block on " << n.id() << ": " << event << "\n";
      }
    }
  });
}

}  // namespace ember::tools
