// `ember volume add|ls|status|rm`: manage writable volumes (checkpoints) on meta.
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/units.h"
#include "meta/meta_client.h"
#include "tools/cli.h"

namespace ember::tools {
namespace {

using nlohmann::json;

json VolumeJson(const rpc::Volume& v) {
  return json{{"name", v.name()},
              {"id", v.id()},
              {"origin", v.origin()},
              {"replicas", v.replicas()},
              {"block_size", v.block_size()},
              {"created_unix_ms", v.created_unix_ms()}};
}

std::string Holders(const rpc::VolumeInode& n) {
  std::string out;
  for (const auto& h : n.holders()) absl::StrAppend(&out, out.empty() ? "" : ",", h);
  return out.empty() ? "-" : out;
}

}  // namespace

void AddVolumeCommand(CLI::App& app) {
  auto* vol = app.add_subcommand("volume",
                                 "Manage writable volumes for checkpoints (add, ls, "
                                 "status, rm)");
  vol->require_subcommand(1);
  auto meta_flags = std::make_shared<MetaFlags>();
  auto as_json = std::make_shared<bool>(false);
  auto client = [meta_flags] { return ConnectMeta(*meta_flags); };

  // add
  {
    auto* c = vol->add_subcommand(
        "add", "Add a writable volume (ORIGIN: where its files are to be uploaded)");
    auto name = std::make_shared<std::string>();
    auto origin = std::make_shared<std::string>();
    auto replicas = std::make_shared<uint32_t>(1);
    auto block = std::make_shared<std::string>();
    c->add_option("NAME", *name, "Volume name (shown as /MOUNT/NAME on every node)")->required();
    c->add_option("ORIGIN", *origin,
                  "Where files are uploaded: an absolute directory path, or s3://bucket/prefix")
        ->required();
    c->add_option("--replicas", *replicas,
                  "Nodes to hold a file before its fsync or close returns (1-8; default 1). Copies "
                  "to other nodes are not built yet: files stay on their writer ('local')");
    c->add_option("--block-size", *block, "Block size (power of two, 4KiB..64MiB; default 4MiB)");
    AddMetaFlags(c, meta_flags.get());
    c->add_flag("--json", *as_json, "Print JSON");
    c->callback([=] {
      rpc::AddVolumeRequest r;
      r.set_name(*name);
      r.set_origin(absl::StartsWith(*origin, "file://") ? origin->substr(7) : *origin);
      r.set_replicas(*replicas);
      if (!block->empty()) {
        auto bs = ParseSize(*block);
        if (!bs.ok()) Fail(bs.status());
        r.set_block_size(*bs);
      }
      auto v = client()->AddVolume(r);
      if (!v.ok()) Fail(v.status());
      if (*as_json) {
        std::cout << VolumeJson(*v).dump(2) << "\n";
        return;
      }
      std::cout << "added volume " << v->name() << " (" << v->replicas() << " replica(s), origin "
                << v->origin() << ")\n"
                << "files closed on a node are on " << v->replicas()
                << " node(s) at once and written back to " << v->origin()
                << " in the background (docs/operations.md, \"Checkpoints\")\n";
    });
  }

  // ls
  {
    auto* c = vol->add_subcommand("ls", "List volumes");
    AddMetaFlags(c, meta_flags.get());
    c->add_flag("--json", *as_json, "Print JSON");
    c->callback([=] {
      auto r = client()->ListVolumes();
      if (!r.ok()) Fail(r.status());
      if (*as_json) {
        json arr = json::array();
        for (const auto& v : *r) arr.push_back(VolumeJson(v));
        std::cout << arr.dump(2) << "\n";
        return;
      }
      std::vector<std::vector<std::string>> rows{{"NAME", "ID", "REPLICAS", "BLOCK", "ORIGIN"}};
      for (const auto& v : *r) {
        rows.push_back({v.name(), std::to_string(v.id()), std::to_string(v.replicas()),
                        FormatBytes(v.block_size()), v.origin()});
      }
      PrintTable(rows);
    });
  }

  // status
  {
    auto* c = vol->add_subcommand("status", "Each file of a volume: local, replicated, persisted");
    auto name = std::make_shared<std::string>();
    c->add_option("NAME", *name, "Volume name")->required();
    AddMetaFlags(c, meta_flags.get());
    c->add_flag("--json", *as_json, "Print JSON");
    c->callback([=] {
      auto r = client()->VolumeStatus(*name);
      if (!r.ok()) Fail(r.status());
      if (*as_json) {
        json files = json::array();
        for (const auto& f : r->files()) {
          json holders = json::array();
          for (const auto& h : f.holders()) holders.push_back(h);
          files.push_back(json{{"path", f.name()},
                               {"size", f.size()},
                               {"state", meta::VolumeStateName(f.state())},
                               {"holders", holders},
                               {"writer", f.writer()},
                               {"origin_path", f.persisted_path()},
                               {"generation", f.generation()}});
        }
        json j = VolumeJson(r->volume());
        j["files"] = files;
        j["bytes_unpersisted"] = r->bytes_unpersisted();
        json gone = json::array();  // removed or replaced files' copies still in the origin
        for (const auto& g : r->discarded()) {
          gone.push_back({{"origin_path", g.persisted_path()}, {"size", g.size()}});
        }
        j["origin_deletions_waiting"] = gone;
        std::cout << j.dump(2) << "\n";
        return;
      }
      std::vector<std::vector<std::string>> rows{{"PATH", "SIZE", "STATE", "HOLDERS", "WRITER"}};
      for (const auto& f : r->files()) {
        rows.push_back({f.name(), FormatBytes(f.size()), meta::VolumeStateName(f.state()),
                        Holders(f), f.writer().empty() ? "-" : f.writer()});
      }
      PrintTable(rows);
      std::cout << "\n"
                << r->files_size() << " file(s), " << FormatBytes(r->bytes_unpersisted())
                << " waiting to upload to " << r->volume().origin();
      if (r->discarded_size() > 0) {
        std::cout << "; " << r->discarded_size()
                  << " copy(ies) of removed or replaced files waiting to be deleted there";
      }
      std::cout << "\n";
    });
  }

  // rm
  {
    auto* c = vol->add_subcommand("rm", "Remove a volume from meta (its origin is kept)");
    auto name = std::make_shared<std::string>();
    c->add_option("NAME", *name, "Volume name")->required();
    AddMetaFlags(c, meta_flags.get());
    c->callback([=] {
      auto st = client()->RemoveVolume(*name);
      if (!st.ok()) Fail(st);
      std::cout << "removed volume " << *name << "\n";
    });
  }
}

}  // namespace ember::tools
