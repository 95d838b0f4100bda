// sched_bench: the scheduler at scale through the real API (make bench). Not a test.
//
//   sched_bench NODES PODS
//
// Starts a real MetaServer (gRPC on 127.0.0.1), registers NODES simulated nodes (8 GPUs each,
// 20 switches, 2 switches per rack), adds 5 datasets and reports each warm on a random subset of
// nodes, then submits jobs of varied gang sizes (1-8 workers of 1, 2, 4 or 8 GPUs) until PODS
// workers are placed, one SubmitJob RPC per job. Prints end-to-end pods/s, the in-process
// scheduling time of the same stream (PlaceGang on a snapshot, no RPC), and placement quality:
// the mean fraction of each job's dataset resident on its nodes, ours vs first-fit.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "meta/meta_client.h"
#include "meta/meta_server.h"
#include "meta/scheduler.h"

using namespace ember;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: sched_bench NODES PODS\n");
    return 2;
  }
  const int num_nodes = std::atoi(argv[1]), pods = std::atoi(argv[2]);
  spdlog::set_level(spdlog::level::warn);  // keep stdout to the result line
  std::string dir = fs::temp_directory_path() / absl::StrCat("ember-sched-", getpid());
  fs::create_directories(dir);
  meta::MetaOptions mo;
  mo.listen = "127.0.0.1:0";
  mo.data_dir = dir + "/meta";
  mo.lease = std::chrono::hours(1);
  auto server = meta::MetaServer::Start(mo);
  if (!server.ok()) return 1;
  meta::MetaClient client(absl::StrCat("127.0.0.1:", (*server)->port()), std::chrono::seconds(60));

  std::mt19937 rng(42);
  std::vector<meta::SchedNode> sim;
  for (int i = 0; i < num_nodes; i++) {
    rpc::Node n;
    n.set_id(absl::StrCat("node-", i));
    n.set_address(absl::StrCat("10.0.", i / 250, ".", i % 250, ":7371"));
    int sw = i % 20;
    (*n.mutable_labels())["switch"] = absl::StrCat("sw", sw);
    (*n.mutable_labels())["rack"] = absl::StrCat("rack", sw / 2);
    n.set_gpus(8);
    if (!client.RegisterNode(n).ok()) return 1;
    sim.push_back({n.id(), absl::StrCat("sw", sw), absl::StrCat("rack", sw / 2), 8, 0, true,
                   static_cast<size_t>(i), sw, sw / 2});
  }
  // 5 datasets of 20 sparse 4 MiB files, each warm on a random ~20% of nodes.
  std::map<std::string, std::map<std::string, double>> warm;
  std::vector<std::string> datasets;
  for (int d = 0; d < 5; d++) {
    std::string origin = absl::StrCat(dir, "/origin", d);
    fs::create_directories(origin);
    for (int f = 0; f < 20; f++) {
      int fd = open(absl::StrCat(origin, "/f", f).c_str(), O_WRONLY | O_CREAT, 0644);
      (void)ftruncate(fd, 4 << 20);
      close(fd);
    }
    std::string name = absl::StrCat("ds", d);
    auto added = client.AddDataset(name, origin, 0);
    if (!added.ok()) return 1;
    datasets.push_back(name);
    for (const auto& n : sim) {
      if (rng() % 5 != 0) continue;
      rpc::ReportBlocksRequest r;
      r.set_node_id(n.id);
      for (uint64_t f = 2; f <= 21; f++) {
        auto* fb = r.add_files();
        fb->set_dataset_id(added->dataset().id());
        fb->set_version(1);
        fb->set_file_id(f);
        fb->set_bitmap(std::string(1, '\x01'));
      }
      if (!client.ReportBlocks(r).ok()) return 1;
      warm[name][n.id] = 1.0;
    }
  }
  // The job stream.
  struct Req {
    meta::GangRequest gang;
    std::string dataset;
  };
  std::vector<Req> stream;
  int total = 0;
  const uint32_t gpu_choices[] = {1, 2, 4, 8};
  while (total < pods) {
    Req r;
    r.gang.workers = std::min<uint32_t>(1 + rng() % 8, pods - total);
    r.gang.gpus_per_worker = gpu_choices[rng() % 4];
    r.dataset = datasets[rng() % datasets.size()];
    stream.push_back(r);
    total += r.gang.workers;
  }

  // In-process: the same stream on a snapshot, ours and first-fit.
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < sim.size(); i++) index[sim[i].id] = i;
  std::map<std::string, std::vector<double>> slot_warm;  // as meta caches it, by node slot
  for (const auto& [ds, w] : warm) {
    auto& v = slot_warm[ds];
    v.assign(sim.size(), 0.0);
    for (const auto& [id, f] : w) v[index[id]] = f;
  }
  auto in_process = [&](bool first_fit, double* quality, int* placed_pods) {
    std::vector<meta::SchedNode> nodes = sim;
    double sum = 0;
    int jobs = 0;
    *placed_pods = 0;
    auto t = std::chrono::steady_clock::now();
    for (const auto& r : stream) {
      const std::vector<double>& by_slot = slot_warm[r.dataset];
      auto loc = [&](const meta::SchedNode& n) { return by_slot[n.slot]; };
      auto p = meta::PlaceGang(r.gang, nodes, loc, 0, first_fit);
      if (p.empty()) continue;
      double q = 0;
      for (const auto& n : p[0].nodes) {
        nodes[index[n]].used += r.gang.gpus_per_worker;
        q += loc(nodes[index[n]]);
      }
      sum += q / p[0].nodes.size();
      jobs++;
      *placed_pods += r.gang.workers;
    }
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    *quality = jobs ? sum / jobs : 0;
    return ms;
  };
  double q_ours, q_ff;
  int p_ours, p_ff;
  double ms_ours = in_process(false, &q_ours, &p_ours);
  in_process(true, &q_ff, &p_ff);

  // End to end through gRPC.
  int placed = 0, queued = 0;
  auto t = std::chrono::steady_clock::now();
  for (size_t i = 0; i < stream.size(); i++) {
    rpc::JobSpec spec;
    spec.set_name(absl::StrCat("job-", i));
    spec.set_workers(stream[i].gang.workers);
    spec.set_gpus_per_worker(stream[i].gang.gpus_per_worker);
    spec.set_dataset(stream[i].dataset);
    auto j = client.SubmitJob(spec);
    if (!j.ok()) {
      std::fprintf(stderr, "submit: %s\n", std::string(j.status().message()).c_str());
      return 1;
    }
    if (j->state() == rpc::Job::RUNNING) {
      placed += j->spec().workers();
    } else {
      queued += j->spec().workers();
    }
  }
  double e2e_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  std::printf(
      "| %d nodes, %d pods (%zu jobs) | %.0f ms end to end, %.0f pods/s | %.1f ms | %.2f vs %.2f "
      "first-fit |\n",
      num_nodes, pods, stream.size(), e2e_ms, (placed + queued) / (e2e_ms / 1000), ms_ours, q_ours,
      q_ff);
  std::fprintf(stderr, "placed %d pods, queued %d (the cluster has %d GPUs)\n", placed, queued,
               num_nodes * 8);
  (*server)->Shutdown();
  fs::remove_all(dir);
  return 0;
}
