// `ember node` (one node agent against a meta service) and `ember up` (meta + node + mount in
// one process: the whole system on one machine).
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cachefs/fuse/supervisor.h"
#include "cachefs/fuse/takeover.h"
#include "cachefs/node_agent.h"
#include "common/http_server.h"
#include "common/units.h"
#include "meta/meta_client.h"
#include "meta/meta_server.h"
#include "tools/cli.h"

namespace ember::tools {
namespace {

struct NodeFlags {
  std::string listen = "127.0.0.1:7371";
  std::string cache_dir;
  std::string cache_size;
  std::string volume_space;
  std::string mount;
  std::string node_id;
  std::string labels;
  uint32_t gpus = 0;
  bool allow_other = false;
  int readahead = 8;
  int recent_blocks = 48;
  std::string transport = "auto";
  int rdma_tclass = 0;
  std::string rdma_memory = "512MiB";
  std::string warm_memory = "512MiB";
  std::string peer_timeout = "3s";
  std::string prefetch_owner_grace = "15s";
  uint64_t manifest_copy_max_entries = 2'000'000;
  std::string metrics_listen;
  std::string metrics_open = "/healthz";
  std::string fuse_binding = "kernel";
  bool no_passthrough = false;
  bool buffered_cache_writes = false;
  std::string small_file_max = "256KiB";
  std::string scrub_rate = "auto";
  bool readdirplus = false;
  bool direct_io = false;
  bool fuse_uring = false;
  bool fuse_no_open = false;
  std::string fuse_readahead = "4MiB";
  std::string fuse_request = "4MiB";
  bool takeover = false;
  bool supervise = false;
  std::string ready_file;
  MetaFlags meta;  // --token-file is also the token peers prove to each other
};

void AddNodeFlags(CLI::App* c, NodeFlags* f, bool for_up) {
  c->add_option("--mount", f->mount, "Directory to mount datasets at")->required();
  c->add_option("--cache-dir", f->cache_dir, "Local directory for cached blocks");
  c->add_option("--cache-size", f->cache_size, "Cache capacity, e.g. 100GiB");
  c->add_option("--volume-space", f->volume_space,
                "Disk space for writable volumes' files (default: as --cache-size); files not "
                "yet in the origin are never dropped: writers wait, then get ENOSPC");
  c->add_option(for_up ? "--node-listen" : "--listen", f->listen,
                "HOST:PORT peers reach this node on")
      ->capture_default_str();
  c->add_option("--node-id", f->node_id, "Node id (default: host name)");
  c->add_option("--labels", f->labels, "Topology labels, e.g. rack=r1,switch=s1");
  c->add_option("--gpus", f->gpus, "GPUs on this node (for the scheduler)");
  c->add_flag("--allow-other", f->allow_other, "Let other users read the mount");
  c->add_option("--readahead", f->readahead,
                "Most blocks to read ahead of a sequential reader (the window grows to it; 0: "
                "none)")
      ->capture_default_str();
  c->add_option("--recent-blocks", f->recent_blocks,
                "Blocks just filled kept in memory besides the readahead window (small reads "
                "of them, and peers that want them next, are served from there)")
      ->capture_default_str();
  c->add_option("--rdma-tclass", f->rdma_tclass,
                "RoCE traffic class of RDMA packets (DSCP << 2, e.g. 104 for DSCP 26; 0-255)")
      ->capture_default_str();
  c->add_option("--rdma-memory", f->rdma_memory,
                "Registered (pinned) memory for RDMA buffers, per direction; needs "
                "RLIMIT_MEMLOCK above twice this")
      ->capture_default_str();
  c->add_option("--warm-memory", f->warm_memory,
                "Memory for blocks in flight faulted in at start and kept (a fixed part of the "
                "agent's RSS; 0 = none): a prefetch's first seconds then do not wait on page "
                "faults")
      ->capture_default_str();
  c->add_option("--transport", f->transport, "Peer transport: auto, tcp or rdma")
      ->capture_default_str();
  c->add_option("--metrics-listen", f->metrics_listen,
                "HOST:PORT to serve Prometheus /metrics on (default: off)");
  c->add_option("--metrics-open", f->metrics_open,
                "With a cluster token, HTTP paths served without it (comma-separated), e.g. "
                "/healthz,/metrics for a Prometheus without the token")
      ->capture_default_str();
  c->add_option("--prefetch-owner-grace", f->prefetch_owner_grace,
                "A prefetch reads the origin for a block itself when the node that should fetch "
                "it has delivered nothing for this long (it died)")
      ->capture_default_str();
  c->add_option("--manifest-copy-max-entries", f->manifest_copy_max_entries,
                "Keep a copy on disk of every dataset's latest manifest of at most this many "
                "entries ahead of use, so datasets stay browsable while meta is down (larger "
                "ones: once used; 0: only used ones)")
      ->capture_default_str();
  c->add_option("--peer-timeout", f->peer_timeout,
                "A peer silent this long is skipped (and avoided for 10 s)")
      ->capture_default_str();
  c->add_option("--fuse-binding", f->fuse_binding,
                "FUSE binding: kernel (speaks /dev/fuse itself: passthrough, takeover) or libfuse")
      ->capture_default_str();
  c->add_flag("--no-passthrough", f->no_passthrough,
              "Serve every read through the agent, also of fully cached files");
  c->add_option("--fuse-readahead", f->fuse_readahead,
                "Readahead window of the mount for reads served by the agent (0: kernel default)")
      ->capture_default_str();
  c->add_option("--fuse-request-size", f->fuse_request,
                "Largest FUSE read request (kernel binding; 4KiB..4MiB; above 1MiB the agent "
                "raises fs.fuse.max_pages_limit when it is root)")
      ->capture_default_str();
  c->add_flag("--readdirplus", f->readdirplus,
              "Listings carry attributes (faster `ls -l`; `find` and scandir of large folders "
              "several times slower)");
  c->add_flag("--direct-io", f->direct_io,
              "Read files not yet cached without the mount's page cache (faster cold reads in "
              "large requests; small reads become one round trip each)");
  c->add_flag("--fuse-uring", f->fuse_uring,
              "Answer FUSE requests over io_uring, on the CPU that made each (Linux 6.14+ with "
              "the fuse module's enable_uring on); not with --takeover/--supervise");
  c->add_flag("--fuse-no-open", f->fuse_no_open,
              "The kernel opens files without asking the agent (no OPEN/RELEASE requests: a file "
              "in the page cache is read with none at all); no passthrough. For datasets of many "
              "small files; kernel binding");
  c->add_flag("--buffered-cache-writes", f->buffered_cache_writes,
              "Write filled blocks through the page cache instead of with O_DIRECT");
  c->add_option("--small-file-max", f->small_file_max,
                "Files of at most this size are packed into the cache's segment files (no cache "
                "file each, no passthrough: the mount's page cache serves them); 0: none")
      ->capture_default_str();
  c->add_option("--scrub-rate", f->scrub_rate,
                "Pace of the background check of every cached block on disk, per second (e.g. "
                "64MiB; a block counts as at least 64 KiB; auto: a full pass per day of "
                "--cache-size; 0: off)")
      ->capture_default_str();
  if (!for_up) {
    c->add_flag("--supervise", f->supervise,
                "Run the agent under a small supervisor that keeps the mount: if the agent "
                "crashes, its restart reattaches it (open files keep working); a supervisor "
                "already running on the cache dir hands its mount over (an upgrade)");
    c->add_option("--ready-file", f->ready_file,
                  "With --supervise: a file holding the agent's pid while it serves this "
                  "supervisor's mount (absent otherwise), for a readiness probe");
  }
  c->add_flag("--takeover", f->takeover,
              "Take the mount over from the agent running on this cache dir (no unmount: open "
              "files keep working); mounts afresh if none runs");
  if (for_up) {
    c->add_option("--token-file", f->meta.token_file,
                  "File holding the cluster token (gRPC callers and peers must prove it)");
  } else {
    AddMetaFlags(c, &f->meta);
  }
}

cachefs::NodeOptions ToNodeOptions(const NodeFlags& f, const std::string& meta_address,
                                   uint64_t default_cache) {
  cachefs::NodeOptions o;
  o.meta_address = meta_address;
  if (auto s = ValidateHostPort("--listen", f.listen); !s.ok()) Fail(s);
  o.listen = f.listen;
  o.node_id = f.node_id;
  o.gpus = f.gpus;
  o.cache_dir = f.cache_dir;
  o.mountpoint = f.mount;
  o.mount.allow_other = f.allow_other;
  o.readahead_blocks = f.readahead;
  o.recent_blocks = f.recent_blocks;
  o.fuse_binding = f.fuse_binding;
  o.mount.passthrough = !f.no_passthrough;
  o.direct_cache_writes = !f.buffered_cache_writes;
  {
    auto m = ParseSize(f.small_file_max);
    if (!m.ok()) Fail(absl::StrCat("--small-file-max: ", m.status().message()));
    o.small_file_max = *m;
  }
  if (f.scrub_rate != "auto") {
    std::string rate = f.scrub_rate;
    if (rate.size() > 2 && rate.substr(rate.size() - 2) == "/s") rate.resize(rate.size() - 2);
    auto r = ParseSize(rate);
    if (!r.ok()) Fail(absl::StrCat("--scrub-rate: ", r.status().message()));
    o.scrub_rate = static_cast<int64_t>(*r);
  }
  o.mount.readdirplus = f.readdirplus;
  o.mount.direct_io = f.direct_io;
  o.mount.fuse_uring = f.fuse_uring;
  o.mount.no_open = f.fuse_no_open;
  if (f.fuse_no_open && f.fuse_binding != "kernel") {
    Fail("--fuse-no-open needs --fuse-binding kernel");
  }
  if (f.fuse_uring && f.fuse_binding != "kernel") Fail("--fuse-uring needs --fuse-binding kernel");
  if (f.fuse_uring && (f.takeover || f.supervise)) {
    Fail(
        "--fuse-uring cannot be combined with --takeover or --supervise (io_uring rings are not "
        "handed over)");
  }
  o.takeover = f.takeover;
  if (const char* sup = std::getenv(cachefs::kSupervisorFdEnv); sup != nullptr && *sup != '\0') {
    int fd = -1;
    if (absl::SimpleAtoi(sup, &fd) && fd >= 0) o.supervisor_fd = fd;
    unsetenv(cachefs::kSupervisorFdEnv);
  }
  auto mode = transport::ParseTransportMode(f.transport);
  if (!mode.ok()) Fail(mode.status());
  o.transport = *mode;
  if (f.rdma_tclass < 0 || f.rdma_tclass > 255) Fail("--rdma-tclass must be 0-255");
  o.rdma_traffic_class = static_cast<uint8_t>(f.rdma_tclass);
  auto rdma_memory = ParseSize(f.rdma_memory);
  if (!rdma_memory.ok()) Fail(rdma_memory.status());
  if (*rdma_memory < (4u << 20)) Fail("--rdma-memory must be at least 4MiB (one block)");
  o.rdma_memory = *rdma_memory;
  auto warm_memory = ParseSize(f.warm_memory);
  if (!warm_memory.ok()) Fail(warm_memory.status());
  if (const long pages = sysconf(_SC_PHYS_PAGES); pages > 0) {
    const uint64_t half = static_cast<uint64_t>(pages) * static_cast<uint64_t>(getpagesize()) / 2;
    if (*warm_memory > half) {
      Fail(absl::StrCat("--warm-memory ", f.warm_memory, " is more than half of this machine's ",
                        half >> 29, " GiB of memory"));
    }
  }
  o.warm_memory = *warm_memory;
  auto peer_timeout = ParseDuration(f.peer_timeout);
  if (!peer_timeout.ok()) Fail(peer_timeout.status());
  if (peer_timeout->count() < 10) Fail("--peer-timeout must be at least 10ms");
  o.peer_timeout = *peer_timeout;
  auto grace = ParseDuration(f.prefetch_owner_grace);
  if (!grace.ok()) Fail(grace.status());
  o.prefetch_owner_grace = *grace;
  o.manifest_copy_max_entries = f.manifest_copy_max_entries;
  if (!f.metrics_listen.empty()) {
    if (auto s = ValidateHostPort("--metrics-listen", f.metrics_listen); !s.ok()) Fail(s);
  }
  o.metrics_listen = f.metrics_listen;
  auto open_paths = HttpAccess::ParsePaths(f.metrics_open);
  if (!open_paths.ok()) Fail(absl::StrCat("--metrics-open: ", open_paths.status().message()));
  o.metrics_open_paths = *open_paths;
  auto creds = ResolveCredentials(f.meta);
  o.token = creds.token;
  o.tls_ca_file = creds.tls_ca_file;
  if (f.cache_size.empty()) {
    if (default_cache == 0) Fail("--cache-size is required");
    o.cache_bytes = default_cache;
  } else {
    auto size = ParseSize(f.cache_size);
    if (!size.ok()) Fail(size.status());
    if (*size == 0) Fail("--cache-size must be larger than 0");
    o.cache_bytes = *size;
  }
  o.volume_bytes = o.cache_bytes;
  if (!f.volume_space.empty()) {
    auto size = ParseSize(f.volume_space);
    if (!size.ok()) Fail(size.status());
    if (*size == 0) Fail("--volume-space must be larger than 0");
    o.volume_bytes = *size;
  }
  auto ra = ParseSize(f.fuse_readahead);
  if (!ra.ok()) Fail(ra.status());
  if (*ra > (1ull << 30)) Fail("--fuse-readahead must be at most 1GiB");
  o.mount.readahead_kb = static_cast<uint32_t>(*ra / 1024);
  auto rq = ParseSize(f.fuse_request);
  if (!rq.ok()) Fail(rq.status());
  if (*rq < 4096 || *rq > (4u << 20) || *rq % 4096 != 0) {
    Fail("--fuse-request-size must be a multiple of 4KiB from 4KiB to 4MiB");
  }
  o.mount.max_pages = static_cast<uint32_t>(*rq / 4096);
  if (!f.labels.empty()) {
    for (const std::string& part :
         std::vector<std::string>(absl::StrSplit(f.labels, ',', absl::SkipEmpty()))) {
      size_t eq = part.find('=');
      if (eq == std::string::npos || eq == 0) {
        Fail(absl::StrCat("--labels: '", part, "' is not KEY=VALUE"));
      }
      o.labels[part.substr(0, eq)] = part.substr(eq + 1);
    }
  }
  return o;
}

// Runs an agent until SIGINT/SIGTERM; `also_stop` runs on the signal too.
void RunAgent(const cachefs::NodeOptions& options, const std::function<void()>& also_stop) {
  auto agent = cachefs::NodeAgent::Start(options);
  if (!agent.ok()) {
    if (also_stop) also_stop();
    Fail(agent.status());
  }
  std::thread waiter([&] {
    int sig = WaitForTerminationSignal();
    if ((*agent)->HandedOver()) {
      spdlog::info("node: the mount was handed to a successor; exiting");
    } else if (sig > 0) {
      spdlog::info("node: signal {}, unmounting", sig);
    }
    (*agent)->Stop();
    if (also_stop) also_stop();
  });
  (*agent)->Run();
  // The mount may also end from outside (fusermount -u): wake the waiter then.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
}

std::vector<std::string> CommandLine() {
  std::vector<std::string> args;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
  return args;
}

// `ember node --supervise`: the agent is this command line without --supervise, run under
// cachefs's supervisor (cachefs/fuse/supervisor.h), which keeps the mount across its crashes.
std::vector<std::string> SupervisedAgentArgs() {
  std::vector<std::string> args = CommandLine();
  args.erase(std::remove(args.begin(), args.end(), "--supervise"), args.end());
  return args;
}

std::string DefaultDataDir() {
  if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x) return absl::StrCat(x, "/ember");
  if (const char* h = std::getenv("HOME"); h && *h) {
    return absl::StrCat(h, "/.local/share/ember");
  }
  return "/var/tmp/ember";
}

}  // namespace

void AddNodeCommands(CLI::App& app) {
  {
    auto* c = app.add_subcommand("node", "Run a node agent: block cache + FUSE mount");
    auto f = std::make_shared<NodeFlags>();
    AddNodeFlags(c, f.get(), false);
    c->callback([=] {
      if (f->cache_dir.empty()) Fail("--cache-dir is required");
      auto o = ToNodeOptions(*f, meta::ResolveMetaAddress(f->meta.address), 0);
      BlockTerminationSignals();
      if (f->supervise) {
        if (f->fuse_binding != "kernel") Fail("--supervise needs --fuse-binding kernel");
        sigset_t hup;  // an in-place upgrade (supervisor.h)
        sigemptyset(&hup);
        sigaddset(&hup, SIGHUP);
        pthread_sigmask(SIG_BLOCK, &hup, nullptr);
        auto code =
            cachefs::Supervise(SupervisedAgentArgs(), {CommandLine(), f->cache_dir, f->ready_file});
        if (!code.ok()) Fail(code.status());
        std::exit(*code);
      }
      RunAgent(o, {});
    });
  }
  {
    // Asked by a supervisor before it hands its mount to this binary in place (supervisor.h).
    auto* c = app.add_subcommand("handover-protocol",
                                 "Print the handover protocols this binary speaks: OLDEST CURRENT");
    c->group("");  // not for users
    c->callback([] {
      const cachefs::HandoverProtocol p = cachefs::OwnHandoverProtocol();
      std::printf("%d %d\n", p.oldest, p.current);
    });
  }
  {
    auto* c = app.add_subcommand(
        "up", "Run meta, a node agent and the mount in one process (one-machine Ember)");
    auto f = std::make_shared<NodeFlags>();
    auto datasets = std::make_shared<std::vector<std::string>>();
    auto data_dir = std::make_shared<std::string>();
    auto listen = std::make_shared<std::string>(meta::kDefaultMetaAddress);
    AddNodeFlags(c, f.get(), true);
    c->add_option("--dataset", *datasets, "NAME=ORIGIN to add if missing (repeatable)");
    c->add_option("--data-dir", *data_dir,
                  "Where meta and the cache live (default "
                  "~/.local/share/ember)");
    c->add_option("--listen", *listen, "HOST:PORT meta serves on")->capture_default_str();
    auto http = std::make_shared<std::string>();
    c->add_option("--http", *http,
                  "HOST:PORT for the status page, /metrics and the scheduler extender");
    c->callback([=] {
      if (!http->empty()) {
        if (auto s = ValidateHostPort("--http", *http); !s.ok()) Fail(s);
      }
      std::string dir = data_dir->empty() ? DefaultDataDir() : *data_dir;
      if (f->cache_dir.empty()) f->cache_dir = dir + "/cache";
      std::error_code ec;
      std::filesystem::create_directories(f->mount, ec);
      std::filesystem::create_directories(f->cache_dir, ec);
      // Default capacity: 10 GiB, or 80% of the cache disk's free space if that is less.
      uint64_t default_cache = 10ull << 30;
      struct statvfs vfs;
      if (statvfs(f->cache_dir.c_str(), &vfs) == 0) {
        uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
        default_cache =
            std::max<uint64_t>(64ull << 20, std::min(default_cache, free_bytes / 5 * 4));
      }
      if (auto s = ValidateHostPort("--listen", *listen); !s.ok()) Fail(s);
      auto o = ToNodeOptions(*f, *listen, default_cache);
      if (o.node_id.empty()) o.node_id = "local";
      BlockTerminationSignals();
      meta::MetaOptions mo;
      mo.listen = *listen;
      mo.data_dir = dir + "/meta";
      mo.lease = std::chrono::seconds(3);  // one machine: heartbeats every second
      mo.token = o.token;
      mo.http_listen = *http;
      auto server = meta::MetaServer::Start(mo);
      if (!server.ok()) Fail(server.status());
      meta::MetaClient client(*listen, meta::MetaCredentials{o.token, ""});
      for (const std::string& spec : *datasets) {
        size_t eq = spec.find('=');
        if (eq == std::string::npos || eq == 0) {
          (*server)->Shutdown();
          Fail(absl::StrCat("--dataset '", spec, "' must be NAME=ORIGIN"));
        }
        std::string name = spec.substr(0, eq), origin = spec.substr(eq + 1);
        auto existing = client.GetDataset(name);
        if (existing.ok()) continue;
        Progress p("scanning " + origin);
        auto r = client.AddDataset(name, origin, 0, [&](const rpc::DatasetProgress& m) {
          if (!m.done()) p.Update(m.entries_scanned(), "entries");
        });
        p.Finish("");
        if (!r.ok()) {
          (*server)->Shutdown();
          Fail(r.status());
        }
        spdlog::info("up: dataset {} from {} ({} entries)", name, origin, r->entries_scanned());
      }
      std::printf("ember up: meta on %s, datasets mounted at %s (Ctrl-C to stop)\n",
                  listen->c_str(), f->mount.c_str());
      std::fflush(stdout);
      RunAgent(o, [&] { (*server)->Shutdown(); });
    });
  }
}

}  // namespace ember::tools
