// Helpers for Ember's tests: private temp dirs, child processes that are always stopped, free
// loopback ports, and running the `ember` binary. Not linked into any production target.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ember::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

// A child process with stdout and stderr captured to files. Killed (SIGKILL) on destruction if
// still running.
class Process {
 public:
  Process(std::vector<std::string> argv, const std::string& log_prefix,
          std::vector<std::string> env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool Running();
  void Signal(int sig);
  // Waits for exit; returns the exit code (128+signal if killed), or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  std::string Stdout() const;
  std::string Stderr() const;

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::string out_path_, err_path_;
};

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the ember binary with args to completion (with a timeout) and captures its output.
RunResult RunEmber(const std::vector<std::string>& args, std::vector<std::string> env = {},
                   std::chrono::milliseconds timeout = std::chrono::seconds(120));

// A TCP port on `host` (an IPv4 loopback address) that was free a moment ago.
int FreePort(const std::string& host = "127.0.0.1");

// True if a TCP connection to host:port (IPv4) succeeds now.
bool PortOpen(const std::string& host_port);

// GET http://host_port/path. Returns: the body of a 200 answer, else "".
std::string HttpGet(const std::string& host_port, const std::string& path);
// The value of one sample (`name{labels} value`, exactly as exported) in Prometheus text, or -1.
double MetricSample(const std::string& text, const std::string& series);

// Polls `pred` every 20 ms until true or the timeout; returns its last value.
bool WaitFor(const std::function<bool()>& pred,
             std::chrono::milliseconds timeout = std::chrono::seconds(10));

// Writes `size` bytes of deterministic pseudo-random content (seeded) to path.
void WriteRandomFile(const std::string& path, size_t size, uint64_t seed);
std::string ReadFile(const std::string& path);
// Where a node's cache holds a copy of `content` (a dataset file's bytes): its own cache file
// under CACHE_DIR/blocks (at offset 0) or a place in a small-object segment under
// CACHE_DIR/segments. For tests that damage cached copies the way a stray writer would.
struct CachedCopy {
  std::string path;
  uint64_t offset = 0;
};
std::vector<CachedCopy> CachedCopiesOf(const std::string& cache_dir, const std::string& content);
void WriteFile(const std::string& path, const std::string& data);
// A small origin tree at `root` for walk tests, walked as "", a, a/b, a/b/f1 ("hello"), a-c,
// a-c/f2 (1000 bytes), empty, link (-> a/b/f1); plus a fifo, which walks skip.
void MakeSampleTree(const std::string& root);

// Reads a file through the kernel after dropping its page cache (so a FUSE daemon is asked);
// "<open failed: ...>" / "<read failed: ...>" on errors.
std::string ReadUncached(const std::string& path);
// Turns on FUSE over io_uring in this kernel (the fuse module's enable_uring; needs root; it
// stays on). False where the kernel has none or it cannot be set.
bool EnableFuseUring();
// Reads [offset, offset+len) of path the same way. Returns the bytes; *err is 0, or the errno of
// the open/read that failed (EIO for a short read).
std::string PreadUncached(const std::string& path, uint64_t offset, size_t len, int* err);

// Runs a shell command; returns its exit code (-1 if it did not exit) and its stdout+stderr.
int RunShell(const std::string& cmd, std::string* out = nullptr);
// True if `tool` is on the PATH.
bool HaveCommand(const std::string& tool);
// Installs npm `packages` into `dir` unless `dir`/`marker` exists, under a file lock so tests
// running in parallel do not install into one folder at once. Returns the shell's exit code.
int NpmInstallOnce(const std::string& dir, const std::string& packages, const std::string& marker,
                   std::string* out);

// Peak resident set size (VmHWM) of a process in bytes, 0 if unknown.
size_t PeakRss(pid_t pid);

}  // namespace ember::testing
