#include "daemon/identity/peer_identity.h"

#include <sys/socket.h>
#include <sys/stat.h>
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

// A listening socket at a temporary path.
struct Listener {
  Listener() {
    fd.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "/tmp/podlink-peer-l-%d.sock", getpid());
    ::unlink(addr.sun_path);
    ok = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(fd.get(), 4) == 0;
  }
  ~Listener() { ::unlink(addr.sun_path); }
  UniqueFd fd;
  sockaddr_un addr{};
  bool ok = false;
};

TEST(PeerIdentity, PidfdOpenFallbackIdentifiesTheConnectedProcess) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto peer = UnixPeerInode(a.get());
  ASSERT_TRUE(peer.ok()) << peer.status();
  struct stat st {};
  ASSERT_EQ(::fstat(b.get(), &st), 0);
  EXPECT_EQ(*peer, st.st_ino);
  auto id = IdentifyPeer(a.get(), {}, "/proc", PidfdSource::kPidfdOpen);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->pid, ::getpid());
  EXPECT_TRUE(id->pidfd.valid());
}

// Kernels before 6.5 report only the connecting pid. A client that connects,
// hands its socket to a child and lets go of it leaves a pid that does not
// hold the connection; when that pid is later reused it names an unrelated
// process (possibly another pod's), which must not be taken for the client.
TEST(PeerIdentity, PidfdOpenFallbackRefusesAPidThatDoesNotHoldTheSocket) {
  Listener l;
  ASSERT_TRUE(l.ok);
  int ready[2], hold[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(hold), 0);
  pid_t connector = fork();
  if (connector == 0) {
    ::close(ready[0]);
    ::close(hold[1]);
    int c = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (::connect(c, reinterpret_cast<sockaddr*>(&l.addr), sizeof(l.addr)) != 0) _exit(1);
    if (fork() == 0) {  // keeps the socket until the test closes `hold`
      char x;
      (void)!::read(hold[0], &x, 1);
      _exit(0);
    }
    ::close(c);
    (void)!::write(ready[1], "x", 1);
    char x;
    (void)!::read(hold[0], &x, 1);  // stays alive, without the socket
    _exit(0);
  }
  ::close(ready[1]);
  ::close(hold[0]);
  char x;
  ASSERT_EQ(::read(ready[0], &x, 1), 1);
  UniqueFd conn(::accept4(l.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(conn.valid());
  auto id = IdentifyPeer(conn.get(), {}, "/proc", PidfdSource::kPidfdOpen);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kPermissionDenied) << id.status();
  ::close(hold[1]);
  ::close(ready[0]);
  int status = 0;
  EXPECT_EQ(waitpid(connector, &status, 0), connector);
}

}  // namespace
}  // namespace podlink
