// SendFromFile: a block file's bytes to a socket, through the page cache only when they are there.
// BufferedReader: answers and small bodies through its buffer, large bodies straight to theirs.
#include "transport/socket_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <string>
#include <thread>
#include <vector>

#include "common/file_io.h"
#include "tests/testing/testing.h"

namespace ember::transport {
namespace {

class SendFromFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_.resize((5 << 20) + 1000);  // over two bounce chunks, and a tail shorter than a page
    for (size_t i = 0; i < data_.size(); i++) data_[i] = static_cast<char>(i * 131 + i / 4093);
    path_ = dir_.Sub("blocks");
    testing::WriteFile(path_, data_);
    fd_ = open(path_.c_str(), O_RDONLY);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, socks_), 0);
  }
  void TearDown() override {
    close(fd_);
    close(socks_[0]);
    close(socks_[1]);
  }
  // Takes the file out of the page cache. Returns: false if this kernel cannot tell (no
  // cachestat) or the page cache kept it.
  bool Evict() {
    fdatasync(fd_);
    posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    std::optional<bool> cached = PagesCached(fd_, 0, 4096);
    return cached.has_value() && !*cached;
  }
  // Sends [offset, offset + n) and returns: what arrived on the other end, and the status.
  std::string Send(uint64_t offset, size_t n, absl::Status* st) {
    std::string got;
    std::thread reader([&] {
      char buf[1 << 16];
      ssize_t r;
      while ((r = read(socks_[1], buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(r));
    });
    *st = SendFromFile(socks_[0], fd_, offset, n);
    shutdown(socks_[0], SHUT_WR);
    reader.join();
    return got;
  }

  testing::TempDir dir_;
  std::string data_, path_;
  int fd_ = -1;
  int socks_[2] = {-1, -1};
};

TEST_F(SendFromFileTest, AColdRangeIsSentWithoutFillingThePageCache) {
  if (!Evict()) GTEST_SKIP() << "no cachestat(2) here, or the page cache kept the file";
  const int direct = open(path_.c_str(), O_RDONLY | O_DIRECT);
  if (direct < 0) GTEST_SKIP() << "the test directory's file system has no O_DIRECT";
  close(direct);
  absl::Status st;
  const std::string got = Send(1 << 20, data_.size() - (1 << 20), &st);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(got == data_.substr(1 << 20)) << got.size();
  // sendfile would have read it into the page cache; the O_DIRECT reads leave none of it there.
  for (uint64_t at = 1 << 20; at < data_.size(); at += 1 << 20) {
    EXPECT_EQ(PagesCached(fd_, at, 4096), std::optional<bool>(false)) << at;
  }
}

TEST_F(SendFromFileTest, ACachedRangeIsSentTheSame) {
  std::string warm(data_.size(), '\0');
  ASSERT_EQ(pread(fd_, warm.data(), warm.size(), 0), static_cast<ssize_t>(warm.size()));
  if (PagesCached(fd_, 0, data_.size()) != std::optional<bool>(true)) {
    GTEST_SKIP() << "no cachestat(2) here";
  }
  absl::Status st;
  EXPECT_TRUE(Send(4096, 3 << 20, &st) == data_.substr(4096, 3 << 20));
  EXPECT_TRUE(st.ok()) << st;
}

TEST_F(SendFromFileTest, AnUnalignedOffsetIsSentBySendfile) {
  Evict();
  absl::Status st;
  EXPECT_TRUE(Send(12345, 2 << 20, &st) == data_.substr(12345, 2 << 20));
  EXPECT_TRUE(st.ok()) << st;
}

TEST_F(SendFromFileTest, ARangePastTheFilesEndFailsInsteadOfSendingOtherBytes) {
  for (bool cold : {true, false}) {
    if (cold) Evict();
    absl::Status st;
    const std::string got = Send(4 << 20, 2 << 20, &st);
    EXPECT_TRUE(absl::IsDataLoss(st)) << cold << " " << st;
    EXPECT_LT(got.size(), 2u << 20);
    EXPECT_TRUE(got == data_.substr(4 << 20, got.size()));
    close(socks_[0]);
    close(socks_[1]);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, socks_), 0);
  }
}

TEST_F(SendFromFileTest, AReaderGoneMidwayFailsTheSendAndTheNextSendIsWhole) {
  if (!Evict()) GTEST_SKIP() << "no cachestat(2) here, or the page cache kept the file";
  // The other end reads 1 MiB and hangs up while chunks are still being read and sent.
  std::thread reader([&] {
    std::string got(1 << 20, '\0');
    size_t have = 0;
    ssize_t r;
    while (have < got.size() && (r = read(socks_[1], got.data() + have, got.size() - have)) > 0) {
      have += static_cast<size_t>(r);
    }
    EXPECT_TRUE(got == data_.substr(0, 1 << 20));
    close(socks_[1]);
    socks_[1] = -1;
  });
  const absl::Status st = SendFromFile(socks_[0], fd_, 0, data_.size());
  reader.join();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  close(socks_[0]);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, socks_), 0);
  Evict();
  absl::Status again;
  EXPECT_TRUE(Send(4 << 20, data_.size() - (4 << 20), &again) == data_.substr(4 << 20));
  EXPECT_TRUE(again.ok()) << again;
}

TEST_F(SendFromFileTest, ManySendsAtOnceEachGetTheirOwnBytes) {
  // More sends under way than buffers kept between sends: each must have a buffer of its own.
  if (!Evict()) GTEST_SKIP() << "no cachestat(2) here, or the page cache kept the file";
  constexpr int kSends = 12;
  std::vector<std::array<int, 2>> pairs(kSends);
  std::vector<std::string> got(kSends);
  std::vector<absl::Status> st(kSends);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSends; ++i) {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pairs[i].data()), 0);
    threads.emplace_back([&, i] {  // each its own 4 KiB-aligned range, sent while others are
      const uint64_t at = static_cast<uint64_t>(i % 4) << 20;
      st[i] = SendFromFile(pairs[i][0], fd_, at, 1 << 20);
      shutdown(pairs[i][0], SHUT_WR);
    });
    threads.emplace_back([&, i] {
      char buf[1 << 16];
      ssize_t r;
      while ((r = read(pairs[i][1], buf, sizeof(buf))) > 0)
        got[i].append(buf, static_cast<size_t>(r));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSends; ++i) {
    EXPECT_TRUE(st[i].ok()) << i << " " << st[i];
    EXPECT_TRUE(got[i] == data_.substr(static_cast<size_t>(i % 4) << 20, 1 << 20)) << i;
    close(pairs[i][0]);
    close(pairs[i][1]);
  }
}

// Three answers as a peer sends them: a header and a large body, a header and a small body, a
// last header. Read in the pieces FetchMany reads them in.
TEST(BufferedReaderTest, ALargeBodyAnnouncedAfterAHeaderSkipsTheBuffer) {
  int socks[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, socks), 0);
  std::string large(100000, '\0'), small(1000, '\0');
  for (size_t i = 0; i < large.size(); i++) large[i] = static_cast<char>(i * 7 + i / 251);
  for (size_t i = 0; i < small.size(); i++) small[i] = static_cast<char>(i * 13);
  const std::string h1(16, 'a'), h2(16, 'b'), h3(16, 'c');
  const std::string sent = h1 + large + h2 + small + h3;
  // All of it queued before the first read: what each read takes depends on the reader alone.
  const int room = 1 << 20;
  ASSERT_EQ(setsockopt(socks[0], SOL_SOCKET, SO_SNDBUF, &room, sizeof(room)), 0);
  ASSERT_TRUE(WriteFull(socks[0], sent.data(), sent.size()).ok());
  BufferedReader in(socks[1]);
  std::string h(16, '\0'), body;
  ASSERT_TRUE(in.Read(h.data(), h.size(), nullptr, large.size()).ok());
  EXPECT_EQ(h, h1);
  EXPECT_EQ(in.buffered(), 0u);  // none of the large body was taken into the buffer
  body.assign(large.size(), '\0');
  ASSERT_TRUE(in.Read(body.data(), body.size()).ok());
  EXPECT_TRUE(body == large);
  ASSERT_TRUE(in.Read(h.data(), h.size(), nullptr, small.size()).ok());
  EXPECT_EQ(h, h2);
  EXPECT_GT(in.buffered(), 0u);  // a small body comes with its header, in one read
  body.assign(small.size(), '\0');
  ASSERT_TRUE(in.Read(body.data(), body.size()).ok());
  EXPECT_TRUE(body == small);
  ASSERT_TRUE(in.Read(h.data(), h.size()).ok());
  EXPECT_EQ(h, h3);
  EXPECT_EQ(in.buffered(), 0u);
  close(socks[0]);
  close(socks[1]);
}

}  // namespace
}  // namespace ember::transport
