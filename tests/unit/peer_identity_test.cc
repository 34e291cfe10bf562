#include "daemon/identity/peer_identity.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace podlink {
namespace {

TEST(PeerIdentity, IdentifiesConnectedProcessFromKernel) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto id = IdentifyPeer(a.get());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->pid, ::getpid());
  EXPECT_EQ(id->uid, ::getuid());
  EXPECT_GT(id->start_time, 0u);
  EXPECT_TRUE(id->pidfd.valid());
  EXPECT_TRUE(PidfdAlive(id->pidfd.get()));
  EXPECT_FALSE(id->cgroup.path.empty());
}

TEST(PeerIdentity, ExitedPeerIsRefused) {
  // The peer's end is created by a child that exits (and is reaped, freeing
  // its pid) before the daemon side looks it up.
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  int listen_fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "/tmp/podlink-peer-%d.sock", getpid());
  ::unlink(addr.sun_path);
  ASSERT_EQ(::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listen_fd, 1), 0);
  pid_t child = fork();
  if (child == 0) {
    int c = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    _exit(::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  UniqueFd conn(::accept(listen_fd, nullptr, nullptr));
  ::close(listen_fd);
  ::unlink(addr.sun_path);
  ::close(sv[0]);
  ::close(sv[1]);
  ASSERT_TRUE(conn.valid());
  auto id = IdentifyPeer(conn.get());
  EXPECT_FALSE(id.ok()) << "a client that exited must not be identified (pid " << id->pid << ")";
}

}  // namespace
}  // namespace podlink
