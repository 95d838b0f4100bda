#include "common/secret.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

namespace ember {
namespace {

std::string WriteTemp(const std::string& content) {
  char path[] = "/tmp/ember-secret-XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
  close(fd);
  return path;
}

TEST(SecretTest, TokenFileIsTrimmedAndEmptyOrMissingIsAnError) {
  std::string p = WriteTemp("s3cret-token\n\n");
  auto t = ReadTokenFile(p);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "s3cret-token");
  unlink(p.c_str());

  std::string empty = WriteTemp(" \n");
  auto e = ReadTokenFile(empty);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("is empty"), std::string::npos);
  unlink(empty.c_str());

  auto missing = ReadTokenFile("/nonexistent/token");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/token"), std::string::npos);
  EXPECT_EQ(*ReadTokenFile(""), "");
}

TEST(SecretTest, TokenEqualComparesWholeStrings) {
  EXPECT_TRUE(TokenEqual("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(TokenEqual("Bearer abd", "Bearer abc"));
  EXPECT_FALSE(TokenEqual("Bearer ab", "Bearer abc"));
  EXPECT_FALSE(TokenEqual("Bearer abcd", "Bearer abc"));
  EXPECT_FALSE(TokenEqual("", "x"));
  EXPECT_TRUE(TokenEqual("", ""));
}

TEST(SecretTest, LargeFilesAreRefused) {
  std::string p = WriteTemp(std::string((1u << 20) + 10, 'x'));
  auto r = ReadSmallFile(p, "--tls-cert");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  unlink(p.c_str());
}

}  // namespace
}  // namespace ember
