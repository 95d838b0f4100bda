#include "meta/manifest.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "common/ids.h"
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
  auto r = ScanTree(root, [&](const rpc::FileEntry& e, std::string_view path) {
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

void MakeTree(const TempDir& d) {
  std::filesystem::create_directories(d.Sub("o/a/b"));
  std::filesystem::create_directories(d.Sub("o/a-c"));
  WriteFile(d.Sub("o/a/b/f1"), "hello");
  WriteFile(d.Sub("o/a-c/f2"), std::string(1000, 'x'));
  WriteFile(d.Sub("o/empty"), "");
  symlink("a/b/f1", d.Sub("o/link").c_str());
  mkfifo(d.Sub("o/fifo").c_str(), 0644);
}

TEST(ScanTreeTest, WalksSortedPreorderWithStableIds) {
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

TEST(ScanTreeTest, MissingAndUnreadable) {
  TempDir d;
  auto r = ScanTree(d.Sub("nope"), [](auto&, auto) { return absl::OkStatus(); });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("nope"), std::string::npos);
  // A sink error stops the scan and is returned.
  MakeTree(d);
  int calls = 0;
  r = ScanTree(d.Sub("o"), [&](auto&, auto) {
    return ++calls == 3 ? absl::ResourceExhaustedError("stop") : absl::OkStatus();
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 3);
}

TEST(ScanTreeTest, DiffFindsAddsRemovesAndChanges) {
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

TEST(NormalizeOriginTest, Validates) {
  TempDir d;
  MakeTree(d);
  EXPECT_EQ(*NormalizeOrigin(d.Sub("o") + "/"), d.Sub("o"));
  EXPECT_EQ(*NormalizeOrigin("file://" + d.Sub("o")), d.Sub("o"));
  EXPECT_EQ(NormalizeOrigin("relative/path").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NormalizeOrigin("s3x://bucket").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NormalizeOrigin(d.Sub("missing")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(NormalizeOrigin(d.Sub("o/empty")).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ember::meta
