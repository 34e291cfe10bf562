// Non-blocking TCP helpers of the NCCL net plugin: which address to listen
// on, which local address to connect from, and partial sends/receives.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/tcp_connect.h"
#include "common/unique_fd.h"

namespace podlink::ncclnet {

struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string ToString() const;
};

// The first interface that is up, has an IPv4 address and matches
// $PODLINK_NCCL_SOCKET_IFNAME or else $NCCL_SOCKET_IFNAME (NCCL's syntax:
// comma-separated prefixes, "^" to exclude, "=" for exact names); without
// either, the first non-loopback interface, else loopback. Port 0.
absl::StatusOr<SockAddr> ChooseListenAddress(std::string* ifname);

// The link speed of interface `ifname` in Mb/s, as NCCL's NET/Socket reads
// it (<sysfs_net>/<ifname>/speed); 10000 where the kernel reports none
// (veth, some virtual NICs), as NET/Socket assumes then.
int InterfaceSpeedMbps(const std::string& ifname, const std::string& sysfs_net = "/sys/class/net");

// A bound, listening, non-blocking socket; `addr` gets the chosen port.
absl::StatusOr<UniqueFd> ListenOn(SockAddr& addr);

// Starts a non-blocking connect. When a local interface shares the target's
// subnet the socket is bound to that interface's address first, so several
// NICs are used the way the routes intend.
// Polled with ConnectDone (common/tcp_connect.h): true once connected, false
// while in progress, an error when it failed.
absl::StatusOr<UniqueFd> StartConnect(const SockAddr& to);

// Move what the socket takes now: the byte count (0 when it would block), or
// an error (UNAVAILABLE when the peer closed the connection).
absl::StatusOr<size_t> SendSome(int fd, const void* p, size_t n);
absl::StatusOr<size_t> RecvSome(int fd, void* p, size_t n);

// true when the peer closed (or reset) the connection. Reads nothing.
bool PeerClosed(int fd);

}  // namespace podlink::ncclnet
