// The writer of answers on a data connection (daemon/mesh/tcp/conn_writer.h), over a socket pair: answers
// posted from other threads are written by the serving thread in order; an upstream that takes none is cut at
// the bound; nothing is written once the connection is let go, and every answer's `after` runs exactly once.
#include "daemon/mesh/tcp/conn_writer.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

namespace podlink::mesh {
namespace {

class ConnWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    serving_ = UniqueFd(sv[0]);
    upstream_ = UniqueFd(sv[1]);
    timeval t{.tv_sec = 10, .tv_usec = 0};  // no test waits longer for a frame
    ::setsockopt(upstream_.get(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  }
  // The next frame the upstream reads (its payload in *payload).
  FrameHeader Next(std::string* payload = nullptr) {
    FrameHeader h{};
    EXPECT_TRUE(ReadFull(upstream_.get(), &h, sizeof(h)).ok());
    std::string p(h.length, '\0');
    if (h.length > 0) EXPECT_TRUE(ReadFull(upstream_.get(), p.data(), p.size()).ok());
    if (payload != nullptr) *payload = std::move(p);
    return h;
  }
  static bool Readable(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, ms) == 1;
  }
  UniqueFd serving_, upstream_;
};

TEST_F(ConnWriterTest, AnAckCarriesTheCodeAndAMessageOfAtMost4KiB) {
  ConnWriter w(serving_.get());
  ASSERT_TRUE(w.Ack(7, absl::OkStatus()).ok());
  ASSERT_TRUE(w.Ack(8, absl::OutOfRangeError(std::string(10000, 'x'))).ok());
  std::string text;
  FrameHeader ok = Next(&text);
  EXPECT_EQ(ok.magic, kFrameMagic);
  EXPECT_EQ(ok.type, static_cast<uint16_t>(FrameType::kAck));
  EXPECT_EQ(ok.tag, 7u);
  EXPECT_EQ(ok.status, 0);
  EXPECT_EQ(text, "");
  FrameHeader refused = Next(&text);
  EXPECT_EQ(refused.tag, 8u);
  EXPECT_EQ(refused.status, static_cast<int32_t>(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(text, std::string(4096, 'x'));
}

TEST_F(ConnWriterTest, AnswersPostedFromOtherThreadsWakeTheServingThreadAndGoOutInOrder) {
  ConnWriter w(serving_.get());
  EXPECT_TRUE(w.Flush().ok()) << "nothing queued: nothing to do";
  EXPECT_FALSE(Readable(w.wake_fd(), 0));
  std::atomic<int> after{0};
  std::thread link([&] {
    std::shared_ptr<char[]> bytes(new char[5]);
    std::memcpy(bytes.get(), "hello", 5);
    w.Post(1, bytes, 5, absl::OkStatus(), [&] { ++after; });
    w.Post(2, nullptr, 0, absl::DataLossError("torn"), [&] { ++after; });
  });
  link.join();
  ASSERT_TRUE(Readable(w.wake_fd(), 10000)) << "posting wakes the serving thread";
  w.Drain();
  EXPECT_FALSE(Readable(w.wake_fd(), 0)) << "Drain takes the wake-ups";
  EXPECT_EQ(after.load(), 0) << "`after` runs once an answer is written, not before";
  ASSERT_TRUE(w.Flush().ok());
  EXPECT_EQ(after.load(), 2);
  std::string payload;
  FrameHeader data = Next(&payload);
  EXPECT_EQ(data.type, static_cast<uint16_t>(FrameType::kData));
  EXPECT_EQ(data.tag, 1u);
  EXPECT_EQ(payload, "hello");
  FrameHeader ack = Next();
  EXPECT_EQ(ack.type, static_cast<uint16_t>(FrameType::kAck));
  EXPECT_EQ(ack.tag, 2u);
  EXPECT_EQ(ack.status, static_cast<int32_t>(absl::StatusCode::kDataLoss));
}

TEST_F(ConnWriterTest, AnUpstreamThatTakesNoAnswersIsCutAtTheBound) {
  ConnWriter w(serving_.get());
  std::atomic<size_t> after{0};
  for (size_t i = 0; i < ConnWriter::kMaxQueued; ++i) w.Post(i, nullptr, 0, absl::OkStatus(), [&] { ++after; });
  EXPECT_EQ(after.load(), 0u);
  w.Post(ConnWriter::kMaxQueued, nullptr, 0, absl::OkStatus(), [&] { ++after; });
  EXPECT_EQ(after.load(), 1u) << "the answer over the bound is dropped at once";
  // Cut: the serving thread's next read fails, and the upstream sees the end.
  char c;
  EXPECT_EQ(::recv(serving_.get(), &c, 1, MSG_DONTWAIT), 0) << "the serving side was shut down";
  w.Close();
  EXPECT_EQ(after.load(), ConnWriter::kMaxQueued + 1) << "Close drops what is queued, each `after` once";
  EXPECT_EQ(::recv(upstream_.get(), &c, 1, 0), 0) << "the upstream got nothing but the end";
}

TEST_F(ConnWriterTest, NothingIsWrittenOnceTheConnectionIsLetGo) {
  auto w = std::make_unique<ConnWriter>(serving_.get());
  std::atomic<int> after{0};
  w->Post(1, nullptr, 0, absl::OkStatus(), [&] { ++after; });
  w->Close();
  EXPECT_EQ(after.load(), 1);
  EXPECT_EQ(w->Ack(2, absl::OkStatus()).code(), absl::StatusCode::kUnavailable);
  FrameHeader h{};
  EXPECT_EQ(w->Frame(h, nullptr, 0).code(), absl::StatusCode::kUnavailable);
  w->Post(3, nullptr, 0, absl::OkStatus(), [&] { ++after; });  // a completion after the serving thread left
  EXPECT_EQ(after.load(), 2) << "its `after` runs at once";
  EXPECT_TRUE(w->Flush().ok());
  w.reset();  // the destructor closes again: nothing runs twice
  EXPECT_EQ(after.load(), 2);
  serving_.Reset();
  char c;
  EXPECT_EQ(::recv(upstream_.get(), &c, 1, 0), 0) << "no frame was written";
}

}  // namespace
}  // namespace podlink::mesh
