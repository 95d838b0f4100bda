// meta_rpc_bench: the latency of meta's RPCs as a node meets them, against a running meta (one,
// or replicas given as a list): part of bench/bench_meta_ha.sh. Not a test.
//
//   meta_rpc_bench ADDRESSES ORIGIN_DIR CALLS [--json]
//
// Adds a dataset "rpc-bench-PID" of one sparse file under ORIGIN_DIR (which meta must be able to
// read: same machine), then times CALLS calls each, one at a time, of: GetDataset (a read),
// Locate of 16 blocks (a read), RecordChecksums of 16 new claims (a synced, replicated write) and
// ReportBlocks of 16 blocks (an unsynced write). Prints median and 99th percentile per call.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "meta/meta_client.h"

using namespace ember;
namespace fs = std::filesystem;

namespace {

struct Figure {
  std::string call;
  double p50_us = 0, p99_us = 0;
};

// Times `calls` calls of fn; the first error ends the run.
absl::StatusOr<Figure> Time(const std::string& name, int calls,
                            const std::function<absl::Status(int)>& fn) {
  std::vector<double> us;
  us.reserve(calls);
  for (int i = 0; i < calls; i++) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = fn(i);
    const auto t1 = std::chrono::steady_clock::now();
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat(name, ": ", st.message()));
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  return Figure{name, us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: meta_rpc_bench ADDRESSES ORIGIN_DIR CALLS [--json]\n");
    return 2;
  }
  const std::string addresses = argv[1], origin = argv[2];
  const int calls = std::max(1, std::atoi(argv[3]));
  const bool json = argc > 4 && std::strcmp(argv[4], "--json") == 0;
  spdlog::set_level(spdlog::level::warn);
  meta::MetaClient client(addresses, std::chrono::seconds(30));

  const std::string name = absl::StrCat("rpc-bench-", getpid());
  fs::create_directories(origin);
  const std::string file = origin + "/blocks.bin";
  std::ofstream(file).put('x');
  fs::resize_file(file, 1ull << 40);  // 262,144 blocks of 4 MiB
  auto added = client.AddDataset(name, origin, 0);
  if (!added.ok()) {
    std::fprintf(stderr, "meta_rpc_bench: dataset add: %s\n", added.status().ToString().c_str());
    return 1;
  }
  auto ds = client.GetDataset(name);
  if (!ds.ok()) return 1;
  uint64_t file_id = 0;
  absl::Status listed = client.ForEachManifestEntry(name, 0, [&](const rpc::FileEntry& e) {
    if (e.type() == rpc::FileEntry::FILE) file_id = e.file_id();
  });
  if (!listed.ok() || file_id == 0) return 1;
  const uint32_t dataset_id = ds->id(), version = ds->latest_version();
  auto blocks = [&](int i) {
    std::vector<BlockAddr> out;
    for (uint64_t k = 0; k < 16; k++) out.push_back({dataset_id, version, file_id, i * 16ull + k});
    return out;
  };

  rpc::Node node;  // block reports come from a registered node
  node.set_id("rpc-bench");
  node.set_address("127.0.0.1:1");
  if (!client.RegisterNode(node).ok()) return 1;

  std::vector<Figure> figures;
  auto run = [&](const std::string& call, const std::function<absl::Status(int)>& fn) {
    auto f = Time(call, calls, fn);
    if (!f.ok()) {
      std::fprintf(stderr, "meta_rpc_bench: %s\n", f.status().ToString().c_str());
      std::exit(1);
    }
    figures.push_back(*f);
  };
  run("GetDataset", [&](int) { return client.GetDataset(name).status(); });
  run("Locate (16 blocks)", [&](int i) {
    rpc::LocateRequest req;
    for (const auto& b : blocks(i)) *req.add_blocks() = meta::ToProto(b);
    return client.Locate(req).status();
  });
  run("RecordChecksums (16 new claims)", [&](int i) {
    rpc::RecordChecksumsRequest req;
    for (const auto& b : blocks(i)) {
      auto* c = req.add_checksums();
      *c->mutable_block() = meta::ToProto(b);
      c->set_checksum(b.index * 2654435761u + 1);
    }
    return client.RecordChecksums(req).status();
  });
  run("ReportBlocks (16 blocks)", [&](int i) {
    rpc::ReportBlocksRequest req;
    req.set_node_id("rpc-bench");
    for (const auto& b : blocks(i)) *req.add_added() = meta::ToProto(b);
    return client.ReportBlocks(req);
  });
  (void)client.RemoveDataset(name, 0);

  if (json) {
    std::printf("[");
    for (size_t i = 0; i < figures.size(); i++) {
      std::printf("%s{\"call\":\"%s\",\"p50_us\":%.0f,\"p99_us\":%.0f}", i ? "," : "",
                  figures[i].call.c_str(), figures[i].p50_us, figures[i].p99_us);
    }
    std::printf("]\n");
  } else {
    for (const auto& f : figures) {
      std::printf("%-34s median %7.0f us   p99 %7.0f us\n", f.call.c_str(), f.p50_us, f.p99_us);
    }
  }
  return 0;
}
