#include "tests/testing/cluster.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ember::testing {

MetaProcess::MetaProcess(const std::string& dir, const std::string& lease)
    : dir_(dir), lease_(lease) {
  std::filesystem::create_directories(dir_);
  address_ = absl::StrCat("127.0.0.1:", FreePort());
  client_ = std::make_unique<meta::MetaClient>(address_, std::chrono::seconds(5));
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
  process_ = std::make_unique<Process>(
      std::vector<std::string>{EMBER_BINARY, "meta", "--listen", address_, "--data-dir",
                               dir_ + "/data", "--lease", lease_},
      absl::StrCat(dir_, "/meta-", starts_++));
  bool up = WaitFor([&] { return PortOpen(address_) || !process_->Running(); },
                    std::chrono::seconds(20));
  up = up && WaitFor([&] { return client_->ListDatasets().ok() || !process_->Running(); },
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

}  // namespace ember::testing
