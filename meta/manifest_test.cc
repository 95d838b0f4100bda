#include "meta/manifest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "origin/origin.h"
#include "tests/testing/testing.h"

namespace ember::meta {
namespace {

using ember::testing::TempDir;
using ember::testing::WriteFile;

struct Scanned {
  std::vector<std::pair<std::string, rpc::FileEntry>> entries;
  ScanStats stats;
};

Scanned Scan(const std::string& root) {
  Scanned s;
  auto r = ScanOrigin(root, [&](const rpc::FileEntry& e, std::string_view path) {
    s.entries.emplace_back(std::string(path), e);
    return absl::OkStatus();
  });
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) s.stats = *r;
  return s;
}

EntryStream StreamOf(const Scanned& s) {
  auto pos = std::make_shared<size_t>(0);
  return [&s, pos](std::string* p, rpc::FileEntry* e) {
    if (*pos >= s.entries.size()) return false;
    *p = s.entries[*pos].first;
    *e = s.entries[*pos].second;
    ++*pos;
    return true;
  };
}

void MakeTree(const TempDir& d) { ember::testing::MakeSampleTree(d.Sub("o")); }

TEST(ScanOriginTest, NumbersTheWalkWithStableIds) {
  TempDir d;
  MakeTree(d);
  Scanned s = Scan(d.Sub("o"));
  std::vector<std::string> paths;
  for (auto& [p, e] : s.entries) paths.push_back(p);
  std::vector<std::string> want{"", "a", "a/b", "a/b/f1", "a-c", "a-c/f2", "empty", "link"};
  EXPECT_EQ(paths, want);
  for (size_t i = 0; i < s.entries.size(); i++) {
    EXPECT_EQ(s.entries[i].second.file_id(), i + 1);
    if (i > 0) {
      EXPECT_LT(ComparePaths(paths[i - 1], paths[i]), 0);
    }
  }
  EXPECT_EQ(s.stats.files, 3u);
  EXPECT_EQ(s.stats.dirs, 4u);
  EXPECT_EQ(s.stats.symlinks, 1u);
  EXPECT_EQ(s.stats.skipped, 1u);  // the fifo
  EXPECT_EQ(s.stats.bytes, 1005u);
  EXPECT_EQ(s.stats.max_file_id, 8u);
  const auto& link = s.entries[7].second;
  EXPECT_EQ(link.type(), rpc::FileEntry::SYMLINK);
  EXPECT_EQ(link.link_target(), "a/b/f1");
  const auto& f1 = s.entries[3].second;
  EXPECT_EQ(f1.parent_id(), 3u);
  EXPECT_EQ(f1.name(), "f1");
  EXPECT_EQ(f1.size(), 5u);
  EXPECT_TRUE(S_ISREG(f1.mode()));
  EXPECT_GT(f1.mtime_ns(), 0);
  // A second scan of the same tree is identical.
  EXPECT_EQ(Scan(d.Sub("o")).stats.fingerprint, s.stats.fingerprint);
}

TEST(ScanOriginTest, MissingOriginAndSinkErrors) {
  TempDir d;
  auto r = ScanOrigin(d.Sub("nope"), [](auto&, auto) { return absl::OkStatus(); });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("nope"), std::string::npos);
  // A sink error stops the scan and is returned.
  MakeTree(d);
  int calls = 0;
  r = ScanOrigin(d.Sub("o"), [&](auto&, auto) {
    return ++calls == 3 ? absl::ResourceExhaustedError("stop") : absl::OkStatus();
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 3);
}

TEST(DiffManifestsTest, FindsAddsRemovesAndChanges) {
  TempDir d;
  MakeTree(d);
  Scanned before = Scan(d.Sub("o"));
  EXPECT_EQ(DiffManifests(StreamOf(before), StreamOf(before)), DiffCounts{});
  // Add a file, remove one, change one (size), touch nothing else.
  WriteFile(d.Sub("o/a/new"), "n");
  std::filesystem::remove(d.Sub("o/empty"));
  WriteFile(d.Sub("o/a-c/f2"), std::string(1001, 'x'));
  Scanned after = Scan(d.Sub("o"));
  EXPECT_NE(after.stats.fingerprint, before.stats.fingerprint);
  DiffCounts diff = DiffManifests(StreamOf(before), StreamOf(after));
  EXPECT_EQ(diff.added, 1u);
  EXPECT_EQ(diff.removed, 1u);
  // f2 changed; directories a, a-c and the root changed mtime.
  EXPECT_GE(diff.modified, 1u);
  EXPECT_LE(diff.modified, 4u);
}

// An origin whose walk is given: the walk of a flat listing, or a status.
class FakeOrigin final : public origin::Origin {
 public:
  absl::StatusOr<origin::WalkStats> Walk(const std::string& root, const origin::EntryFn& fn,
                                         const origin::ListProgress& progress) override {
    if (progress) progress(1000, 123);
    if (!status.ok()) return status;
    if (!in_order) {
      for (const auto& e : objects) RETURN_IF_ERROR(fn(e));
      return origin::WalkStats{};
    }
    return origin::WalkObjects(objects, fn);
  }
  absl::Status Read(const origin::OriginFile&, uint64_t, size_t, char*) override {
    return absl::UnimplementedError("not read");
  }
  std::vector<origin::OriginEntry> objects;
  absl::Status status;
  bool in_order = true;  // false: hand `objects` over as they are
};

origin::OriginEntry Object(const std::string& path, uint64_t size, int64_t mtime_ns,
                           const std::string& etag) {
  origin::OriginEntry o;
  o.path = path;
  o.size = size;
  o.mode = S_IFREG | 0444;
  o.mtime_ns = mtime_ns;
  o.etag = etag;
  return o;
}

TEST(ScanOriginTest, ServerDownIsOriginUnreachableSinkErrorsPassUnchanged) {
  FakeOrigin fake;
  fake.status = absl::UnavailableError("connection refused");
  auto ok_sink = [](auto&, auto) { return absl::OkStatus(); };
  auto r = ScanOrigin(fake, "s3://bkt/x", ok_sink);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "origin unreachable: connection refused");
  fake.status = absl::DeadlineExceededError("stalled");
  EXPECT_EQ(ScanOrigin(fake, "s3://bkt/x", ok_sink).status().code(),
            absl::StatusCode::kFailedPrecondition);
  fake.status = absl::PermissionDeniedError("403");
  EXPECT_EQ(ScanOrigin(fake, "s3://bkt/x", ok_sink).status().code(),
            absl::StatusCode::kPermissionDenied);
  fake.status = absl::OkStatus();
  fake.objects = {Object("f", 1, 0, "")};
  r = ScanOrigin(fake, "s3://bkt/x", [](auto&, auto) { return absl::UnavailableError("store"); });
  EXPECT_EQ(r.status(), absl::UnavailableError("store"));
}

TEST(ScanOriginTest, ListingProgressIsReportedAsEntriesAndBytes) {
  FakeOrigin fake;
  fake.objects = {Object("f", 1, 0, "")};
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  auto r = ScanOrigin(
      fake, "s3://bkt/x", [](auto&, auto) { return absl::OkStatus(); },
      [&](const ScanStats& s) { seen.emplace_back(s.entries, s.bytes); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(seen, (std::vector<std::pair<uint64_t, uint64_t>>{{1000, 123}}));
}

TEST(ScanOriginTest, AWalkOutOfPreorderIsAnInternalError) {
  FakeOrigin fake;
  fake.in_order = false;
  origin::OriginEntry root;
  root.type = origin::OriginEntry::Type::kDir;
  fake.objects = {root, Object("a/f", 1, 0, "")};  // a/ never walked
  auto r = ScanOrigin(fake, "s3://bkt/x", [](auto&, auto) { return absl::OkStatus(); });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
}

// ---- fingerprint regression (pins the walk's entries and the fingerprint of known trees) ----

// "path|id|parent|name|type|size|mode|uid|gid|mtime|target|etag" for each entry.
std::vector<std::string> Describe(const Scanned& s) {
  std::vector<std::string> out;
  for (const auto& [p, e] : s.entries) {
    out.push_back(absl::StrCat(p, "|", e.file_id(), "|", e.parent_id(), "|", e.name(), "|",
                               static_cast<int>(e.type()), "|", e.size(), "|", e.mode(), "|",
                               e.uid(), "|", e.gid(), "|", e.mtime_ns(), "|", e.link_target(), "|",
                               e.etag()));
  }
  return out;
}

TEST(FingerprintTest, PosixTreeIsUnchanged) {
  TempDir d;
  MakeTree(d);
  chmod(d.Sub("o/a").c_str(), 0751);
  chmod(d.Sub("o/a/b/f1").c_str(), 0600);
  for (const char* p : {"o", "o/a/b", "o/a-c"}) chmod(d.Sub(p).c_str(), 0755);
  for (const char* p : {"o/a-c/f2", "o/empty"}) chmod(d.Sub(p).c_str(), 0644);
  bool root = getuid() == 0;
  int64_t t = 1'700'000'000'123'456'789;
  for (const char* p :
       {"o/a/b/f1", "o/a-c/f2", "o/empty", "o/link", "o/a/b", "o/a", "o/a-c", "o"}) {
    struct timespec ts[2] = {{t / 1'000'000'000, t % 1'000'000'000},
                             {t / 1'000'000'000, t % 1'000'000'000}};
    ASSERT_EQ(utimensat(AT_FDCWD, d.Sub(p).c_str(), ts, AT_SYMLINK_NOFOLLOW), 0) << p;
    if (root) {
      ASSERT_EQ(lchown(d.Sub(p).c_str(), 1000, 2000), 0) << p;
    }
    t += 1'000'000'007;
  }
  Scanned s = Scan(d.Sub("o"));
  std::string u = root ? "1000" : std::to_string(getuid());
  std::string g = root ? "2000" : std::to_string(getgid());
  auto owner = [&](const std::string& a, const std::string& b) {
    return a + "|" + u + "|" + g + "|" + b;
  };
  std::vector<std::string> want{
      owner("|1|0||2|0|16877", "1700000007123456838||"),
      owner("a|2|1|a|2|0|16873", "1700000005123456824||"),
      owner("a/b|3|2|b|2|0|16877", "1700000004123456817||"),
      owner("a/b/f1|4|3|f1|1|5|33152", "1700000000123456789||"),
      owner("a-c|5|1|a-c|2|0|16877", "1700000006123456831||"),
      owner("a-c/f2|6|5|f2|1|1000|33188", "1700000001123456796||"),
      owner("empty|7|1|empty|1|0|33188", "1700000002123456803||"),
      owner("link|8|1|link|3|6|41471", "1700000003123456810|a/b/f1|"),
  };
  EXPECT_EQ(Describe(s), want);
  EXPECT_EQ(s.stats.skipped, 1u);
  if (root) {
    EXPECT_EQ(s.stats.fingerprint, 8724387586600585098u);
  }
}

TEST(FingerprintTest, ObjectListingIsUnchanged) {
  FakeOrigin fake;
  fake.objects = {Object("z", 3, 1'700'000'000'000'000'000, "\"e-z\""),
                  Object("a/b/f1", 5, 1'700'000'001'000'000'000, "\"e-f1\""),
                  Object("a-c/f2", 1000, 1'700'000'002'000'000'000, ""),
                  Object("empty", 0, 0, "\"e-empty\""),
                  Object("a/b2", 7, 1'700'000'003'000'000'000, "\"e-b2\"")};
  Scanned s;
  auto r = ScanOrigin(fake, "s3://bkt/x", [&](const rpc::FileEntry& e, std::string_view path) {
    s.entries.emplace_back(std::string(path), e);
    return absl::OkStatus();
  });
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> want{"|1|0||2|0|16749|0|0|0||",
                                "a|2|1|a|2|0|16749|0|0|0||",
                                "a/b|3|2|b|2|0|16749|0|0|0||",
                                "a/b/f1|4|3|f1|1|5|33060|0|0|1700000001000000000||\"e-f1\"",
                                "a/b2|5|2|b2|1|7|33060|0|0|1700000003000000000||\"e-b2\"",
                                "a-c|6|1|a-c|2|0|16749|0|0|0||",
                                "a-c/f2|7|6|f2|1|1000|33060|0|0|1700000002000000000||",
                                "empty|8|1|empty|1|0|33060|0|0|0||\"e-empty\"",
                                "z|9|1|z|1|3|33060|0|0|1700000000000000000||\"e-z\""};
  EXPECT_EQ(Describe(s), want);
  EXPECT_EQ(r->fingerprint, 11559868302914262717u);
  EXPECT_EQ(r->skipped, 0u);
  // A name that is both an object and a folder.
  fake.objects.push_back(Object("z/y", 1, 0, ""));
  EXPECT_EQ(
      ScanOrigin(fake, "s3://bkt/x", [](auto&, auto) { return absl::OkStatus(); }).status().code(),
      absl::StatusCode::kFailedPrecondition);
}
}  // namespace
}  // namespace ember::meta
