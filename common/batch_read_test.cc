#include "common/batch_read.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace ember {
namespace {

// Reads of several files, more than one submission holds, each landing in its own buffer with
// the bytes it asked for; a read that reaches the end of its file is short by what is not
// there, one past the end reads nothing, and one of a directory fails alone.
TEST(BatchPreadTest, EveryReadGetsItsBytesOrItsError) {
  char tmpl[] = "/tmp/ember-batch-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::vector<int> fds;
  std::vector<std::string> bodies;
  for (int f = 0; f < 3; f++) {
    std::string body(100000 + f * 4099, '\0');
    for (size_t i = 0; i < body.size(); i++) body[i] = static_cast<char>(i * 31 + f * 7 + i / 251);
    const std::string path = dir + "/f" + std::to_string(f);
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, body.data(), body.size()), static_cast<ssize_t>(body.size()));
    fds.push_back(fd);
    bodies.push_back(body);
    unlink(path.c_str());
  }
  // Half of one file's pages leave memory: reads across the edge find some pages there and
  // some not (io_uring may end such a read short; the rest must still come).
  ASSERT_EQ(fsync(fds[2]), 0);
  ASSERT_EQ(posix_fadvise(fds[2], 50000, 0, POSIX_FADV_DONTNEED), 0);
  const int a_dir = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(a_dir, 0);
  std::vector<PreadOp> ops;
  std::vector<std::string> bufs(200);
  for (size_t i = 0; i < 200; i++) {
    const size_t f = i % 3;
    const uint64_t off = (i * 977) % (bodies[f].size() - 2000);
    bufs[i].assign(1500 + i, '\0');
    ops.push_back({.fd = fds[f], .offset = off, .len = bufs[i].size(), .buf = bufs[i].data()});
  }
  std::string tail(5000, '\0'), past(10, '\0'), bad(10, '\0');
  ops.push_back(
      {.fd = fds[1], .offset = bodies[1].size() - 100, .len = tail.size(), .buf = tail.data()});
  ops.push_back(
      {.fd = fds[2], .offset = bodies[2].size() + 10, .len = past.size(), .buf = past.data()});
  ops.push_back({.fd = a_dir, .offset = 0, .len = bad.size(), .buf = bad.data()});
  BatchPread(ops);
  for (size_t i = 0; i < 200; i++) {
    const size_t f = i % 3;
    ASSERT_EQ(ops[i].result, static_cast<int64_t>(bufs[i].size())) << i;
    EXPECT_EQ(bufs[i], bodies[f].substr(ops[i].offset, bufs[i].size())) << i;
  }
  EXPECT_EQ(ops[200].result, 100);
  EXPECT_EQ(tail.substr(0, 100), bodies[1].substr(bodies[1].size() - 100));
  EXPECT_EQ(ops[201].result, 0);
  EXPECT_EQ(ops[202].result, -EISDIR);
  // Empty batches are fine.
  BatchPread({});
  std::cerr << "io_uring: " << (BatchPreadUsesUring() ? "yes" : "no (preads)") << "\n";
  for (int fd : fds) close(fd);
  close(a_dir);
  rmdir(dir.c_str());
}

// Files opened many at once, more than one submission holds: each open gets its own file (or
// its own error: a missing file, a symlink refused by RESOLVE_NO_SYMLINKS), and every fd
// BatchClose is given is closed.
TEST(BatchOpenTest, EachOpenGetsItsFileOrItsErrorAndCloseClosesAll) {
  char tmpl[] = "/tmp/ember-open-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  constexpr int kFiles = 150;  // > one submission of 64
  std::vector<std::string> paths;
  for (int f = 0; f < kFiles; f++) {
    paths.push_back(dir + "/f" + std::to_string(f));
    const int fd = open(paths.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    const std::string body = "file " + std::to_string(f);
    ASSERT_EQ(write(fd, body.data(), body.size()), static_cast<ssize_t>(body.size()));
    close(fd);
  }
  ASSERT_EQ(symlink(paths[0].c_str(), (dir + "/link").c_str()), 0);
  paths[40] = dir + "/missing";
  paths[41] = dir + "/link";
  std::vector<OpenOp> ops;
  for (const auto& p : paths) {
    ops.push_back({.path = p.c_str(),
                   .flags = O_RDONLY | O_CLOEXEC,
                   .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS});
  }
  BatchOpen(ops);
  EXPECT_EQ(ops[40].result, -ENOENT);
  EXPECT_EQ(ops[41].result, -ELOOP);
  std::vector<int> fds;
  for (int f = 0; f < kFiles; f++) {
    if (f == 40 || f == 41) continue;
    ASSERT_GE(ops[f].result, 0) << f << ": " << std::strerror(-ops[f].result);
    char buf[32] = {};
    const ssize_t n = pread(ops[f].result, buf, sizeof(buf), 0);
    EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "file " + std::to_string(f));
    fds.push_back(ops[f].result);
  }
  BatchClose(fds);
  for (int fd : fds) EXPECT_EQ(fcntl(fd, F_GETFD), -1) << fd << " still open";
  for (int f = 0; f < kFiles; f++) unlink((dir + "/f" + std::to_string(f)).c_str());
  unlink((dir + "/link").c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace ember
