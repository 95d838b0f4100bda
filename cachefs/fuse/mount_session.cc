#define FUSE_USE_VERSION 312
#include "cachefs/fuse/mount_session.h"

#include <fuse3/fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace ember::cachefs {
namespace {

bool IsMountpoint(const std::string& path) {
  std::ifstream f("/proc/self/mountinfo");
  std::string line;
  while (std::getline(f, line)) {
    // Field 5 is the mount point (octal escapes for spaces).
    size_t pos = 0;
    for (int i = 0; i < 4 && pos != std::string::npos; i++) pos = line.find(' ', pos + 1);
    if (pos == std::string::npos) continue;
    size_t end = line.find(' ', pos + 1);
    if (line.substr(pos + 1, end - pos - 1) == path) return true;
  }
  return false;
}

}  // namespace

void LazyUnmount(const std::string& mountpoint) {
  if (umount2(mountpoint.c_str(), MNT_DETACH) == 0) return;
  // Not root: ask the setuid helper.
  pid_t pid = fork();
  if (pid == 0) {
    execlp("fusermount3", "fusermount3", "-u", "-z", "-q", mountpoint.c_str(), nullptr);
    _exit(127);
  }
  if (pid > 0) waitpid(pid, nullptr, 0);
}

metrics::Histogram* FuseOpHistogram(const std::string& op) {
  return metrics::Global().GetHistogram(
      "ember_fuse_request_seconds", "FUSE requests by operation, until the reply.", {{"op", op}});
}

absl::Status PrepareMountpoint(const std::string& mountpoint) {
  struct stat st;
  if (stat(mountpoint.c_str(), &st) != 0) {
    if (errno == ENOTCONN || errno == ECONNABORTED) {
      spdlog::warn(
          "mount: {} is a stale FUSE mount (Transport endpoint is not connected); "
          "unmounting it",
          mountpoint);
      LazyUnmount(mountpoint);
      if (stat(mountpoint.c_str(), &st) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("mountpoint ", mountpoint,
                         " is a stale mount that could not be removed: ", strerror(errno)));
      }
    } else if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("mountpoint ", mountpoint, " does not exist"));
    } else {
      return absl::FailedPreconditionError(
          absl::StrCat("mountpoint ", mountpoint, ": ", strerror(errno)));
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("mountpoint ", mountpoint, " is not a directory"));
  }
  if (IsMountpoint(mountpoint)) {
    // stat() may be answered from cached attributes; statfs always asks the file system.
    struct statvfs vfs;
    if (statvfs(mountpoint.c_str(), &vfs) != 0 && (errno == ENOTCONN || errno == ECONNABORTED)) {
      spdlog::warn(
          "mount: {} is a stale FUSE mount (Transport endpoint is not connected); "
          "unmounting it",
          mountpoint);
      LazyUnmount(mountpoint);
    }
    if (IsMountpoint(mountpoint)) {
      return absl::FailedPreconditionError(
          absl::StrCat("mountpoint ", mountpoint, " is busy: something is already mounted there"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<fuse_session*> MountSession(const std::string& mountpoint,
                                           const MountOptions& options, bool writable,
                                           const fuse_lowlevel_ops* ops, void* userdata,
                                           std::string* resolved_mp) {
  char resolved[PATH_MAX];
  if (realpath(mountpoint.c_str(), resolved) == nullptr) {
    // PrepareMountpoint explains the common cases.
    absl::Status st = PrepareMountpoint(mountpoint);
    if (!st.ok()) return st;
    return absl::FailedPreconditionError(
        absl::StrCat("mountpoint ", mountpoint, ": ", strerror(errno)));
  }
  std::string mp = resolved;
  absl::Status prep = PrepareMountpoint(mp);
  if (!prep.ok()) return prep;
  std::vector<std::string> args = {
      "ember", "-o",
      absl::StrCat(writable ? "rw" : "ro", ",default_permissions,fsname=ember,subtype=ember")};
  if (options.allow_other) {
    args.push_back("-o");
    args.push_back("allow_other");
  }
  if (options.debug) args.push_back("-d");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* session = fuse_session_new(&fargs, ops, sizeof(*ops), userdata);
  fuse_opt_free_args(&fargs);  // libfuse may have copied them
  if (session == nullptr) return absl::InternalError("fuse_session_new failed");
  if (fuse_session_mount(session, mp.c_str()) != 0) {
    fuse_session_destroy(session);
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot mount FUSE at ", mp, " (is /dev/fuse available and fuse3 installed?)"));
  }
  *resolved_mp = mp;
  return session;
}

bool SetMountReadahead(const std::string& mountpoint, uint32_t kb) {
  std::ifstream mi("/proc/self/mountinfo");
  std::string line, dev;
  while (std::getline(mi, line)) {
    // "ID PARENT MAJ:MIN ROOT MOUNTPOINT ...": the last match wins (the newest mount on top).
    std::istringstream f(line);
    std::string id, parent, majmin, root, mp;
    if (f >> id >> parent >> majmin >> root >> mp && mp == mountpoint) dev = majmin;
  }
  std::string path = absl::StrCat("/sys/class/bdi/", dev, "/read_ahead_kb");
  std::ofstream out(path);
  if (dev.empty() || !(out << kb << "\n") || !out.flush()) {
    spdlog::info("mount: cannot set the readahead of {} to {} KiB ({}); kernel default kept",
                 mountpoint, kb, dev.empty() ? "not in mountinfo" : path);
    return false;
  }
  return true;
}

void RaiseFuseMaxPagesLimit(uint32_t pages) {
  static constexpr char kPath[] = "/proc/sys/fs/fuse/max_pages_limit";
  uint32_t limit = 0;
  {
    std::ifstream in(kPath);
    if (!(in >> limit)) return;  // older kernel: 256 pages, fixed
  }
  if (limit >= pages) return;
  std::ofstream out(kPath);
  if (!(out << pages << "\n") || !out.flush()) {
    spdlog::info(
        "mount: {} is {} pages and cannot be raised to {} (not root?): reads come in "
        "requests of {} KiB",
        kPath, limit, pages, limit * 4);
    return;
  }
  spdlog::info("mount: raised {} from {} to {} pages ({} KiB FUSE requests)", kPath, limit, pages,
               pages * 4);
}

}  // namespace ember::cachefs
