#include "common/fd_channel.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace podlink {
namespace {

struct Pair {
  UniqueFd a, b;
  Pair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    a.Reset(sv[0]);
    b.Reset(sv[1]);
  }
};

int OpenFdCount() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += ::fcntl(fd, F_GETFD) != -1;
  return n;
}

TEST(FdChannel, RoundTripWithDescriptor) {
  Pair p;
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  UniqueFd r(pipefd[0]), w(pipefd[1]);
  FdMessage m;
  m.type = static_cast<uint16_t>(FdMsgType::kOffer);
  m.seq = 77;
  ASSERT_TRUE(SendFdMessage(p.a.get(), m, w.get(), false).ok());
  auto got = RecvFdMessage(p.b.get(), false);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->msg.seq, 77u);
  ASSERT_TRUE((*got)->fd.valid());
  ASSERT_EQ(::write((*got)->fd.get(), "x", 1), 1);  // the received fd is the pipe's write end
  char c;
  ASSERT_EQ(::read(r.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
}

TEST(FdChannel, NothingQueuedAndEof) {
  Pair p;
  auto none = RecvFdMessage(p.b.get(), true);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  p.a.Reset();
  EXPECT_EQ(RecvFdMessage(p.b.get(), true).status().code(), absl::StatusCode::kNotFound);
}

TEST(FdChannel, MalformedMessagesRejectedAndDescriptorsClosed) {
  Pair p;
  int before = OpenFdCount();
  // Wrong size.
  ASSERT_EQ(::send(p.a.get(), "hello", 5, 0), 5);
  EXPECT_EQ(RecvFdMessage(p.b.get(), false).status().code(), absl::StatusCode::kInvalidArgument);
  // Oversized datagram.
  char big[100] = {};
  ASSERT_EQ(::send(p.a.get(), big, sizeof(big), 0), 100);
  EXPECT_EQ(RecvFdMessage(p.b.get(), false).status().code(), absl::StatusCode::kInvalidArgument);
  // Bad magic.
  FdMessage bad;
  bad.magic = 0xdeadbeef;
  ASSERT_TRUE(SendFdMessage(p.a.get(), bad, -1, false).ok());
  EXPECT_EQ(RecvFdMessage(p.b.get(), false).status().code(), absl::StatusCode::kInvalidArgument);
  // Three descriptors attached to one message: all three must be closed.
  int fds[3] = {::dup(0), ::dup(0), ::dup(0)};
  FdMessage m;
  iovec iov{&m, sizeof(m)};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(fds))];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctrl;
  mh.msg_controllen = sizeof(ctrl);
  cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(fds));
  memcpy(CMSG_DATA(c), fds, sizeof(fds));
  ASSERT_EQ(::sendmsg(p.a.get(), &mh, 0), static_cast<ssize_t>(sizeof(m)));
  for (int fd : fds) ::close(fd);
  auto r = RecvFdMessage(p.b.get(), false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("3 descriptors"), absl::string_view::npos) << r.status();
  EXPECT_EQ(OpenFdCount(), before);
}

}  // namespace
}  // namespace podlink
