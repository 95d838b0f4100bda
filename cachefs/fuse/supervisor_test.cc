// The supervisor's copy of the open files, fed the agent's updates over a real socketpair as
// the agent sends them: which backing ids a successor must know (to reuse or close them). And
// the handover's version skew rule, over a real takeover socket.
#include "cachefs/fuse/supervisor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cachefs/fuse/takeover.h"
#include "tests/testing/testing.h"

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
  EXPECT_FALSE(ApplySupervisorMessage(bad.data(), bad.size(), {}, &state_));
  const std::string junk = "not json";
  EXPECT_FALSE(ApplySupervisorMessage(junk.data(), junk.size(), {}, &state_));
}

TEST(HandoverProtocolTest, NeighbouringReleasesHandOverBothWaysAndOthersRefuse) {
  const HandoverProtocol v1{1, 1}, v2{1, 2}, v3{2, 3}, v4{3, 4};
  EXPECT_TRUE(HandoverCompatible(v2, v1));  // this release takes over from the one before
  EXPECT_TRUE(HandoverCompatible(v1, v2));  // and hands back to it (a rollback)
  EXPECT_TRUE(HandoverCompatible(v3, v2));
  EXPECT_TRUE(HandoverCompatible(v2, v3));
  EXPECT_FALSE(HandoverCompatible(v3, v1));  // two releases apart
  EXPECT_FALSE(HandoverCompatible(v1, v3));
  EXPECT_FALSE(HandoverCompatible(v4, v2));
  EXPECT_TRUE(HandoverCompatible(OwnHandoverProtocol(), OwnHandoverProtocol()));
}

// Connects to `path`, sends `request`, and returns what comes back before the listener closes.
std::string Ask(const std::string& path, const std::string& request) {
  int c = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(c);
    return "connect failed";
  }
  EXPECT_EQ(write(c, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string got;
  char buf[4096];
  timeval tv{5, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  for (ssize_t n; (n = read(c, buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
  close(c);
  return got;
}

TEST(HandoverProtocolTest, AListenerRefusesASuccessorTooFarApartAndKeepsListening) {
  testing::TempDir dir;
  const std::string path = dir.Sub("agent.sock");
  std::atomic<int> asked{0};
  auto listener = TakeoverListener::Start(path, [&](int conn, HandoverProtocol) {
    asked++;
    close(conn);
  });
  ASSERT_TRUE(listener.ok()) << listener.status();
  // Not a takeover request: dropped without an answer.
  EXPECT_EQ(Ask(path, "hello there\n"), "");
  // A release three protocols ahead: refused with the reason, both ranges named.
  std::string refusal = Ask(path, "takeover v9 oldest 8\n");
  ASSERT_GT(refusal.size(), 4u);
  auto j = nlohmann::json::parse(refusal.substr(4), nullptr, false);
  ASSERT_TRUE(j.is_object()) << refusal;
  const std::string why = j.value("refused", "");
  EXPECT_NE(why.find("8-9"), std::string::npos) << why;
  EXPECT_NE(why.find("keeps serving"), std::string::npos) << why;
  EXPECT_EQ(asked, 0);
  // The previous release's request (protocol 1) is still a successor's.
  Ask(path, "takeover v1\n");
  EXPECT_TRUE(testing::WaitFor([&] { return asked == 1; }, std::chrono::seconds(5)));
}

TEST(HandoverProtocolTest, ARefusalReachesTheRequesterAsItsReason) {
  testing::TempDir dir;
  const std::string path = dir.Sub("supervisor.sock");
  // What a running release of protocols 3-4 answers this one (1-2): no fd, a reason.
  int l = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(l, 1), 0);
  std::thread other([&] {
    int c = accept(l, nullptr, nullptr);
    char buf[64];
    (void)!read(c, buf, sizeof(buf));
    std::string text = R"({"refused":"too far apart"})";
    uint32_t len = static_cast<uint32_t>(text.size());
    (void)!write(c, &len, sizeof(len));
    (void)!write(c, text.data(), text.size());
    close(c);
  });
  auto st = RequestTakeover(path, std::chrono::seconds(5));
  other.join();
  close(l);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(st.status())) << st.status();
  EXPECT_EQ(st.status().message(), "too far apart");
  // Nothing listening: NotFound (the caller mounts afresh).
  EXPECT_TRUE(absl::IsNotFound(RequestTakeover(path, std::chrono::seconds(1)).status()));
}

}  // namespace
}  // namespace ember::cachefs
