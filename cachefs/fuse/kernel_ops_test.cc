// ReplyScratch (kernel_ops.h): one buffer per FUSE thread, grown only when a request needs more.
#include "cachefs/fuse/kernel_ops.h"

#include <gtest/gtest.h>

#include <cstring>

namespace ember::cachefs {
namespace {

TEST(ReplyScratchTest, OneBufferServesEveryReadUpToTheLargest) {
  ReplyScratch s;
  char* first = s.Get(100);
  ASSERT_NE(first, nullptr);
  std::memset(first, 'a', kMaxRead);  // the first growth is to a whole READ
  EXPECT_EQ(s.Get(kMaxRead), first) << "a READ of kMaxRead must not allocate again";
  EXPECT_EQ(s.Get(1), first);
}

TEST(ReplyScratchTest, GrowsForALargerRequestAndKeepsThatSize) {
  ReplyScratch s;
  (void)s.Get(10);
  char* big = s.Get(kMaxRead + 4096);
  ASSERT_NE(big, nullptr);
  std::memset(big, 'b', kMaxRead + 4096);  // every byte asked for is usable (ASan checks)
  EXPECT_EQ(s.Get(kMaxRead + 4096), big);
  EXPECT_EQ(s.Get(kMaxRead), big);
}

}  // namespace
}  // namespace ember::cachefs
