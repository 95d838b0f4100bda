// `ember cache verify`: an offline check of a node's cache (the agent must be stopped): every
// index record against the bytes in its cache file.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "cachefs/cache/block_cache.h"
#include "common/units.h"
#include "tools/cli.h"

namespace ember::tools {

void AddCacheCommands(CLI::App& app) {
  auto* cache = app.add_subcommand("cache", "Inspect a node's local cache");
  cache->require_subcommand(1);
  auto* c = cache->add_subcommand(
      "verify", "Check every cached block against its checksum (stop the agent first)");
  auto dir = std::make_shared<std::string>();
  auto repair = std::make_shared<bool>(false);
  auto as_json = std::make_shared<bool>(false);
  c->add_option("--cache-dir", *dir, "The node's --cache-dir")->required();
  c->add_flag("--repair", *repair, "Drop damaged blocks (they are refetched when read)");
  c->add_flag("--json", *as_json, "Print JSON");
  c->callback([=] {
    if (!std::filesystem::exists(*dir + "/index")) Fail(absl::StrCat("no Ember cache at ", *dir));
    spdlog::set_level(spdlog::level::warn);  // stdout is for the report
    cachefs::BlockCache::Options o;
    o.dir = *dir;
    o.capacity_bytes = 1ull << 62;  // checking, not caching: never evict here
    auto opened = cachefs::BlockCache::Open(o);
    if (!opened.ok()) {
      Fail(absl::StrCat(opened.status().message(),
                        opened.status().message().find("lock") != std::string::npos
                            ? " (is an agent still running on this cache?)"
                            : ""));
    }
    Progress p("verifying " + *dir, 100);
    auto r = (*opened)->VerifyAll(*repair, [&](uint64_t done, uint64_t total) {
      if (done % 64 == 0 || done == total) p.Update(done * 100 / std::max<uint64_t>(total, 1));
    });
    p.Finish("");
    if (*as_json) {
      std::cout << nlohmann::json{{"blocks", r.blocks},
                                  {"bytes", r.bytes},
                                  {"damaged", r.damaged},
                                  {"repaired", *repair ? r.damaged : 0},
                                  {"damaged_files", r.damaged_files}}
                       .dump(2)
                << "\n";
    } else {
      std::cout << r.blocks << " blocks (" << FormatBytes(r.bytes) << ") checked, " << r.damaged
                << " damaged" << (*repair && r.damaged > 0 ? " (dropped)" : "") << "\n";
      for (const auto& f : r.damaged_files) std::cout << "  damaged: " << f << "\n";
    }
    if (r.damaged > 0 && !*repair) {
      Fail(absl::StrCat(r.damaged, " damaged block(s); run with --repair to drop them"));
    }
  });
}

}  // namespace ember::tools
