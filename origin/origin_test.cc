// Unit tests of origin/: the POSIX walk and reads, the walk of a flat object listing, the
// router and URI checks. Remote origins against real servers are in tests/origins_test.cc.
#include "origin/origin.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/batch_read.h"
#include "common/file_io.h"
#include "common/status.h"
#include "origin/internal.h"
#include "tests/testing/testing.h"

namespace ember::origin {
namespace {

using ember::testing::TempDir;
using ember::testing::WriteFile;
using Type = OriginEntry::Type;

struct Walked {
  std::vector<OriginEntry> entries;
  WalkStats stats;
  absl::Status status;
  std::vector<std::string> Paths() const {
    std::vector<std::string> out;
    for (const auto& e : entries) out.push_back(e.path);
    return out;
  }
};

Walked WalkOf(Origin& origin, const std::string& root) {
  Walked w;
  auto r = origin.Walk(root,
                       [&](const OriginEntry& e) {
                         w.entries.push_back(e);
                         return absl::OkStatus();
                       },
                       {});
  w.status = r.status();
  if (r.ok()) w.stats = *r;
  return w;
}

Walked WalkOfObjects(std::vector<OriginEntry> objects) {
  Walked w;
  auto r = WalkObjects(std::move(objects), [&](const OriginEntry& e) {
    w.entries.push_back(e);
    return absl::OkStatus();
  });
  w.status = r.status();
  if (r.ok()) w.stats = *r;
  return w;
}

OriginEntry Object(const std::string& path, uint64_t size = 1) {
  OriginEntry o;
  o.path = path;
  o.size = size;
  o.mode = kObjectMode;
  o.mtime_ns = 1'700'000'000'000'000'000;
  o.etag = "\"" + path + "\"";
  return o;
}

void MakeTree(const TempDir& d) { ember::testing::MakeSampleTree(d.Sub("o")); }

TEST(PosixWalkTest, SortedPreorderRootFirstSymlinksKeptSpecialFilesSkipped) {
  TempDir d;
  MakeTree(d);
  auto posix = NewPosixOrigin();
  Walked w = WalkOf(*posix, d.Sub("o"));
  ASSERT_TRUE(w.status.ok()) << w.status;
  std::vector<std::string> want{"", "a", "a/b", "a/b/f1", "a-c", "a-c/f2", "empty", "link"};
  EXPECT_EQ(w.Paths(), want);
  EXPECT_EQ(w.stats.skipped, 1u);  // the fifo
  EXPECT_EQ(w.entries[0].type, Type::kDir);
  EXPECT_TRUE(S_ISDIR(w.entries[0].mode));
  const OriginEntry& f1 = w.entries[3];
  EXPECT_EQ(f1.type, Type::kFile);
  EXPECT_EQ(f1.size, 5u);
  EXPECT_TRUE(S_ISREG(f1.mode));
  EXPECT_EQ(f1.uid, getuid());
  EXPECT_EQ(f1.gid, getgid());
  EXPECT_GT(f1.mtime_ns, 0);
  EXPECT_EQ(f1.etag, "");
  EXPECT_EQ(w.entries[1].size, 0u);  // directories have no size
  const OriginEntry& link = w.entries[7];
  EXPECT_EQ(link.type, Type::kSymlink);
  EXPECT_EQ(link.link_target, "a/b/f1");
  EXPECT_EQ(link.size, 6u);
  EXPECT_TRUE(S_ISLNK(link.mode));
}

TEST(PosixWalkTest, MissingRootAndCallbackErrors) {
  TempDir d;
  auto posix = NewPosixOrigin();
  Walked w = WalkOf(*posix, d.Sub("nope"));
  EXPECT_EQ(w.status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(w.status.message().find("nope"), std::string::npos);
  // A callback error stops the walk and is returned.
  MakeTree(d);
  int calls = 0;
  auto r =
      posix->Walk(d.Sub("o"),
                  [&](const OriginEntry&) {
                    return ++calls == 3 ? absl::ResourceExhaustedError("stop") : absl::OkStatus();
                  },
                  {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 3);
}

TEST(PosixWalkTest, TreeTooDeepIsRefused) {
  TempDir d;
  std::string path = d.Sub("o");
  for (int i = 0; i < 514; i++) path += "/d";
  std::filesystem::create_directories(path);
  auto posix = NewPosixOrigin();
  Walked w = WalkOf(*posix, d.Sub("o"));
  EXPECT_EQ(w.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(w.status.message().find("too deep"), std::string::npos) << w.status;
}

TEST(WalkObjectsTest, FoldersFromPrefixesInWalkOrder) {
  Walked w = WalkOfObjects({Object("z"), Object("a/b/f1", 5), Object("a-c/f2"), Object("a/b2")});
  ASSERT_TRUE(w.status.ok()) << w.status;
  std::vector<std::string> want{"", "a", "a/b", "a/b/f1", "a/b2", "a-c", "a-c/f2", "z"};
  EXPECT_EQ(w.Paths(), want);
  for (int i : {0, 1, 2, 5}) {
    EXPECT_EQ(w.entries[i].type, Type::kDir) << w.entries[i].path;
    EXPECT_EQ(w.entries[i].mode, static_cast<uint32_t>(S_IFDIR | 0555));
    EXPECT_EQ(w.entries[i].mtime_ns, 0);
  }
  const OriginEntry& f1 = w.entries[3];
  EXPECT_EQ(f1.type, Type::kFile);
  EXPECT_EQ(f1.size, 5u);
  EXPECT_EQ(f1.mode, static_cast<uint32_t>(S_IFREG | 0444));
  EXPECT_EQ(f1.etag, "\"a/b/f1\"");
  EXPECT_EQ(w.stats.skipped, 0u);
}

TEST(WalkObjectsTest, ANameBothObjectAndFolderIsRefused) {
  for (auto objects : {std::vector<OriginEntry>{Object("z"), Object("z/y")},
                       std::vector<OriginEntry>{Object("z/y"), Object("z")}}) {
    Walked w = WalkOfObjects(objects);
    EXPECT_EQ(w.status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(w.status.message().find("both an object and a folder"), std::string::npos);
  }
}

// The contract meta relies on: a directory tree and the flat listing of its files walk in the
// same order, with the same file entries (folders are synthesized: their attributes differ).
TEST(WalkObjectsTest, SameOrderAsTheWalkOfTheSameTree) {
  TempDir d;
  std::vector<std::string> files = {"a/b/f1",  "a-c/f2", "a.b",         "a0",        "b c/d e",
                                    "été/x",   "A/up",   "a/b0/deep/f", "a/b/g/h/i", "z",
                                    "a/b-/f3", "a/b.x",  "~tilde",      "0/1/2"};
  for (size_t i = 0; i < files.size(); i++) {
    std::filesystem::create_directories(
        std::filesystem::path(d.Sub("o/" + files[i])).parent_path());
    WriteFile(d.Sub("o/" + files[i]), std::string(i, 'x'));
  }
  auto posix = NewPosixOrigin();
  Walked tree = WalkOf(*posix, d.Sub("o"));
  ASSERT_TRUE(tree.status.ok()) << tree.status;
  std::vector<OriginEntry> listing;
  for (const auto& e : tree.entries) {
    if (e.type == Type::kFile) listing.push_back(e);
  }
  ASSERT_EQ(listing.size(), files.size());
  std::reverse(listing.begin(), listing.end());  // a listing comes in any order
  Walked flat = WalkOfObjects(listing);
  ASSERT_TRUE(flat.status.ok()) << flat.status;
  ASSERT_EQ(flat.Paths(), tree.Paths());
  for (size_t i = 0; i < tree.entries.size(); i++) {
    const OriginEntry& t = tree.entries[i];
    const OriginEntry& f = flat.entries[i];
    EXPECT_EQ(f.type, t.type) << t.path;
    if (t.type != Type::kFile) continue;
    EXPECT_EQ(f.size, t.size) << t.path;
    EXPECT_EQ(f.mode, t.mode) << t.path;
    EXPECT_EQ(f.uid, t.uid) << t.path;
    EXPECT_EQ(f.gid, t.gid) << t.path;
    EXPECT_EQ(f.mtime_ns, t.mtime_ns) << t.path;
  }
}

// A remote origin stand-in: lists objects from memory.
class ListedOrigin final : public RemoteOrigin {
 public:
  explicit ListedOrigin(std::vector<OriginEntry> objects) : objects_(std::move(objects)) {}
  absl::Status Read(const OriginFile&, uint64_t, size_t, char*) override {
    return absl::UnimplementedError("not read");
  }

 private:
  absl::Status ListObjects(const EntryFn& fn) override {
    for (const auto& o : objects_) RETURN_IF_ERROR(fn(o));
    return absl::OkStatus();
  }
  std::vector<OriginEntry> objects_;
};

TEST(RemoteWalkTest, ListsThenWalksReportingEvery1000Objects) {
  std::vector<OriginEntry> objects;
  for (int i = 0; i < 2500; i++) objects.push_back(Object(absl::StrCat("d", i % 7, "/o", i), 2));
  ListedOrigin remote(objects);
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  Walked w;
  auto r = remote.Walk(
      "s3://bkt/x",
      [&](const OriginEntry& e) {
        w.entries.push_back(e);
        return absl::OkStatus();
      },
      [&](uint64_t n, uint64_t bytes) { progress.emplace_back(n, bytes); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(progress, (std::vector<std::pair<uint64_t, uint64_t>>{{1000, 2000}, {2000, 4000}}));
  EXPECT_EQ(w.Paths(), WalkOfObjects(objects).Paths());
  EXPECT_EQ(w.entries.size(), 1u + 7u + 2500u);
}

TEST(PosixOriginTest, ReadsAndRefusesChangedMissingOrEscapingFiles) {
  TempDir d;
  MakeTree(d);
  auto posix = NewPosixOrigin();
  Walked w = WalkOf(*posix, d.Sub("o"));
  ASSERT_TRUE(w.status.ok());
  const OriginEntry& f2 = w.entries[5];
  OriginFile file{d.Sub("o"), f2.path, f2.size, f2.mtime_ns, ""};
  std::string buf(10, '\0');
  ASSERT_TRUE(posix->Read(file, 990, 10, buf.data()).ok());
  EXPECT_EQ(buf, std::string(10, 'x'));
  OriginFile changed = file;
  changed.size = 999;
  EXPECT_EQ(posix->Read(changed, 0, 10, buf.data()).code(), absl::StatusCode::kFailedPrecondition);
  OriginFile missing = file;
  missing.path = "a-c/gone";
  EXPECT_EQ(posix->Read(missing, 0, 10, buf.data()).code(), absl::StatusCode::kNotFound);
  OriginFile escaping = file;
  escaping.path = "../o/a-c/f2";
  EXPECT_EQ(posix->Read(escaping, 0, 10, buf.data()).code(), absl::StatusCode::kInvalidArgument);
  OriginFile via_link = file;
  via_link.path = "link";
  EXPECT_EQ(posix->Read(via_link, 0, 1, buf.data()).code(), absl::StatusCode::kFailedPrecondition);
  // An origin reached through a symlink of its own (a mount's path) reads; a directory below it
  // swapped for a symlink to elsewhere (with the same file there) is not followed.
  std::filesystem::create_directory_symlink(d.Sub("o"), d.Sub("o-link"));
  OriginFile via_root_link = file;
  via_root_link.root = d.Sub("o-link");
  buf.assign(10, '\0');
  ASSERT_TRUE(posix->Read(via_root_link, 990, 10, buf.data()).ok());
  EXPECT_EQ(buf, std::string(10, 'x'));
  const std::string dir = file.path.substr(0, file.path.find('/'));
  std::filesystem::rename(d.Sub("o/" + dir), d.Sub("elsewhere"));
  std::filesystem::create_directory_symlink(d.Sub("elsewhere"), d.Sub("o/" + dir));
  for (const OriginFile& f : {file, via_root_link}) {
    EXPECT_EQ(posix->Read(f, 990, 10, buf.data()).code(), absl::StatusCode::kFailedPrecondition)
        << f.root;
  }
}

// A cache fill's read of a whole file that is not in the page cache goes around it (O_DIRECT
// into the fill's buffer: the bytes are not copied out of new page-cache pages, and the origin's
// pages do not crowd the page cache); every byte is the file's, up to an end that is not on a page
// boundary. A file in the page cache, or a buffer without room for whole pages, is read through
// it.
TEST(PosixOriginTest, ReadManyReadsAFileNotInThePageCacheAroundIt) {
  TempDir d;
  std::filesystem::create_directories(d.Sub("o"));
  struct Case {
    size_t size;
    bool room;  // the buffer has room for whole pages
  };
  const std::vector<Case> cases = {
      {100'003, true}, {64 << 10, true}, {40'000, false}, {5'000, true}};
  std::vector<OriginFile> files;
  std::vector<std::string> bodies;
  for (size_t i = 0; i < cases.size(); i++) {
    std::string body(cases[i].size, '\0');
    for (size_t j = 0; j < body.size(); j++) body[j] = static_cast<char>((j * 131 + i * 7) % 251);
    bodies.push_back(body);
    const std::string rel = absl::StrCat("f", i);
    WriteFile(d.Sub("o/" + rel), body);
    struct stat st;
    ASSERT_EQ(stat(d.Sub("o/" + rel).c_str(), &st), 0);
    files.push_back({d.Sub("o"), rel, body.size(),
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                     ""});
  }
  // Out of the page cache (written back first), and whether this file system can tell and
  // takes O_DIRECT at all (tmpfs: neither; then only the bytes are checked).
  auto drop = [&](size_t i) {
    int fd = open(d.Sub("o/" + files[i].path).c_str(), O_RDONLY);
    EXPECT_GE(fd, 0);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const bool dropped = !PagesCached(fd, 0, files[i].size).value_or(true);
    close(fd);
    return dropped;
  };
  auto cached = [&](size_t i) {
    int fd = open(d.Sub("o/" + files[i].path).c_str(), O_RDONLY);
    const std::optional<bool> c = PagesCached(fd, 0, files[i].size);
    close(fd);
    return c.value_or(true);
  };
  int probe = open(d.Sub("o/f0").c_str(), O_RDONLY | O_DIRECT);
  const bool direct_ok = probe >= 0;
  if (probe >= 0) close(probe);
  std::vector<bool> dropped;
  for (size_t i = 0; i < files.size(); i++) dropped.push_back(drop(i) && direct_ok);
  // f1 read once through the page cache first: it is warm, and read from there.
  {
    std::string warm(files[1].size, '\0');
    int fd = open(d.Sub("o/f1").c_str(), O_RDONLY);
    ASSERT_EQ(pread(fd, warm.data(), warm.size(), 0), static_cast<ssize_t>(warm.size()));
    close(fd);
  }
  auto origin = NewPosixOrigin();
  std::vector<char*> bufs;
  std::vector<Origin::ReadRequest> reqs;
  for (size_t i = 0; i < files.size(); i++) {
    const size_t room = cases[i].room ? (files[i].size + 4095) / 4096 * 4096 : files[i].size;
    void* p = nullptr;
    ASSERT_EQ(posix_memalign(&p, 4096, room), 0);
    bufs.push_back(static_cast<char*>(p));
    reqs.push_back({&files[i], 0, files[i].size, bufs.back(), room});
  }
  std::vector<absl::Status> got = origin->ReadMany(reqs);
  for (size_t i = 0; i < files.size(); i++) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i];
    EXPECT_EQ(std::string(bufs[i], files[i].size), bodies[i]) << i;
  }
  if (dropped[0]) {
    EXPECT_FALSE(cached(0)) << "a cold file with room for whole pages went through the page cache";
  }
  EXPECT_TRUE(cached(1));  // was warm: read from there
  if (dropped[2]) {
    EXPECT_TRUE(cached(2)) << "no room for whole pages: read through the page cache";
  }
  if (dropped[3]) {
    EXPECT_TRUE(cached(3)) << "below kDirectReadMin: read through the page cache";
  }
  for (char* b : bufs) free(b);
}

// Many reads at once (more than one submission holds): each file's bytes land in its own buffer,
// and a file that is changed, gone, escaping or shorter than its manifest fails alone, with what
// Read says of it; through the router as well.
TEST(PosixOriginTest, ReadManyReadsEachFileAndFailsOnlyTheBadOnes) {
  TempDir d;
  std::vector<OriginFile> files;
  std::vector<std::string> bodies;
  std::filesystem::create_directories(d.Sub("o/dir"));
  for (int i = 0; i < 150; i++) {
    const std::string rel = absl::StrCat("dir/f", i);
    bodies.push_back(std::string(100 + i * 53, static_cast<char>('A' + i % 50)) +
                     std::to_string(i));
    WriteFile(d.Sub("o/" + rel), bodies.back());
    struct stat st;
    ASSERT_EQ(stat(d.Sub("o/" + rel).c_str(), &st), 0);
    files.push_back({d.Sub("o"), rel, bodies.back().size(),
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                     ""});
  }
  files[7].size += 1;                                     // changed since the manifest
  files[8].path = "dir/gone";                             // gone
  files[9].path = "../o/dir/f9";                          // escaping
  ASSERT_EQ(truncate(d.Sub("o/dir/f10").c_str(), 5), 0);  // the file shrank: size differs
  // A symlink on the way inside the origin is refused; a root reached through a symlink is
  // read (the batch's open refuses it, the file is opened alone beneath the root).
  ASSERT_EQ(symlink(d.Sub("o/dir").c_str(), d.Sub("o/link").c_str()), 0);
  files[12].path = "link/f12";
  ASSERT_EQ(symlink(d.Sub("o").c_str(), d.Sub("root-link").c_str()), 0);
  files[13].root = d.Sub("root-link");
  auto open_fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                         std::filesystem::directory_iterator());
  };
  (void)BatchPreadUsesUring();  // this thread's ring (an fd of its own) set up beforehand
  const auto fds_before = open_fds();
  for (auto& origin : {NewPosixOrigin(), NewOriginRouter()}) {
    std::vector<std::string> bufs(files.size());
    std::vector<Origin::ReadRequest> reqs;
    for (size_t i = 0; i < files.size(); i++) {
      bufs[i].assign(files[i].size, '\0');
      reqs.push_back({&files[i], 0, files[i].size, bufs[i].data()});
    }
    // One read of part of a file, at an offset.
    reqs[11].offset = 10;
    reqs[11].len = 20;
    EXPECT_TRUE(origin->ReadsManyAtOnce(files[0].root));
    std::vector<absl::Status> got = origin->ReadMany(reqs);
    ASSERT_EQ(got.size(), files.size());
    EXPECT_EQ(got[7].code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(got[8].code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(got[9].code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(got[10].code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(got[11].ok());
    EXPECT_EQ(bufs[11].substr(0, 20), bodies[11].substr(10, 20));
    EXPECT_EQ(got[12].code(), absl::StatusCode::kFailedPrecondition) << got[12];
    for (size_t i = 0; i < files.size(); i++) {
      if ((i >= 7 && i <= 11) || i == 12) continue;
      ASSERT_TRUE(got[i].ok()) << i << ": " << got[i];
      EXPECT_EQ(bufs[i], bodies[i]) << i;
    }
  }
  EXPECT_EQ(open_fds(), fds_before) << "every file opened was closed";
}

// An origin is a path: a root replaced by another directory (renamed over it) is read from the
// new one, and a root that went away is NotFound, not read where it moved.
TEST(PosixOriginTest, AReplacedRootIsReadFromTheNewDirectory) {
  TempDir d;
  auto write = [](const std::string& path, const std::string& body) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << body;
  };
  auto posix = NewPosixOrigin();
  auto file_of = [&](const std::string& path) {
    struct stat st;
    EXPECT_EQ(stat(d.Sub("root/" + path).c_str(), &st), 0);
    return OriginFile{d.Sub("root"), path, static_cast<uint64_t>(st.st_size),
                      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                      ""};
  };
  write(d.Sub("root/old"), "old bytes");
  std::string buf(9, '\0');
  ASSERT_TRUE(posix->Read(file_of("old"), 0, 9, buf.data()).ok());
  EXPECT_EQ(buf, "old bytes");
  write(d.Sub("next/new"), "new bytes");
  std::filesystem::rename(d.Sub("root"), d.Sub("gone"));
  std::filesystem::rename(d.Sub("next"), d.Sub("root"));
  ASSERT_TRUE(posix->Read(file_of("new"), 0, 9, buf.data()).ok());
  EXPECT_EQ(buf, "new bytes");
  OriginFile old_file{d.Sub("root"), "old", 9, 0, ""};
  EXPECT_EQ(posix->Read(old_file, 0, 9, buf.data()).code(), absl::StatusCode::kNotFound);
  std::filesystem::rename(d.Sub("root"), d.Sub("moved"));
  OriginFile none{d.Sub("root"), "new", 9, 0, ""};
  EXPECT_EQ(posix->Read(none, 0, 9, buf.data()).code(), absl::StatusCode::kNotFound);
}

TEST(RouterTest, DirectoriesWalkAndReadThroughPosixRemoteUrisAreChecked) {
  TempDir d;
  MakeTree(d);
  auto router = NewOriginRouter();
  auto posix = NewPosixOrigin();
  EXPECT_EQ(WalkOf(*router, d.Sub("o")).Paths(), WalkOf(*posix, d.Sub("o")).Paths());
  EXPECT_EQ(WalkOf(*router, "s3:///prefix").status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(IsRemoteOrigin("s3://b/p"));
  EXPECT_TRUE(IsRemoteOrigin("https://h/p"));
  EXPECT_FALSE(IsRemoteOrigin("/data"));
  EXPECT_EQ(OpenRemoteOrigin("/data").status().code(), absl::StatusCode::kInvalidArgument);
}

// An HTTP origin on loopback that answers ranged GETs and records them (one range per GET).
class RangeServer {
 public:
  explicit RangeServer(std::string body) : body_(std::move(body)) {
    server_.Get("/d/f.bin", [this](const httplib::Request& req, httplib::Response& res) {
      auto [from, to] = req.ranges.at(0);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ranges_.emplace_back(from, to);
      }
      // httplib answers the range itself (206, Content-Range) from the whole body.
      res.set_content(changed_ && from > 0 ? changed_body_ : body_, "application/octet-stream");
    });
    server_.set_keep_alive_max_count(1);  // stop() then need not wait for idle connections
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~RangeServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_, "/d"); }
  std::vector<std::pair<int64_t, int64_t>> Ranges() {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = ranges_;
    std::sort(r.begin(), r.end());
    ranges_.clear();
    return r;
  }
  // From now on, parts after the first see a longer object (it changed mid-read).
  void Change() {
    changed_body_ = body_ + "more";
    changed_ = true;
  }

 private:
  const std::string body_;
  std::string changed_body_;
  std::atomic<bool> changed_{false};
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

// A block's read from a remote origin is ranged GETs of its parts at once; the bytes are exact,
// and a part that finds the object changed fails the whole read.
TEST(RemoteOriginTest, ALargeReadIsPartsFetchedAtOnce) {
  std::string body(5 << 20, '\0');
  for (size_t i = 0; i < body.size(); i++) body[i] = static_cast<char>(i * 13 + i / 7919);
  RangeServer server(body);
  auto origin = OpenRemoteOrigin(server.url());
  ASSERT_TRUE(origin.ok()) << origin.status();
  OriginFile f{server.url(), "f.bin", body.size(), 0, ""};
  std::string got(4 << 20, '\0');
  ASSERT_TRUE((*origin)->Read(f, 1 << 20, got.size(), got.data()).ok());
  EXPECT_TRUE(got == body.substr(1 << 20, 4 << 20));
  using R = std::pair<int64_t, int64_t>;
  EXPECT_EQ(server.Ranges(), (std::vector<R>{{1 << 20, (2 << 20) - 1},
                                             {2 << 20, (3 << 20) - 1},
                                             {3 << 20, (4 << 20) - 1},
                                             {4 << 20, (5 << 20) - 1}}));
  // A small read stays one GET.
  std::string small(100 << 10, '\0');
  ASSERT_TRUE((*origin)->Read(f, 7, small.size(), small.data()).ok());
  EXPECT_TRUE(small == body.substr(7, small.size()));
  EXPECT_EQ(server.Ranges(), (std::vector<R>{{7, 7 + (100 << 10) - 1}}));
  server.Change();
  auto st = (*origin)->Read(f, 0, got.size(), got.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
}

TEST(NormalizeOriginTest, Validates) {
  TempDir d;
  MakeTree(d);
  EXPECT_EQ(*NormalizeOrigin(d.Sub("o") + "/"), d.Sub("o"));
  EXPECT_EQ(*NormalizeOrigin("file://" + d.Sub("o")), d.Sub("o"));
  EXPECT_EQ(*NormalizeOrigin("s3://bucket/prefix/"), "s3://bucket/prefix");
  EXPECT_EQ(*NormalizeOrigin("http://host/"), "http://host");
  EXPECT_EQ(NormalizeOrigin("s3://").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NormalizeOrigin("relative/path").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NormalizeOrigin("s3x://bucket").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NormalizeOrigin(d.Sub("missing")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(NormalizeOrigin(d.Sub("o/empty")).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ember::origin
