// The supervisor's copy of the open files, fed the agent's updates over a real socketpair as
// the agent sends them: which backing ids a successor must know (to reuse or close them).
#include "cachefs/fuse/supervisor.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ember::cachefs {
namespace {

class SupervisorStateTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds_), 0); }
  void TearDown() override {
    close(fds_[0]);
    close(fds_[1]);
  }
  // Sends one update from the agent's end and applies it on the supervisor's.
  void Update(bool open, uint64_t fh, uint64_t ino, bool passthrough, int32_t backing_id) {
    SendOpenUpdate(fds_[0], open, {fh, ino, passthrough}, backing_id);
    ASSERT_EQ(ReceiveSupervisorMessage(fds_[1], &state_), 1);
  }
  int fds_[2] = {-1, -1};
  KernelFuseState state_;
};

TEST_F(SupervisorStateTest, ABackingIdLastsWhileOpenOrLingering) {
  Update(true, 1, 7, true, 3);
  Update(true, 2, 7, true, 3);
  EXPECT_EQ(state_.backing_ids.at(7), 3);
  Update(false, 1, 7, true, 3);
  EXPECT_EQ(state_.backing_ids.at(7), 3);  // fh 2 still reads through it
  // The last open closes, its backing lingers: the release names it, the supervisor keeps it.
  Update(false, 2, 7, true, 3);
  EXPECT_TRUE(state_.open_files.empty());
  ASSERT_TRUE(state_.backing_ids.contains(7));
  EXPECT_EQ(state_.backing_ids.at(7), 3);
  // The linger ends (a release of no open file): forgotten.
  Update(false, 0, 7, false, 0);
  EXPECT_FALSE(state_.backing_ids.contains(7));
}

TEST_F(SupervisorStateTest, AReleaseWithoutABackingForgetsIt) {
  Update(true, 1, 9, true, 4);
  Update(false, 1, 9, true, 0);  // closed with the last open (an older agent; or no linger)
  EXPECT_FALSE(state_.backing_ids.contains(9));
  Update(true, 2, 10, false, 0);  // daemon-served opens have none
  EXPECT_FALSE(state_.backing_ids.contains(10));
  EXPECT_EQ(state_.open_files.size(), 1u);
  EXPECT_EQ(state_.next_fh, 3u);
}

TEST_F(SupervisorStateTest, MalformedMessagesAreRefused) {
  const std::string bad = R"({"op":"release","ino":3})";  // no fh
  EXPECT_FALSE(ApplySupervisorMessage(bad.data(), bad.size(), -1, &state_));
  const std::string junk = "not json";
  EXPECT_FALSE(ApplySupervisorMessage(junk.data(), junk.size(), -1, &state_));
}

}  // namespace
}  // namespace ember::cachefs
