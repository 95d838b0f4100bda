#include "tests/testing/cluster.h"

#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ember::testing {

MetaProcess::MetaProcess(const std::string& dir, const std::string& lease,
                         std::vector<std::string> extra_args,
                         const meta::MetaCredentials& credentials)
    : dir_(dir), lease_(lease), extra_args_(std::move(extra_args)), credentials_(credentials) {
  std::filesystem::create_directories(dir_);
  address_ = absl::StrCat("127.0.0.1:", FreePort());
  client_ = std::make_unique<meta::MetaClient>(address_, credentials, std::chrono::seconds(5));
  Start();
}

MetaProcess::~MetaProcess() {
  client_.reset();  // an open channel would make meta's graceful shutdown wait
  if (process_ && process_->Running()) {
    process_->Signal(SIGTERM);
    if (process_->Wait(std::chrono::seconds(10)) < 0) process_->Signal(SIGKILL);
  }
}

void MetaProcess::Start() {
  // Tests run in parallel: a port free a moment ago may be taken by another test's meta. Only
  // this process's own "serving on" line counts as up (a port answering may be someone else's).
  // A first start moves to another port; a restart keeps its address and tries again.
  const bool first = starts_ == 0;
  for (int attempt = 0; attempt < 4; attempt++) {
    std::vector<std::string> argv{EMBER_BINARY, "meta",         "--listen", address_,
                                  "--data-dir", dir_ + "/data", "--lease",  lease_};
    argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
    process_ = std::make_unique<Process>(argv, absl::StrCat(dir_, "/meta-", starts_++));
    auto log = [&] { return process_->Stdout() + process_->Stderr(); };
    WaitFor(
        [&] { return log().find("meta: serving on") != std::string::npos || !process_->Running(); },
        std::chrono::seconds(20));
    if (process_->Running() || log().find("cannot listen") == std::string::npos) break;
    if (first) {
      address_ = absl::StrCat("127.0.0.1:", FreePort());
      client_ = std::make_unique<meta::MetaClient>(address_, credentials_, std::chrono::seconds(5));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }
  bool up = process_->Running() &&
            WaitFor([&] { return client_->ListDatasets().ok() || !process_->Running(); },
                    std::chrono::seconds(20));
  ASSERT_TRUE(up && process_->Running()) << "meta did not start: " << process_->Stderr();
}

void MetaProcess::Kill(int sig) {
  process_->Signal(sig);
  process_->Wait(std::chrono::seconds(10));
}

void MetaProcess::Restart() {
  if (process_->Running()) Kill(SIGKILL);
  Start();
}

bool IsMounted(const std::string& path) {
  std::string all = ReadFile("/proc/self/mountinfo");
  return all.find(" " + path + " ") != std::string::npos;
}

void ForceUnmount(const std::string& path) {
  if (IsMounted(path)) umount2(path.c_str(), MNT_DETACH);
}

NodeProcess::NodeProcess(const std::string& dir, const std::string& meta_address,
                         const Options& options)
    : dir_(dir), meta_(meta_address), options_(options) {
  mount_ = dir_ + "/mnt";
  cache_dir_ = dir_ + "/cache";
  std::filesystem::create_directories(mount_);
  std::filesystem::create_directories(cache_dir_);
  port_ = FreePort(options_.listen_host);
}

NodeProcess::~NodeProcess() {
  if (process_ && process_->Running()) {
    process_->Signal(SIGTERM);
    if (process_->Wait(std::chrono::seconds(10)) < 0) process_->Signal(SIGKILL);
  }
  ForceUnmount(mount_);
}

bool NodeProcess::Start() {
  // Tests run in parallel: a port free a moment ago may be taken; pick another and retry. What
  // a failed attempt logged (e.g. that it removed a stale mount) stays part of Log().
  retried_log_.clear();
  for (int attempt = 0; attempt < 3; attempt++) {
    if (StartOnce()) return true;
    if (Log().find("Address already in use") == std::string::npos) break;
    retried_log_ = Log();
    port_ = FreePort(options_.listen_host);
  }
  ADD_FAILURE() << "node did not mount: " << Log();
  return false;
}

std::vector<std::string> NodeProcess::Argv() const {
  std::vector<std::string> argv{EMBER_BINARY,    "node",
                                "--meta",        meta_,
                                "--listen",      absl::StrCat(options_.listen_host, ":", port_),
                                "--cache-dir",   cache_dir_,
                                "--cache-size",  options_.cache_size,
                                "--mount",       mount_,
                                "--node-id",     options_.id,
                                "--warm-memory", options_.warm_memory};
  argv.insert(argv.end(), options_.extra_args.begin(), options_.extra_args.end());
  // The mount suite runs once per FUSE binding (tests/CMakeLists.txt sets this).
  if (const char* b = std::getenv("EMBER_TEST_FUSE_BINDING"); b != nullptr && *b != '\0') {
    argv.push_back("--fuse-binding");
    argv.push_back(b);
  }
  if (const char* u = std::getenv("EMBER_TEST_FUSE_URING"); u != nullptr && *u == '1') {
    argv.push_back("--fuse-uring");
  }
  return argv;
}

bool NodeProcess::Takeover() {
  std::vector<std::string> argv = Argv();
  argv.push_back("--takeover");
  auto next =
      std::make_unique<Process>(argv, absl::StrCat(dir_, "/node-", starts_++), options_.env);
  bool took = WaitFor(
      [&] {
        return (next->Stdout() + next->Stderr()).find("took over") != std::string::npos ||
               !next->Running();
      },
      std::chrono::seconds(30));
  if (!took || !next->Running()) {
    ADD_FAILURE() << "successor did not take over: " << next->Stdout() << next->Stderr();
    return false;
  }
  int code = process_->Wait(std::chrono::seconds(20));
  if (code != 0) ADD_FAILURE() << "predecessor exited with " << code << ": " << Log();
  process_ = std::move(next);
  retried_log_.clear();
  return code == 0 && IsMounted(mount_);
}

std::unique_ptr<Process> NodeProcess::StartTwin(const std::vector<std::string>& env,
                                                const std::vector<std::string>& wrapper) const {
  std::vector<std::string> all = options_.env;
  all.insert(all.end(), env.begin(), env.end());
  std::vector<std::string> argv = wrapper;
  for (const std::string& a : Argv()) argv.push_back(a);
  return std::make_unique<Process>(argv, absl::StrCat(dir_, "/node-", starts_++), all);
}

std::string NodeProcess::listen_address() const {
  return absl::StrCat(options_.listen_host, ":", port_);
}

void NodeProcess::Replace(std::unique_ptr<Process> process) {
  process_ = std::move(process);
  retried_log_.clear();
}

bool NodeProcess::StartOnce() {
  process_ =
      std::make_unique<Process>(Argv(), absl::StrCat(dir_, "/node-", starts_++), options_.env);
  // Mounted by this process (an old stale mount may still be listed until it is cleaned up).
  bool up = WaitFor(
      [&] {
        return (IsMounted(mount_) &&
                (process_->Stdout() + process_->Stderr()).find("serving datasets at") !=
                    std::string::npos) ||
               !process_->Running();
      },
      std::chrono::seconds(20));
  return up && process_->Running();
}

bool NodeProcess::Stop() {
  process_->Signal(SIGTERM);
  int code = process_->Wait(std::chrono::seconds(20));
  return code == 0 && !IsMounted(mount_);
}

void NodeProcess::Kill(int sig) {
  process_->Signal(sig);
  if (sig == SIGKILL) process_->Wait(std::chrono::seconds(10));
}

namespace {
// The node's stats as meta last heard them; false if meta did not answer or does not list it.
bool FindStats(meta::MetaClient& client, const std::string& id, rpc::NodeStats* out) {
  auto nodes = client.ListNodes();
  if (!nodes.ok()) return false;
  for (const auto& n : *nodes) {
    if (n.id() == id) {
      *out = n.stats();
      return true;
    }
  }
  return false;
}
}  // namespace

rpc::NodeStats NodeProcess::Stats(meta::MetaClient& client) {
  rpc::NodeStats s;
  FindStats(client, options_.id, &s);
  return s;
}

rpc::NodeStats NodeProcess::SettledStats(meta::MetaClient& client, std::chrono::milliseconds poll) {
  // Two answers `poll` apart that agree (an unanswered poll, e.g. meta busy, does not count).
  rpc::NodeStats prev;
  bool have_prev = false;
  for (int i = 0; i < 50; i++) {
    std::this_thread::sleep_for(poll);
    rpc::NodeStats s;
    if (!FindStats(client, options_.id, &s)) continue;
    if (have_prev && s.SerializeAsString() == prev.SerializeAsString()) return s;
    prev = s;
    have_prev = true;
  }
  return prev;
}

std::string NodeProcess::Log() const {
  return retried_log_ + (process_ ? process_->Stdout() + process_->Stderr() : std::string());
}

}  // namespace ember::testing
