#include "tests/testing/testing.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ember::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base && *base ? base : "/tmp", "/ember-test-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  if (std::getenv("EMBER_KEEP_TMP")) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Process::Process(std::vector<std::string> argv, const std::string& log_prefix,
                 std::vector<std::string> env) {
  out_path_ = log_prefix + ".out";
  err_path_ = log_prefix + ".err";
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    int out = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out, 1);
    dup2(err, 2);
    for (const auto& e : env) putenv(strdup(e.c_str()));
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
}

Process::~Process() {
  if (Running()) {
    kill(pid_, SIGCONT);
    kill(pid_, SIGKILL);
    Wait(std::chrono::seconds(10));
  }
}

bool Process::Running() {
  if (pid_ <= 0 || exit_code_ >= 0) return false;
  int status;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return false;
}

void Process::Signal(int sig) {
  if (Running()) kill(pid_, sig);
}

int Process::Wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Running()) {
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

std::string Process::Stdout() const { return ReadFile(out_path_); }
std::string Process::Stderr() const { return ReadFile(err_path_); }

RunResult RunEmber(const std::vector<std::string>& args, std::vector<std::string> env,
                   std::chrono::milliseconds timeout) {
  static int counter = 0;
  std::string prefix = absl::StrCat("/tmp/ember-run-", getpid(), "-", counter++);
  std::vector<std::string> argv{EMBER_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  RunResult r;
  {
    Process p(argv, prefix, env);
    r.exit_code = p.Wait(timeout);
    r.out = p.Stdout();
    r.err = p.Stderr();
  }
  unlink((prefix + ".out").c_str());
  unlink((prefix + ".err").c_str());
  return r;
}

std::string HttpGet(const std::string& host_port, const std::string& path) {
  size_t colon = host_port.rfind(':');
  httplib::Client c(host_port.substr(0, colon), std::stoi(host_port.substr(colon + 1)));
  c.set_connection_timeout(5);
  c.set_read_timeout(10);
  auto r = c.Get(path);
  return r && r->status == 200 ? r->body : "";
}

double MetricSample(const std::string& text, const std::string& series) {
  size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

int FreePort(const std::string& host) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

bool PortOpen(const std::string& host_port) {
  size_t colon = host_port.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(host_port.c_str() + colon + 1)));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void WriteRandomFile(const std::string& path, size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string buf;
  buf.resize(1 << 20);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  size_t left = size;
  while (left > 0) {
    size_t n = std::min(left, buf.size());
    for (size_t i = 0; i < n; i += 8) {
      uint64_t v = rng();
      std::memcpy(&buf[i], &v, std::min<size_t>(8, n - i));
    }
    f.write(buf.data(), static_cast<std::streamsize>(n));
    left -= n;
  }
}

std::vector<CachedCopy> CachedCopiesOf(const std::string& cache_dir, const std::string& content) {
  std::vector<CachedCopy> out;
  std::error_code ec;
  for (const char* sub : {"/blocks", "/segments"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(cache_dir + sub, ec)) {
      if (!e.is_regular_file()) continue;
      const std::string bytes = ReadFile(e.path().string());
      if (std::string(sub) == "/blocks") {
        if (bytes == content) out.push_back({e.path().string(), 0});
        continue;
      }
      for (size_t at = bytes.find(content); at != std::string::npos;
           at = bytes.find(content, at + 1)) {
        out.push_back({e.path().string(), at});
      }
    }
  }
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

void MakeSampleTree(const std::string& root) {
  std::filesystem::create_directories(root + "/a/b");
  std::filesystem::create_directories(root + "/a-c");
  WriteFile(root + "/a/b/f1", "hello");
  WriteFile(root + "/a-c/f2", std::string(1000, 'x'));
  WriteFile(root + "/empty", "");
  if (symlink("a/b/f1", (root + "/link").c_str()) != 0 ||
      mkfifo((root + "/fifo").c_str(), 0644) != 0) {
    throw std::runtime_error("MakeSampleTree: " + root + ": " + strerror(errno));
  }
}

bool EnableFuseUring() {
  const char* param = "/sys/module/fuse/parameters/enable_uring";
  std::string v = ReadFile(param);
  if (!v.empty() && (v[0] == 'Y' || v[0] == '1')) return true;
  if (v.empty()) return false;  // no FUSE io_uring in this kernel
  std::ofstream f(param);
  f << "Y";
  f.close();
  v = ReadFile(param);
  return !v.empty() && v[0] == 'Y';
}

std::string ReadUncached(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return "<open failed: " + std::string(strerror(errno)) + ">";
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      out = "<read failed: " + std::string(strerror(errno)) + ">";
      break;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

std::string PreadUncached(const std::string& path, uint64_t offset, size_t len, int* err) {
  *err = 0;
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    *err = errno;
    return "";
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  std::string out(len, '\0');
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, out.data() + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  out.resize(done);
  return out;
}

int RunShell(const std::string& cmd, std::string* out) {
  std::string sink;
  if (out == nullptr) out = &sink;
  out->clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int NpmInstallOnce(const std::string& dir, const std::string& packages, const std::string& marker,
                   std::string* out) {
  std::filesystem::create_directories(dir);
  return RunShell("cd '" + dir + "' && flock .install.lock sh -c 'test -e \"" + marker +
                      "\" || npm install --no-audit --no-fund --silent " + packages + "'",
                  out);
}

bool HaveCommand(const std::string& tool) {
  return RunShell("command -v " + tool + " >/dev/null") == 0;
}

size_t PeakRss(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

}  // namespace ember::testing
