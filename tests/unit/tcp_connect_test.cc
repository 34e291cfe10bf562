// The connect both the mesh and the NCCL plugin use (common/tcp_connect.h), on loopback.
#include "common/tcp_connect.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/unique_fd.h"

namespace podlink {
namespace {

// A loopback listener (or, with `listen` false, a bound port nobody listens on).
UniqueFd Bound(sockaddr_in* at, bool listen) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  *at = sockaddr_in{};
  at->sin_family = AF_INET;
  at->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(at), sizeof(*at)), 0);
  socklen_t len = sizeof(*at);
  EXPECT_EQ(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(at), &len), 0);
  if (listen) {
    EXPECT_EQ(::listen(fd.get(), 4), 0);
  }
  return fd;
}

UniqueFd NonBlocking() { return UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)); }

TEST(TcpConnect, AConnectToAListenerEndsConnected) {
  sockaddr_in at;
  UniqueFd listener = Bound(&at, true);
  UniqueFd fd = NonBlocking();
  ASSERT_TRUE(BeginConnect(fd.get(), reinterpret_cast<sockaddr*>(&at), sizeof(at), "loopback").ok());
  absl::StatusOr<bool> done = ConnectDone(fd.get(), absl::Seconds(5));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
}

TEST(TcpConnect, APortNobodyListensOnIsRefusedAsUnavailable) {
  sockaddr_in at;
  UniqueFd closed = Bound(&at, false);  // held, so no other test takes the port meanwhile
  UniqueFd fd = NonBlocking();
  absl::Status begun = BeginConnect(fd.get(), reinterpret_cast<sockaddr*>(&at), sizeof(at), "loopback");
  absl::Status st = begun;
  if (begun.ok()) {
    absl::StatusOr<bool> done = ConnectDone(fd.get(), absl::Seconds(5));
    ASSERT_FALSE(done.ok() && *done) << "connected to a port nobody listens on";
    st = done.ok() ? absl::DeadlineExceededError("no answer") : done.status();
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("refused"), std::string::npos) << st;
}

}  // namespace
}  // namespace podlink
