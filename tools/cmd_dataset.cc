// `ember dataset add|refresh|ls|show|rm`: manage datasets on meta.
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/units.h"
#include "meta/meta_client.h"
#include "tools/cli.h"

namespace ember::tools {
namespace {

using nlohmann::json;

json VersionJson(const rpc::VersionInfo& v) {
  return json{{"version", v.version()},
              {"files", v.files()},
              {"dirs", v.dirs()},
              {"symlinks", v.symlinks()},
              {"bytes", v.bytes()},
              {"skipped", v.skipped()},
              {"created_unix_ms", v.created_unix_ms()}};
}

json DatasetJson(const rpc::Dataset& ds) {
  json versions = json::array();
  for (const auto& v : ds.versions()) versions.push_back(VersionJson(v));
  return json{{"name", ds.name()},
              {"id", ds.id()},
              {"origin", ds.origin()},
              {"block_size", ds.block_size()},
              {"latest_version", ds.latest_version()},
              {"versions", versions}};
}

const rpc::VersionInfo* Latest(const rpc::Dataset& ds) {
  for (const auto& v : ds.versions()) {
    if (v.version() == ds.latest_version()) return &v;
  }
  return nullptr;
}

// Splits "NAME@VERSION"; version 0 when absent.
std::pair<std::string, uint32_t> SplitVersion(const std::string& spec) {
  size_t at = spec.find('@');
  if (at == std::string::npos) return {spec, 0};
  uint32_t v = 0;
  if (!absl::SimpleAtoi(spec.substr(at + 1), &v) || v == 0) {
    Fail(absl::StrCat("'", spec, "': expected NAME@VERSION with a version number >= 1"));
  }
  return {spec.substr(0, at), v};
}

meta::MetaClient::ProgressFn ScanProgress(Progress* p) {
  return [p](const rpc::DatasetProgress& m) {
    if (!m.done()) {
      p->Update(m.entries_scanned(), absl::StrCat("entries, ", FormatBytes(m.bytes_scanned())));
    }
  };
}

}  // namespace

void AddDatasetCommand(CLI::App& app) {
  auto* ds = app.add_subcommand("dataset", "Manage datasets (add, refresh, ls, show, rm)");
  ds->require_subcommand(1);
  auto meta_flags = std::make_shared<MetaFlags>();
  auto as_json = std::make_shared<bool>(false);
  auto client = [meta_flags] { return ConnectMeta(*meta_flags); };
  auto add_common = [&](CLI::App* c) { AddMetaFlags(c, meta_flags.get()); };

  // add
  {
    auto* c = ds->add_subcommand("add", "Scan an origin and add it as a dataset");
    auto name = std::make_shared<std::string>();
    auto origin = std::make_shared<std::string>();
    auto block = std::make_shared<std::string>();
    c->add_option("NAME", *name, "Dataset name")->required();
    c->add_option(
         "ORIGIN", *origin,
         "Absolute directory path, file:///path, s3://bucket/prefix or http(s)://host/path/")
        ->required();
    c->add_option("--block-size", *block,
                  "Block size (power of two, 64KiB..64MiB; default 4MiB, 16MiB for s3:// and "
                  "http(s):// origins)");
    add_common(c);
    c->add_flag("--json", *as_json, "Print JSON");
    c->callback([=] {
      auto bs = block->empty() ? absl::StatusOr<uint64_t>(0) : ParseSize(*block);  // 0: meta picks
      if (!bs.ok()) Fail(bs.status());
      Progress p("scanning " + *origin);
      auto r = client()->AddDataset(*name, *origin, *bs, ScanProgress(&p));
      p.Finish("");
      if (!r.ok()) Fail(r.status());
      const auto& d = r->dataset();
      if (*as_json) {
        std::cout << DatasetJson(d).dump(2) << "\n";
        return;
      }
      const auto* v = Latest(d);
      std::cout << "added dataset " << d.name() << " version " << d.latest_version() << ": "
                << v->files() << " files, " << v->dirs() << " dirs, " << v->symlinks()
                << " symlinks, " << FormatBytes(v->bytes()) << "\n";
      if (v->skipped() > 0) {
        std::cout << "skipped " << v->skipped() << " special files (sockets, fifos, devices)\n";
      }
    });
  }

  // refresh
  {
    auto* c = ds->add_subcommand("refresh", "Rescan the origin; make a new version on change");
    auto name = std::make_shared<std::string>();
    c->add_option("NAME", *name, "Dataset name")->required();
    add_common(c);
    c->add_flag("--json", *as_json, "Print JSON");
    c->callback([=] {
      Progress p("rescanning " + *name);
      auto r = client()->RefreshDataset(*name, ScanProgress(&p));
      p.Finish("");
      if (!r.ok()) Fail(r.status());
      if (*as_json) {
        json j = DatasetJson(r->dataset());
        j["changed"] = r->changed();
        j["added"] = r->added();
        j["removed"] = r->removed();
        j["modified"] = r->modified();
        std::cout << j.dump(2) << "\n";
        return;
      }
      if (!r->changed()) {
        std::cout << "dataset " << *name << " unchanged at version "
                  << r->dataset().latest_version() << "\n";
      } else {
        std::cout << "dataset " << *name << " now at version " << r->dataset().latest_version()
                  << ": " << r->added() << " added, " << r->removed() << " removed, "
                  << r->modified() << " modified\n";
      }
    });
  }

  // ls
  {
    auto* c = ds->add_subcommand("ls", "List datasets");
    add_common(c);
    c->add_flag("--json", *as_json, "Print JSON");
    c->callback([=] {
      auto r = client()->ListDatasets();
      if (!r.ok()) Fail(r.status());
      if (*as_json) {
        json arr = json::array();
        for (const auto& d : *r) arr.push_back(DatasetJson(d));
        std::cout << arr.dump(2) << "\n";
        return;
      }
      std::vector<std::vector<std::string>> rows{
          {"NAME", "ID", "VERSION", "FILES", "SIZE", "BLOCK", "ORIGIN"}};
      for (const auto& d : *r) {
        const auto* v = Latest(d);
        rows.push_back({d.name(), std::to_string(d.id()), std::to_string(d.latest_version()),
                        v ? std::to_string(v->files()) : "-", v ? FormatBytes(v->bytes()) : "-",
                        FormatBytes(d.block_size()), d.origin()});
      }
      PrintTable(rows);
    });
  }

  // show
  {
    auto* c = ds->add_subcommand("show", "Show a dataset and its versions");
    auto spec = std::make_shared<std::string>();
    auto files = std::make_shared<bool>(false);
    c->add_option("NAME", *spec, "Dataset name, or NAME@VERSION with --files")->required();
    c->add_flag("--files", *files, "List every entry of the manifest");
    add_common(c);
    c->add_flag("--json", *as_json, "Print JSON");
    c->callback([=] {
      auto [name, version] = SplitVersion(*spec);
      auto cl = client();
      auto r = cl->GetDataset(name);
      if (!r.ok()) Fail(r.status());
      if (*files) {
        // Paths are rebuilt from parent ids; entries come parents first.
        std::unordered_map<uint64_t, std::string> dirs;
        json arr = json::array();
        auto st = cl->ForEachManifestEntry(name, version, [&](const rpc::FileEntry& e) {
          auto parent = dirs.find(e.parent_id());
          std::string path = parent == dirs.end() || parent->second.empty()
                                 ? e.name()
                                 : parent->second + "/" + e.name();
          if (e.type() == rpc::FileEntry::DIR) dirs[e.file_id()] = path;
          if (e.file_id() == 1) return;
          const char* type = e.type() == rpc::FileEntry::DIR       ? "dir"
                             : e.type() == rpc::FileEntry::SYMLINK ? "link"
                                                                   : "file";
          if (*as_json) {
            arr.push_back(json{{"id", e.file_id()},
                               {"path", path},
                               {"type", type},
                               {"size", e.size()},
                               {"mode", e.mode()},
                               {"mtime_ns", e.mtime_ns()}});
          } else {
            std::cout << type << "\t" << e.size() << "\t" << path;
            if (e.type() == rpc::FileEntry::SYMLINK) std::cout << " -> " << e.link_target();
            std::cout << "\n";
          }
        });
        if (!st.ok()) Fail(st);
        if (*as_json) std::cout << arr.dump(2) << "\n";
        return;
      }
      if (*as_json) {
        std::cout << DatasetJson(*r).dump(2) << "\n";
        return;
      }
      std::cout << "name:        " << r->name() << "\n"
                << "id:          " << r->id() << "\n"
                << "origin:      " << r->origin() << "\n"
                << "block size:  " << FormatBytes(r->block_size()) << "\n"
                << "latest:      " << r->latest_version() << "\n\n";
      std::vector<std::vector<std::string>> rows{
          {"VERSION", "FILES", "DIRS", "SYMLINKS", "SIZE", "CREATED"}};
      for (const auto& v : r->versions()) {
        rows.push_back({std::to_string(v.version()), std::to_string(v.files()),
                        std::to_string(v.dirs()), std::to_string(v.symlinks()),
                        FormatBytes(v.bytes()), FormatTimeMs(v.created_unix_ms())});
      }
      PrintTable(rows);
    });
  }

  // rm
  {
    auto* c = ds->add_subcommand("rm", "Remove a dataset (NAME) or one old version (NAME@V)");
    auto spec = std::make_shared<std::string>();
    c->add_option("NAME", *spec, "Dataset name or NAME@VERSION")->required();
    add_common(c);
    c->callback([=] {
      auto [name, version] = SplitVersion(*spec);
      auto st = client()->RemoveDataset(name, version);
      if (!st.ok()) Fail(st);
      if (version == 0) {
        std::cout << "removed dataset " << name << "\n";
      } else {
        std::cout << "removed version " << version << " of dataset " << name << "\n";
      }
    });
  }
}

}  // namespace ember::tools
