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
  explicit MetaProcess(const std::string& dir, const std::string& lease = "10s");
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
  int starts_ = 0;
  std::unique_ptr<Process> process_;
  std::unique_ptr<meta::MetaClient> client_;
};

}  // namespace ember::testing
