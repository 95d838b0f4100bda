// The `ember` command: one binary, sub-commands (see README.md and `ember --help`).
#include <execinfo.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"
#ifdef EMBER_TCMALLOC
#include <gperftools/malloc_extension.h>
#endif
#include "tools/cli.h"

namespace {

// A crash leaves a stack trace in the log (async-signal-safe calls only), then dies as it would.
void OnFatalSignal(int sig) {
  const char msg[] = "ember: fatal signal; stack trace follows\n";
  (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
  void* frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, OnFatalSignal);
  // Debian's abseil is built with its debug checks, which record every Mutex acquisition in a
  // global lock-order graph (a global lock per Lock). Lock order is checked at build time here
  // (`make tsa`) and the test binaries keep the runtime check; the agent does without it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#ifdef EMBER_TCMALLOC
  // Free memory goes back to the system only where the code says so (common/memory.h,
  // ReleaseFreeMemory: after a manifest is built, a prefetch, an idle spell), not a span now and
  // then as tcmalloc frees: one such span can be the agent's whole --warm-memory reserve.
  MallocExtension::instance()->SetMemoryReleaseRate(0);
#endif
  // Open files up to the hard limit (the agent keeps cache files open and reads folders of
  // small files a batch at a time; meta's RocksDB keeps its tables open): a soft limit of 1,024
  // is a shell's default, not a choice.
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  CLI::App app{"Ember: a distributed data cache for training clusters"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ember 0.1.0");
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  ember::tools::AddMetaCommand(app);
  ember::tools::AddDatasetCommand(app);
  ember::tools::AddVolumeCommand(app);
  ember::tools::AddStatusCommand(app);
  ember::tools::AddNodeCommands(app);
  ember::tools::AddPrefetchCommands(app);
  ember::tools::AddJobCommands(app);
  ember::tools::AddCacheCommands(app);
  ember::tools::AddBenchCommands(app);
  ember::tools::AddCsiCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
