// The node agent through a real FUSE mount: a real `ember meta` and `ember node` process each,
// RocksDB in temp dirs, reads through the kernel.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/testing/cluster.h"
#include "tests/testing/testing.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using testing::MetaProcess;
using testing::NodeProcess;
using testing::ReadFile;
using testing::ReadUncached;
using testing::RunEmber;
using testing::TempDir;
using testing::WaitFor;
using testing::WriteFile;
using testing::WriteRandomFile;

constexpr uint64_t kMiB = 1 << 20;

// Returns errno of reading the whole file, 0 if it read fine.
int ReadErrno(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return errno;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  char buf[1 << 16];
  int err = 0;
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      err = errno;
      break;
    }
    if (n == 0) break;
  }
  close(fd);
  return err;
}

// The mount suite's io_uring run (tests/CMakeLists.txt): every node gets --fuse-uring.
bool UringSuite() {
  const char* u = std::getenv("EMBER_TEST_FUSE_URING");
  return u != nullptr && *u == '1';
}

class MountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (UringSuite() && !testing::EnableFuseUring()) {
      GTEST_SKIP() << "this kernel has no FUSE over io_uring";
    }
    meta_ = std::make_unique<MetaProcess>(dir_.Sub("meta"), "900ms");
    origin_ = dir_.Sub("origin");
  }

  void MakeDataset(bool big) {
    fs::create_directories(origin_ + "/a/b/c");
    fs::create_directories(origin_ + "/empty-dir");
    WriteFile(origin_ + "/empty", "");
    WriteFile(origin_ + "/a/small.txt", "hello ember\n");
    uint64_t sizes[] = {4 * kMiB - 1, 4 * kMiB, 4 * kMiB + 1, 8 * kMiB - 1, 8 * kMiB + 1, 1};
    int i = 0;
    for (uint64_t s : sizes) {
      WriteRandomFile(absl::StrCat(origin_, "/a/b/edge-", i), s, 100 + i);
      i++;
    }
    for (int f = 0; f < 50; f++) {
      WriteRandomFile(absl::StrCat(origin_, "/a/b/c/img-", f, ".jpg"), 112 << 10, 1000 + f);
    }
    fs::create_symlink("a/small.txt", origin_ + "/link-in");
    fs::create_symlink("/etc/hostname", origin_ + "/link-out");
    if (big) WriteRandomFile(origin_ + "/big.bin", 200 * kMiB, 7);
    Ember({"dataset", "add", "ds", origin_});
  }

  testing::RunResult Ember(std::vector<std::string> args, bool expect_ok = true) {
    args.push_back("--meta");
    args.push_back(meta_->address());
    auto r = RunEmber(args);
    if (expect_ok) {
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    return r;
  }

  std::unique_ptr<NodeProcess> StartNode(NodeProcess::Options o = {}) {
    auto n = std::make_unique<NodeProcess>(dir_.Sub("node-" + o.id), meta_->address(), o);
    EXPECT_TRUE(n->Start());
    return n;
  }

  rpc::NodeStats Settled(NodeProcess& n) {
    return n.SettledStats(meta_->client(), std::chrono::milliseconds(400));
  }

  // Every regular file under the origin, compared through the mount.
  void ExpectSameTree(const std::string& mnt_root) {
    int files = 0;
    for (auto& e : fs::recursive_directory_iterator(origin_)) {
      std::string rel = e.path().lexically_relative(origin_).string();
      std::string m = mnt_root + "/" + rel;
      struct stat so, sm;
      ASSERT_EQ(lstat(e.path().c_str(), &so), 0);
      ASSERT_EQ(lstat(m.c_str(), &sm), 0) << m << ": " << strerror(errno);
      EXPECT_EQ(so.st_mode & S_IFMT, sm.st_mode & S_IFMT) << rel;
      EXPECT_EQ(so.st_mode & 0555, sm.st_mode & 0555) << rel;
      EXPECT_EQ(sm.st_mode & 0222, 0u) << rel;
      EXPECT_EQ(so.st_mtim.tv_sec, sm.st_mtim.tv_sec) << rel;
      if (S_ISLNK(so.st_mode)) {
        EXPECT_EQ(fs::read_symlink(e.path()), fs::read_symlink(m)) << rel;
      } else if (S_ISREG(so.st_mode)) {
        EXPECT_EQ(so.st_size, sm.st_size) << rel;
        EXPECT_TRUE(ReadFile(e.path()) == ReadUncached(m)) << rel << " differs";  // no dumps
        files++;
      } else if (S_ISDIR(so.st_mode)) {
        std::set<std::string> a, b;
        for (auto& c : fs::directory_iterator(e.path())) a.insert(c.path().filename());
        for (auto& c : fs::directory_iterator(m)) b.insert(c.path().filename());
        EXPECT_EQ(a, b) << rel;
      }
    }
    EXPECT_GT(files, 0);
  }

  void MmapChecks(NodeProcess& node);

  TempDir dir_;
  std::string origin_;
  std::unique_ptr<MetaProcess> meta_;
};

TEST_F(MountTest, GeneratedDatasetIsByteIdenticalAndSecondReadHits) {
  MakeDataset(/*big=*/true);
  NodeProcess::Options o;
  o.extra_args = {"--no-passthrough"};  // the daemon's cache hits are what is counted here
  auto node = StartNode(o);
  std::string mnt = node->mount() + "/ds";
  // The root lists the dataset; readdir and stat match the origin; bytes are identical.
  std::set<std::string> root;
  for (auto& c : fs::directory_iterator(node->mount())) root.insert(c.path().filename());
  EXPECT_EQ(root, std::set<std::string>{"ds"});
  ExpectSameTree(mnt);
  rpc::NodeStats first = Settled(*node);
  uint64_t blocks = 0;
  for (auto& e : fs::recursive_directory_iterator(origin_)) {
    if (e.is_regular_file() && !e.is_symlink()) {
      blocks += (fs::file_size(e) + 4 * kMiB - 1) / (4 * kMiB);
    }
  }
  EXPECT_EQ(first.origin_block_reads(), blocks);
  EXPECT_EQ(first.bytes_from_origin(), first.used_bytes());
  // Second epoch with the page cache dropped: served by the daemon from the cache.
  ExpectSameTree(mnt);
  rpc::NodeStats second = Settled(*node);
  EXPECT_EQ(second.origin_block_reads(), first.origin_block_reads());
  EXPECT_GE(second.hits(), blocks);
  EXPECT_GE(second.bytes_from_cache(), 200 * kMiB);
  // ember status shows the figures.
  auto st = Ember({"status"});
  EXPECT_NE(st.out.find("alive"), std::string::npos) << st.out;
  // Read-only: writes and creates fail with EROFS.
  int fd = open((mnt + "/a/small.txt").c_str(), O_WRONLY);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(mkdir((mnt + "/new").c_str(), 0755), -1);
  EXPECT_EQ(errno, EROFS);
  // The preferred I/O size follows the file: readers that size a buffer by it (GNU cat, Python's
  // open) allocate 4 KiB for a tiny file, not 1 MiB per file as before; large files get 1 MiB.
  struct stat sb;
  ASSERT_EQ(stat((mnt + "/a/small.txt").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_blksize, 4096);
  ASSERT_EQ(stat((mnt + "/a/b/c/img-0.jpg").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_blksize, 128 << 10);
  ASSERT_EQ(stat((mnt + "/big.bin").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_blksize, 1 << 20);
  // Symlinks are shown, never followed out of the dataset.
  EXPECT_EQ(fs::read_symlink(mnt + "/link-out"), "/etc/hostname");
  EXPECT_EQ(ReadUncached(mnt + "/link-in"), "hello ember\n");
  EXPECT_TRUE(node->Stop()) << node->Log();
}

TEST_F(MountTest, RestartKeepsBlocksAndCorruptionIsRefetched) {
  MakeDataset(false);
  auto node = StartNode();
  ExpectSameTree(node->mount() + "/ds");
  rpc::NodeStats s1 = Settled(*node);
  ASSERT_GT(s1.resident_blocks(), 0u);
  ASSERT_TRUE(node->Stop()) << node->Log();

  // Flip one byte of a cached block on disk while the agent is down.
  std::string victim;
  for (auto& e : fs::recursive_directory_iterator(node->cache_dir() + "/blocks")) {
    if (e.is_regular_file() && fs::file_size(e) == 8 * kMiB + 1) victim = e.path();
  }
  ASSERT_FALSE(victim.empty());
  {
    int fd = open(victim.c_str(), O_RDWR);
    char c;
    ASSERT_EQ(pread(fd, &c, 1, 5 * kMiB), 1);
    c ^= 0x5a;
    ASSERT_EQ(pwrite(fd, &c, 1, 5 * kMiB), 1);
    close(fd);
  }
  ASSERT_TRUE(node->Start());
  ExpectSameTree(node->mount() + "/ds");
  rpc::NodeStats s2 = Settled(*node);
  EXPECT_EQ(s2.checksum_failures(), 1u);
  EXPECT_EQ(s2.origin_block_reads(), 1u);  // only the corrupt block came from the origin again
  // Everything else was served from the cache kept across the restart: through the agent (hits)
  // or, for wholly cached files, by the kernel from the cache file (passthrough opens).
  EXPECT_EQ(s2.resident_blocks(), s1.resident_blocks());
  EXPECT_GT(s2.hits() + s2.passthrough_opens(), 0u);
}

TEST_F(MountTest, SmallCacheStaysUnderCapWithCorrectBytes) {
  MakeDataset(false);  // ~31 MiB of data
  NodeProcess::Options o;
  o.cache_size = "12MiB";
  auto node = StartNode(o);
  for (int epoch = 0; epoch < 3; epoch++) {
    ExpectSameTree(node->mount() + "/ds");
    rpc::NodeStats s = Settled(*node);
    EXPECT_LE(s.used_bytes(), 12 * kMiB);
    uint64_t on_disk = 0;
    for (auto& e : fs::recursive_directory_iterator(node->cache_dir() + "/blocks")) {
      struct stat st;
      if (e.is_regular_file() && stat(e.path().c_str(), &st) == 0) on_disk += st.st_blocks * 512;
    }
    EXPECT_LE(on_disk, 12 * kMiB + 64 * 4096) << "epoch " << epoch;
  }
}

// Training epochs over a dataset 1.5x the cache: from the second epoch on, at least half of the
// bytes come from the cache (plain LRU would give 0).
TEST_F(MountTest, RepeatedEpochsLargerThanCacheKeepHitting) {
  fs::create_directories(origin_);
  for (int i = 0; i < 12; i++) {
    WriteRandomFile(absl::StrCat(origin_, "/shard-", i), 4 * kMiB, 50 + i);
  }
  Ember({"dataset", "add", "ds", origin_});
  NodeProcess::Options o;
  o.cache_size = "32MiB";
  o.extra_args = {"--no-passthrough"};  // counts the daemon's hits
  auto node = StartNode(o);
  uint64_t cache_before = 0, origin_before = 0;
  for (int epoch = 0; epoch < 4; epoch++) {
    for (int i = 0; i < 12; i++) {
      std::string name = absl::StrCat("/shard-", i);
      ASSERT_TRUE(ReadUncached(node->mount() + "/ds" + name) == ReadFile(origin_ + name));
    }
    rpc::NodeStats s = Settled(*node);
    // The hit ratio is the share of the epoch's bytes that did not come from the origin.
    double from_origin = static_cast<double>(s.bytes_from_origin() - origin_before) / (48 * kMiB);
    std::printf("epoch %d: hit ratio %.0f%% (%.0f%% of bytes read from the origin)\n", epoch,
                (1 - from_origin) * 100, from_origin * 100);
    if (epoch > 0) {
      EXPECT_GE(1 - from_origin, 0.5) << "epoch " << epoch;
      EXPECT_GE(s.bytes_from_cache() - cache_before, 24 * kMiB) << "epoch " << epoch;
    }
    EXPECT_LE(s.used_bytes(), 32 * kMiB);
    cache_before = s.bytes_from_cache();
    origin_before = s.bytes_from_origin();
  }
}

TEST_F(MountTest, ConcurrentColdReadersFillEachBlockOnce) {
  fs::create_directories(origin_);
  WriteRandomFile(origin_ + "/shard.tar", 64 * kMiB + 12345, 3);
  Ember({"dataset", "add", "ds", origin_});
  auto node = StartNode();
  std::string want = ReadFile(origin_ + "/shard.tar");
  std::vector<std::thread> readers;
  std::atomic<int> bad{0};
  for (int i = 0; i < 16; i++) {
    readers.emplace_back([&] {
      if (ReadUncached(node->mount() + "/ds/shard.tar") != want) bad++;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(Settled(*node).origin_block_reads(), 17u);  // 64 MiB + a bit = 17 blocks
}

// mmap (safetensors, numpy memmap) of files read through the agent (not yet cached; also as
// direct-I/O opens with --direct-io) and of cached ones (passthrough), shared and private.
TEST_F(MountTest, MmapOfColdAndCachedFilesGivesTheRightBytes) {
  MakeDataset(/*big=*/false);
  for (bool direct_io : {false, true}) {
    NodeProcess::Options o;
    o.id = direct_io ? "dio" : "n1";
    if (direct_io) o.extra_args = {"--direct-io"};
    auto node = StartNode(o);
    MmapChecks(*node);
    EXPECT_TRUE(node->Stop()) << node->Log();
  }
}

void MountTest::MmapChecks(NodeProcess& n) {
  NodeProcess* node = &n;
  auto mapped = [](const std::string& path, int flags) -> std::string {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return "open: " + std::string(strerror(errno));
    struct stat st;
    fstat(fd, &st);
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, flags, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return "mmap: " + std::string(strerror(errno));
    std::string out(static_cast<const char*>(p), static_cast<size_t>(st.st_size));
    munmap(p, static_cast<size_t>(st.st_size));
    return out;
  };
  for (int pass = 0; pass < 2; pass++) {  // cold, then cached
    for (int i = 0; i < 6; i++) {
      std::string rel = absl::StrCat("a/b/edge-", i);
      std::string want = ReadFile(origin_ + "/" + rel);
      for (int flags : {MAP_SHARED, MAP_PRIVATE}) {
        std::string got = mapped(node->mount() + "/ds/" + rel, flags);
        EXPECT_TRUE(got == want) << rel << " pass " << pass << " flags " << flags << ": "
                                 << got.substr(0, 40);
      }
    }
  }
  // A cold file mapped while another reader streams it.
  std::string want = ReadFile(origin_ + "/a/b/c/img-7.jpg");
  std::thread reader(
      [&] { EXPECT_TRUE(ReadUncached(node->mount() + "/ds/a/b/c/img-7.jpg") == want); });
  EXPECT_TRUE(mapped(node->mount() + "/ds/a/b/c/img-7.jpg", MAP_SHARED) == want);
  reader.join();
  if (HasFailure()) ADD_FAILURE() << "the node's log: " << node->Log();
}

TEST_F(MountTest, OriginVanishedOrChangedGivesEioNotWrongBytes) {
  MakeDataset(false);
  auto node = StartNode();
  std::string mnt = node->mount() + "/ds";
  // Changed since the snapshot (same size, new mtime and bytes): EIO, never the new bytes.
  WriteRandomFile(origin_ + "/a/b/edge-0", 4 * kMiB - 1, 999);
  EXPECT_EQ(ReadErrno(mnt + "/a/b/edge-0"), EIO);
  // Vanished: EIO for that file; other files still read.
  fs::remove(origin_ + "/a/small.txt");
  EXPECT_EQ(ReadErrno(mnt + "/a/small.txt"), EIO);
  EXPECT_TRUE(ReadUncached(mnt + "/a/b/edge-5") == ReadFile(origin_ + "/a/b/edge-5"));
  std::string log = node->Log();
  EXPECT_NE(log.find("ember dataset refresh ds"), std::string::npos) << log;
  EXPECT_NE(log.find("a/small.txt"), std::string::npos) << log;
  // After a refresh the new version is visible under ds@2 while ds stays pinned to version 1.
  Ember({"dataset", "refresh", "ds"});
  EXPECT_TRUE(ReadUncached(node->mount() + "/ds@2/a/b/edge-0") ==
              ReadFile(origin_ + "/a/b/edge-0"));
  EXPECT_TRUE(fs::exists(mnt + "/a/small.txt"));
  EXPECT_FALSE(fs::exists(node->mount() + "/ds@2/a/small.txt"));
}

// Bytes another node read first (meta holds their checksums) and the origin now has other bytes
// under the same size and mtime (changed in place, mtime put back): never cached, never shared,
// and reads fail with the refresh hint. Meta's checksum, when a Locate told it, refuses the bytes
// before the reply; when the fill skipped Locate (a cold epoch), the claim after the reply finds
// the conflict and later reads fail.
TEST_F(MountTest, OriginChangedInPlaceIsRefusedAndNotCached) {
  MakeDataset(false);
  meta::MetaClient& client = meta_->client();
  auto ds = client.GetDataset("ds");
  ASSERT_TRUE(ds.ok()) << ds.status();
  std::map<std::string, uint64_t> ids;
  ASSERT_TRUE(client
                  .ForEachManifestEntry(
                      "ds", 0, [&](const rpc::FileEntry& e) { ids[e.name()] = e.file_id(); })
                  .ok());
  rpc::RecordChecksumsRequest other;  // what "another node" read: not these files' bytes
  for (const char* name : {"img-1.jpg", "img-2.jpg"}) {
    ASSERT_TRUE(ids.count(name)) << name;
    auto* c = other.add_checksums();
    c->mutable_block()->set_dataset_id(ds->id());
    c->mutable_block()->set_version(ds->latest_version());
    c->mutable_block()->set_file_id(ids[name]);
    c->mutable_block()->set_index(0);
    c->set_checksum(0x0123456789abcdefULL);
  }
  ASSERT_TRUE(client.RecordChecksums(other).ok());

  auto node = StartNode();
  std::string dir = node->mount() + "/ds/a/b/c/";
  // The node's first fill asks meta (Locate), which tells the checksum: refused before the reply.
  EXPECT_EQ(ReadErrno(dir + "img-1.jpg"), EIO);
  // Right after, a cold fill may skip Locate (nobody else holds the dataset): the origin's bytes
  // reach this reader or the read fails; either way the claim conflicts and nothing is cached.
  int first = ReadErrno(dir + "img-2.jpg");
  EXPECT_TRUE(first == 0 || first == EIO) << first;
  EXPECT_TRUE(WaitFor([&] { return node->Log().find("img-2.jpg") != std::string::npos; },
                      std::chrono::seconds(10)))
      << node->Log();
  EXPECT_EQ(ReadErrno(dir + "img-2.jpg"), EIO);
  EXPECT_EQ(ReadErrno(dir + "img-1.jpg"), EIO);
  std::string log = node->Log();
  EXPECT_NE(log.find("ember dataset refresh"), std::string::npos) << log;
  // Meta keeps the first checksums; other files read as ever.
  rpc::GetChecksumsRequest get;
  for (const auto& c : other.checksums()) *get.add_blocks() = c.block();
  auto have = client.GetChecksums(get);
  ASSERT_TRUE(have.ok()) << have.status();
  ASSERT_EQ(have->checksums_size(), 2);
  EXPECT_EQ(have->checksums(0), 0x0123456789abcdefULL);
  EXPECT_EQ(have->checksums(1), 0x0123456789abcdefULL);
  EXPECT_TRUE(ReadUncached(dir + "img-3.jpg") == ReadFile(origin_ + "/a/b/c/img-3.jpg"));
  rpc::NodeStats st = Settled(*node);
  // img-3.jpg and small files after it in the folder, read from the origin in the same batch;
  // never the two whose claims conflicted (the folder holds 50).
  EXPECT_GE(st.resident_blocks(), 1u);
  EXPECT_LE(st.resident_blocks(), 48u) << "a file whose claim conflicted is cached";
}

// --fuse-uring: requests come through the per-CPU rings (not /dev/fuse reads), with the same
// answers: names, attributes, listings, bytes of cold and cached files, errors.
TEST_F(MountTest, RequestsGoThroughIoUringWhenAsked) {
  if (!testing::EnableFuseUring()) GTEST_SKIP() << "this kernel has no FUSE over io_uring";
  if (const char* b = std::getenv("EMBER_TEST_FUSE_BINDING"); b != nullptr && *b != '\0') {
    GTEST_SKIP() << "io_uring is the kernel binding's";  // refused: see BadInputIsRefusedClearly
  }
  MakeDataset(/*big=*/false);
  NodeProcess::Options o;
  if (!UringSuite()) o.extra_args = {"--fuse-uring"};
  auto node = StartNode(o);
  // The rings are registered once INIT is answered, just after the mount is live.
  EXPECT_TRUE(
      WaitFor([&] { return node->Log().find("requests over io_uring") != std::string::npos; },
              std::chrono::seconds(10)))
      << node->Log();
  std::string mnt = node->mount() + "/ds";
  ExpectSameTree(mnt);  // cold: every file filled
  ExpectSameTree(mnt);  // cached (passthrough opens)
  EXPECT_EQ(ReadErrno(mnt + "/missing"), ENOENT);
  int fd = open((mnt + "/a/small.txt").c_str(), O_WRONLY);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(errno, EROFS);
  // Many readers at once: each ring thread holds one request; none is lost or mixed up.
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; t++) {
    readers.emplace_back([&, t] {
      for (int f = t; f < 50; f += 8) {
        std::string rel = absl::StrCat("/a/b/c/img-", f, ".jpg");
        if (ReadUncached(mnt + rel) != ReadFile(origin_ + rel)) wrong++;
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(wrong.load(), 0);
  ASSERT_TRUE(node->Stop()) << node->Log();
  std::string log = node->Log();
  size_t at = log.find("rings stopped after ");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_GT(std::stoull(log.substr(at + std::strlen("rings stopped after "))), 100u) << log;
}

TEST_F(MountTest, BadInputIsRefusedClearly) {
  MakeDataset(false);
  std::string meta = meta_->address();
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"node",
                                  "--meta",
                                  meta,
                                  "--node-id",
                                  "x",
                                  "--listen",
                                  absl::StrCat("127.0.0.1:", testing::FreePort())};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunEmber(args, {}, std::chrono::seconds(20));
  };
  fs::create_directories(dir_.Sub("mnt"));
  fs::create_directories(dir_.Sub("cache"));
  WriteFile(dir_.Sub("file"), "x");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  std::vector<Case> cases = {
      {{"--mount", dir_.Sub("missing"), "--cache-dir", dir_.Sub("cache"), "--cache-size", "1G"},
       "does not exist"},
      {{"--mount", dir_.Sub("file"), "--cache-dir", dir_.Sub("cache"), "--cache-size", "1G"},
       "not a directory"},
      {{"--mount", "/proc", "--cache-dir", dir_.Sub("cache"), "--cache-size", "1G"}, "busy"},
      {{"--mount", dir_.Sub("mnt"), "--cache-dir", "/proc/no/cache", "--cache-size", "1G"},
       "not writable"},
      {{"--mount", dir_.Sub("mnt"), "--cache-dir", dir_.Sub("cache"), "--cache-size", "12Q"},
       "invalid size '12Q'"},
      {{"--mount", dir_.Sub("mnt"), "--cache-dir", dir_.Sub("cache"), "--cache-size", "1G",
        "--warm-memory", "lots"},
       "invalid size 'lots'"},
      {{"--mount", dir_.Sub("mnt"), "--cache-dir", dir_.Sub("cache"), "--cache-size", "1G",
        "--warm-memory", "64TiB"},
       "more than half of this machine's"},
      {{"--mount", dir_.Sub("mnt"), "--cache-dir", dir_.Sub("cache"), "--cache-size", "1G",
        "--labels", "rack"},
       "KEY=VALUE"},
      {{"--mount", dir_.Sub("mnt"), "--cache-dir", dir_.Sub("cache"), "--cache-size", "1G",
        "--fuse-uring", "--takeover"},
       "cannot be combined"},
      {{"--mount", dir_.Sub("mnt"), "--cache-dir", dir_.Sub("cache"), "--cache-size", "1G",
        "--fuse-uring", "--fuse-binding", "libfuse"},
       "needs --fuse-binding kernel"},
  };
  for (const auto& c : cases) {
    auto r = run(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.says;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << "want '" << c.says << "' in: " << r.err;
  }
  EXPECT_FALSE(testing::IsMounted(dir_.Sub("mnt")));
  // A cache larger than the disk only warns.
  NodeProcess::Options o;
  o.cache_size = "900TiB";
  auto node = StartNode(o);
  EXPECT_NE(node->Log().find("larger than the free space"), std::string::npos) << node->Log();
}

TEST_F(MountTest, StaleMountFromKilledAgentIsCleanedUp) {
  MakeDataset(false);
  auto node = StartNode();
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/a/small.txt"), "hello ember\n");
  node->Kill(SIGKILL);
  struct statvfs vfs;
  EXPECT_EQ(statvfs(node->mount().c_str(), &vfs), -1);
  // "Transport endpoint is not connected"; a request caught while the kernel tears down the
  // dead agent's io_uring queues ends with ECONNABORTED or ECANCELED instead.
  EXPECT_TRUE(errno == ENOTCONN || errno == ECONNABORTED || errno == ECANCELED) << strerror(errno);
  ASSERT_TRUE(node->Start());
  EXPECT_EQ(ReadUncached(node->mount() + "/ds/a/small.txt"), "hello ember\n");
  EXPECT_NE(node->Log().find("stale FUSE mount"), std::string::npos);
  EXPECT_TRUE(node->Stop());
}

// The done-criterion of the node agent: real trees of this machine, byte for byte.
TEST_F(MountTest, RealTreesOfThisMachineAreIdentical) {
  for (const char* tree : {"/usr/include", "/usr/lib/x86_64-linux-gnu"}) {
    std::string name = tree == std::string("/usr/include") ? "include" : "lib";
    Ember({"dataset", "add", name, tree});
  }
  NodeProcess::Options o;
  o.cache_size = "4GiB";
  auto node = StartNode(o);
  for (const char* tree : {"/usr/include", "/usr/lib/x86_64-linux-gnu"}) {
    std::string name = tree == std::string("/usr/include") ? "include" : "lib";
    std::string cmd = absl::StrCat("diff -r --no-dereference ", tree, " ", node->mount(), "/", name,
                                   " > ", dir_.Sub("diff.txt"), " 2>&1");
    EXPECT_EQ(system(cmd.c_str()), 0) << ReadFile(dir_.Sub("diff.txt")).substr(0, 2000);
  }
}

}  // namespace
}  // namespace ember
