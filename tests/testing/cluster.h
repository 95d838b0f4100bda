// Real Ember processes for integration tests: an `ember meta` on a free 127.0.0.1 port with its
// own data dir, restartable after a kill.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "meta/meta_client.h"
#include "tests/testing/testing.h"

namespace ember::testing {

class MetaProcess {
 public:
  // Starts meta under dir/meta (data) and waits until it answers.
  // `credentials`: what the test's client() uses (token, TLS CA) when extra_args secure meta.
  explicit MetaProcess(const std::string& dir, const std::string& lease = "10s",
                       std::vector<std::string> extra_args = {},
                       const meta::MetaCredentials& credentials = {});
  ~MetaProcess();

  const std::string& address() const { return address_; }
  meta::MetaClient& client() { return *client_; }
  Process& process() { return *process_; }
  void Kill(int sig);
  // Starts it again on the same address and data dir; waits until it answers.
  void Restart();

 private:
  void Start();
  std::string dir_, lease_, address_;
  std::vector<std::string> extra_args_;
  meta::MetaCredentials credentials_;
  int starts_ = 0;
  std::unique_ptr<Process> process_;
  std::unique_ptr<meta::MetaClient> client_;
};

// An `ember node` process with its own cache dir and mount under `dir`, registered with meta.
class NodeProcess {
 public:
  struct Options {
    std::string id = "n1";
    std::string listen_host = "127.0.0.1";
    std::string cache_size = "1GiB";
    // --warm-memory: none by default (the suite starts hundreds of agents; each would spend
    // CPU faulting in memory no test's few blocks need).
    std::string warm_memory = "0";
    std::vector<std::string> extra_args;
    std::vector<std::string> env;  // NAME=VALUE for the process
  };
  NodeProcess(const std::string& dir, const std::string& meta_address, const Options& options);
  NodeProcess(const std::string& dir, const std::string& meta_address)
      : NodeProcess(dir, meta_address, Options()) {}
  ~NodeProcess();

  const std::string& mount() const { return mount_; }
  const std::string& cache_dir() const { return cache_dir_; }
  const std::string& id() const { return options_.id; }
  // HOST:PORT peers reach it on.
  std::string listen_address() const;
  Process& process() { return *process_; }
  // Starts the agent; waits until its mount is live. Returns false (with the log) if it exits.
  bool Start();
  // SIGTERM and wait; true if it exited cleanly and the mount is gone.
  bool Stop();
  // Starts a successor with the same flags plus --takeover; true once it serves the mount and
  // the predecessor has exited cleanly (the mount never went away).
  bool Takeover();
  // Starts another process with this one's command line (as a DaemonSet's rolling update starts
  // a pod's successor beside it), `env` added, run by `wrapper` (argv before it) if given;
  // Replace makes it this node's process.
  std::unique_ptr<Process> StartTwin(const std::vector<std::string>& env = {},
                                     const std::vector<std::string>& wrapper = {}) const;
  void Replace(std::unique_ptr<Process> process);
  void Kill(int sig);
  // Stats as last heartbeated to meta (fresh within a heartbeat interval).
  rpc::NodeStats Stats(meta::MetaClient& client);
  // Stats once two reads `poll` apart agree (poll longer than the heartbeat interval).
  rpc::NodeStats SettledStats(meta::MetaClient& client, std::chrono::milliseconds poll);
  // The current process's output, after that of attempts of the same Start that failed.
  std::string Log() const;

 private:
  bool StartOnce();
  std::vector<std::string> Argv() const;
  std::string dir_, meta_, mount_, cache_dir_;
  Options options_;
  int port_ = 0;
  mutable int starts_ = 0;
  std::unique_ptr<Process> process_;
  std::string retried_log_;
};

// True if `path` is a mount point now (per /proc/self/mountinfo).
bool IsMounted(const std::string& path);
// Lazily unmounts `path` if something is mounted there.
void ForceUnmount(const std::string& path);

}  // namespace ember::testing
