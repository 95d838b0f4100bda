// Shared pieces of the `ember` command: output helpers, progress display, signal waiting.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "meta/meta_client.h"

namespace CLI {
class App;
}

namespace ember::tools {

// Sub-command registration; each lives in its own cmd_*.cc.
void AddMetaCommand(CLI::App& app);
void AddDatasetCommand(CLI::App& app);
void AddVolumeCommand(CLI::App& app);  // volume add|ls|status|rm
void AddStatusCommand(CLI::App& app);
void AddNodeCommands(CLI::App& app);      // node, up
void AddPrefetchCommands(CLI::App& app);  // prefetch, unpin, locality
void AddJobCommands(CLI::App& app);       // job submit|ls|show|cancel|complete
void AddCacheCommands(CLI::App& app);     // cache verify
void AddBenchCommands(CLI::App& app);     // bench au [generate]
void AddCsiCommand(CLI::App& app);        // csi (the CSI node plugin)

// Prints "ember: <message>" to stderr and exits with code 1.
[[noreturn]] void Fail(const absl::Status& status);
[[noreturn]] void Fail(const std::string& message);

// Left-aligned text table with a header row.
void PrintTable(const std::vector<std::vector<std::string>>& rows);

// Progress of a long operation: a bar redrawn in place on a terminal, plain lines (at most every
// few seconds) otherwise.
class Progress {
 public:
  explicit Progress(std::string label, uint64_t total = 0);
  // done/total in `unit` ("entries", "bytes"); extra is appended (e.g. "1.2 GiB").
  void Update(uint64_t done, const std::string& extra = "");
  void Finish(const std::string& summary);

 private:
  std::string label_;
  uint64_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_;
  bool printed_ = false;
};

// Blocks SIGINT and SIGTERM in this thread (call before starting threads) and later waits for
// one of them. Returns the signal number.
void BlockTerminationSignals();
int WaitForTerminationSignal();

// How a command reaches meta: --meta, --token-file, --tls-ca (each also from $EMBER_META,
// $EMBER_TOKEN_FILE, $EMBER_TLS_CA).
struct MetaFlags {
  std::string address;
  std::string token_file;
  std::string tls_ca;
};
void AddMetaFlags(CLI::App* c, MetaFlags* f);
// The flags resolved against the environment; Fail()s on an unreadable token file.
meta::MetaCredentials ResolveCredentials(const MetaFlags& f);
std::unique_ptr<meta::MetaClient> ConnectMeta(
    const MetaFlags& f, std::chrono::milliseconds timeout = std::chrono::seconds(10));

// "host:port" validation: returns InvalidArgument naming the flag.
absl::Status ValidateHostPort(const std::string& flag, const std::string& value);

std::string FormatTimeMs(int64_t unix_ms);

}  // namespace ember::tools
