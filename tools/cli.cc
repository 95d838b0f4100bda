#include "tools/cli.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/secret.h"

namespace ember::tools {

void Fail(const absl::Status& status) { Fail(std::string(status.message())); }

void Fail(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "ember: %s\n", message.c_str());
  std::exit(1);
}

void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); i++) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); i++) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)),
      total_(total),
      tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void Progress::Update(uint64_t done, const std::string& extra) {
  auto now = std::chrono::steady_clock::now();
  auto since = now - last_;
  if (tty_ ? since < std::chrono::milliseconds(100) : since < std::chrono::seconds(2)) return;
  last_ = now;
  double secs = std::chrono::duration<double>(now - start_).count();
  double rate = secs > 0 ? done / secs : 0;
  std::string text;
  if (total_ > 0) {
    double frac = std::min(1.0, static_cast<double>(done) / total_);
    if (tty_) {
      int filled = static_cast<int>(frac * 30);
      text = absl::StrFormat("%s [%s%s] %5.1f%% %d/%d %s", label_, std::string(filled, '#'),
                             std::string(30 - filled, '.'), frac * 100, done, total_, extra);
    } else {
      text = absl::StrFormat("%s: %.1f%% %d/%d %s", label_, frac * 100, done, total_, extra);
    }
  } else {
    text = absl::StrFormat("%s: %d %s (%.0f/s)", label_, done, extra, rate);
  }
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  printed_ = true;
}

void Progress::Finish(const std::string& summary) {
  if (tty_ && printed_) std::fprintf(stderr, "\r\033[K");
  if (!summary.empty()) std::fprintf(stderr, "%s\n", summary.c_str());
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

absl::Status ValidateHostPort(const std::string& flag, const std::string& value) {
  size_t colon = value.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", value, "' must be HOST:PORT, e.g. 127.0.0.1:7370"));
  }
  return absl::OkStatus();
}

std::string FormatTimeMs(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  time_t t = unix_ms / 1000;
  struct tm tm;
  localtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

void AddMetaFlags(CLI::App* c, MetaFlags* f) {
  c->add_option("--meta", f->address, "Meta HOST:PORT (default $EMBER_META or 127.0.0.1:7370)");
  c->add_option("--token-file", f->token_file,
                "File holding the cluster token (default $EMBER_TOKEN_FILE)");
  c->add_option("--tls-ca", f->tls_ca,
                "PEM CA that signed meta's certificate: connect with TLS (default $EMBER_TLS_CA)");
}

meta::MetaCredentials ResolveCredentials(const MetaFlags& f) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  meta::MetaCredentials c;
  auto token = ReadTokenFile(f.token_file.empty() ? env("EMBER_TOKEN_FILE") : f.token_file);
  if (!token.ok()) Fail(token.status());
  c.token = *token;
  c.tls_ca_file = f.tls_ca.empty() ? env("EMBER_TLS_CA") : f.tls_ca;
  return c;
}

std::unique_ptr<meta::MetaClient> ConnectMeta(const MetaFlags& f,
                                              std::chrono::milliseconds timeout) {
  return std::make_unique<meta::MetaClient>(meta::ResolveMetaAddress(f.address),
                                            ResolveCredentials(f), timeout);
}

}  // namespace ember::tools
