// Sockets of the mesh's TCP transport: dialing a path, tuning a data
// connection, the addresses connections come from, and a read with a
// deadline (tcp/tcp_connect.cc, tcp/data_server.cc, the control room's checks).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/mesh/routing/addresses.h"

namespace podlink::mesh {

// TCP_NODELAY, and keepalives and TCP_USER_TIMEOUT so that a peer gone
// silent fails the connection within about `io_timeout`.
void TuneDataSocket(int fd, absl::Duration io_timeout);
socklen_t ToSockaddr(const IpPrefix& a, uint16_t port, sockaddr_storage* ss);
// The address a connection came from, as text ("10.0.0.2", "fd00::2"; an
// IPv4 address mapped into IPv6 as the IPv4 one); "" for other families.
std::string SourceAddress(const sockaddr_storage& ss);
// The same for gRPC's peer string ("ipv4:10.0.0.2:5000", "ipv6:[fd00::2]:5000").
std::string SourceOfGrpcPeer(const std::string& peer);
// Connects `path` to `port` within `timeout`; the socket is blocking after.
absl::StatusOr<UniqueFd> Dial(const Path& path, uint16_t port, absl::Duration timeout);
// ReadFull with an absolute deadline over the whole read.
absl::Status ReadFullBefore(int fd, void* buf, size_t len, absl::Time deadline);

}  // namespace podlink::mesh
