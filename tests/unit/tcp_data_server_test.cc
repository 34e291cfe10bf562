// The TCP transport's data server (daemon/mesh/tcp/data_server.h) over loopback, with its gate and late-copy
// guard and an owner that records what it is handed: no engine, grants or gRPC. What reaches the owner (only
// frames of an authenticated connection whose header holds), what is refused and counted, DONE and late
// copies, the idle timeout, and stopping.
#include "daemon/mesh/tcp/data_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace podlink::mesh {
namespace {

constexpr uint64_t kInstance = 77;

class TcpDataServerTest : public ::testing::Test {
 protected:
  void Make(absl::Duration idle = absl::Minutes(1)) {
    TcpDataServer::Owner owner{
        .serve = [this](const std::shared_ptr<ConnWriter>& writer, int fd, const FrameHeader& h,
                        const std::string& node, uint64_t link_instance) -> absl::Status {
          std::string payload(h.type == static_cast<uint16_t>(FrameType::kWrite) ? h.length : 0, '\0');
          if (!payload.empty()) {
            if (absl::Status io = ReadFull(fd, payload.data(), payload.size()); !io.ok()) return io;
          }
          const LateCopies::Key key{node, link_instance, TransferOfTag(h.tag)};
          if (h.type == static_cast<uint16_t>(FrameType::kWrite)) late_.EndWrite(key);
          if (h.type == static_cast<uint16_t>(FrameType::kNotify)) late_.Finish(key);  // delivered once
          {
            absl::MutexLock l(&mu_);
            served_.push_back(Served{node, link_instance, h.type, h.tag, payload});
          }
          return writer->Ack(h.tag, absl::OkStatus());
        },
        .ended = [this](const std::string& node) {
          absl::MutexLock l(&mu_);
          ended_.push_back(node);
        }};
    server_ = std::make_unique<TcpDataServer>(
        TcpDataServer::Options{.io_timeout = absl::Seconds(2), .idle_timeout = idle}, gate_, late_, owner);
    ASSERT_TRUE(server_->Listen(0).ok());
    ASSERT_NE(server_->port(), 0u);
    server_->Start();
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Stop();
    gate_.ShutdownAndWait();
  }

  UniqueFd Dial() {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(server_->port()));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return UniqueFd();
    timeval t{.tv_sec = 10, .tv_usec = 0};  // no read in these tests waits longer
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
    return fd;
  }
  // A connection authenticated for node-a with a cookie from the gate.
  UniqueFd Authenticated() {
    absl::StatusOr<std::vector<std::string>> cookies = gate_.IssueCookies("node-a", 1, "127.0.0.1", {});
    EXPECT_TRUE(cookies.ok());
    UniqueFd fd = Dial();
    FrameHeader auth{.magic = kFrameMagic, .type = static_cast<uint16_t>(FrameType::kAuth), .flags = 0,
                     .length = static_cast<uint32_t>(kCookieBytes), .status = 0, .tag = 0, .grant = kInstance,
                     .offset = 0};
    EXPECT_TRUE(WriteFrame(fd.get(), auth, (*cookies)[0].data(), kCookieBytes).ok());
    return fd;
  }
  static FrameHeader Frame(FrameType type, uint64_t tag, uint32_t length = 0) {
    return FrameHeader{.magic = kFrameMagic, .type = static_cast<uint16_t>(type), .flags = 0, .length = length,
                       .status = 0, .tag = tag, .grant = 5, .offset = 0};
  }
  // The next answer's header, or false at the connection's end.
  static bool Answer(int fd, FrameHeader* h) {
    if (!ReadFull(fd, h, sizeof(*h)).ok()) return false;
    std::string rest(h->length, '\0');
    return h->length == 0 || ReadFull(fd, rest.data(), rest.size()).ok();
  }
  // The server closed the connection without a byte (EOF, or a reset where it left our bytes unread), within
  // the 10 s receive timeout.
  static bool Ends(int fd) {
    char c;
    ssize_t r = ::recv(fd, &c, 1, 0);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
  size_t served() {
    absl::MutexLock l(&mu_);
    return served_.size();
  }
  bool WaitEnded(size_t n) {
    absl::MutexLock l(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }

  struct Served {
    std::string node;
    uint64_t instance;
    uint16_t type;
    uint64_t tag;
    std::string payload;
  };
  DataAdmission gate_{DataAdmission::Limits{}};
  LateCopies late_;
  std::unique_ptr<TcpDataServer> server_;
  absl::Mutex mu_;
  std::vector<Served> served_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> ended_ ABSL_GUARDED_BY(mu_);
};

TEST_F(TcpDataServerTest, TheOwnerGetsTheFramesOfAnAuthenticatedConnectionAsItsNode) {
  Make();
  UniqueFd c = Authenticated();
  ASSERT_TRUE(WriteFrame(c.get(), Frame(FrameType::kWrite, 1, 5), "hello", 5).ok());
  ASSERT_TRUE(WriteFrame(c.get(), Frame(FrameType::kRead, 2, 64), nullptr, 0).ok());
  FrameHeader a{};
  ASSERT_TRUE(Answer(c.get(), &a));
  EXPECT_EQ(a.tag, 1u);
  ASSERT_TRUE(Answer(c.get(), &a));
  EXPECT_EQ(a.tag, 2u);
  c.Reset();
  ASSERT_TRUE(WaitEnded(1)) << "the owner hears the connection ended";
  absl::MutexLock l(&mu_);
  ASSERT_EQ(served_.size(), 2u);
  EXPECT_EQ(served_[0].node, "node-a");
  EXPECT_EQ(served_[0].instance, kInstance) << "the link instance its AUTH said";
  EXPECT_EQ(served_[0].payload, "hello");
  EXPECT_EQ(served_[1].type, static_cast<uint16_t>(FrameType::kRead));
  EXPECT_EQ(ended_, std::vector<std::string>{"node-a"});
}

TEST_F(TcpDataServerTest, AConnectionWithoutAValidCookieGetsNothing) {
  Make();
  UniqueFd c = Dial();
  std::string wrong(kCookieBytes, 'x');
  FrameHeader auth = Frame(FrameType::kAuth, 0, kCookieBytes);
  ASSERT_TRUE(WriteFrame(c.get(), auth, wrong.data(), wrong.size()).ok());
  (void)WriteFrame(c.get(), Frame(FrameType::kWrite, 1, 5), "hello", 5);
  EXPECT_TRUE(Ends(c.get()));
  EXPECT_EQ(served(), 0u);
  EXPECT_GE(gate_.counts().refused, 1u);
  UniqueFd silent = Dial();  // no AUTH at all: closed after 2 s
  EXPECT_TRUE(Ends(silent.get()));
  EXPECT_EQ(served(), 0u);
}

TEST_F(TcpDataServerTest, AMalformedFrameEndsTheConnectionCountedAndNeverReachesTheOwner) {
  Make();
  struct Case {
    const char* what;
    FrameHeader h;
  };
  FrameHeader bad_magic = Frame(FrameType::kWrite, 1, 4);
  bad_magic.magic = 0x12345678;
  FrameHeader flags = Frame(FrameType::kRead, 1, 4);
  flags.flags = 1;
  FrameHeader over_cap = Frame(FrameType::kRead, 1);
  over_cap.length = kMaxFramePayload + 1;
  FrameHeader notify_payload = Frame(FrameType::kNotify, 1, 8);
  FrameHeader unknown = Frame(FrameType::kRead, 1);
  unknown.type = 99;
  FrameHeader data_from_importer = Frame(FrameType::kData, 1);
  const Case cases[] = {{"bad magic", bad_magic},
                        {"flags", flags},
                        {"over the cap", over_cap},
                        {"notify with payload", notify_payload},
                        {"unknown type", unknown},
                        {"an answer's type", data_from_importer}};
  uint64_t refused = 0;
  for (const Case& k : cases) {
    UniqueFd c = Authenticated();
    ASSERT_TRUE(WriteFull(c.get(), &k.h, sizeof(k.h)).ok());
    EXPECT_TRUE(Ends(c.get())) << k.what;
    EXPECT_EQ(server_->counts().refused_frames, ++refused) << k.what;
  }
  EXPECT_EQ(served(), 0u);
}

TEST_F(TcpDataServerTest, AfterDoneALateCopyIsDroppedAndANotifyIsDeliveredOnce) {
  Make();
  UniqueFd c = Authenticated();
  const uint64_t transfer = uint64_t{3} << 32;
  FrameHeader a{};
  ASSERT_TRUE(WriteFrame(c.get(), Frame(FrameType::kWrite, transfer | 1, 3), "abc", 3).ok());
  ASSERT_TRUE(Answer(c.get(), &a));
  ASSERT_TRUE(WriteFrame(c.get(), Frame(FrameType::kDone, transfer | 2), nullptr, 0).ok());
  ASSERT_TRUE(Answer(c.get(), &a));
  EXPECT_EQ(a.tag, transfer | 2);
  EXPECT_EQ(a.status, 0);
  // The first copy of slice 1 arrives late, on this connection, after DONE: acknowledged, not served.
  ASSERT_TRUE(WriteFrame(c.get(), Frame(FrameType::kWrite, transfer | 1, 3), "abc", 3).ok());
  ASSERT_TRUE(Answer(c.get(), &a));
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(server_->counts().late_slices_dropped, 1u);
  // Another transfer's notification, twice.
  const uint64_t other = uint64_t{4} << 32;
  ASSERT_TRUE(WriteFrame(c.get(), Frame(FrameType::kNotify, other | 1), nullptr, 0).ok());
  ASSERT_TRUE(Answer(c.get(), &a));
  ASSERT_TRUE(WriteFrame(c.get(), Frame(FrameType::kNotify, other | 1), nullptr, 0).ok());
  ASSERT_TRUE(Answer(c.get(), &a));
  EXPECT_EQ(server_->counts().duplicate_notifies, 1u);
  EXPECT_EQ(served(), 2u) << "the first write and the first notify";
}

TEST_F(TcpDataServerTest, AnIdleConnectionIsClosedAndCounted) {
  Make(absl::Milliseconds(200));
  UniqueFd c = Authenticated();
  EXPECT_TRUE(Ends(c.get()));
  EXPECT_EQ(server_->counts().idle_closed, 1u);
  EXPECT_TRUE(WaitEnded(1));
}

TEST_F(TcpDataServerTest, AfterStopNothingIsAccepted) {
  Make();
  server_->Stop();
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(server_->port()));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0) << "the port is closed";
  server_->Stop();  // again: nothing happens
}

}  // namespace
}  // namespace podlink::mesh
