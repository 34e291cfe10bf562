// Sockets of the mesh's TCP transport (sockets.h).
#include "daemon/mesh/tcp/sockets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/tcp_connect.h"
#include "common/status_util.h"

namespace podlink::mesh {

void TuneDataSocket(int fd, absl::Duration io_timeout) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  unsigned timeout_ms = static_cast<unsigned>(absl::ToInt64Milliseconds(io_timeout));
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof(timeout_ms));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = std::max(1, static_cast<int>(absl::ToInt64Seconds(io_timeout)) / 2), intvl = 1, cnt = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

namespace {
std::string Unmapped(std::string a) {
  constexpr absl::string_view kMapped = "::ffff:";
  if (absl::StartsWithIgnoreCase(a, kMapped) && a.find('.') != std::string::npos) a.erase(0, kMapped.size());
  return a;
}
}  // namespace

std::string SourceAddress(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
  }
  return Unmapped(buf);
}

std::string SourceOfGrpcPeer(const std::string& peer) {
  absl::string_view p = peer;
  if (absl::ConsumePrefix(&p, "ipv4:")) return std::string(p.substr(0, p.rfind(':')));
  if (absl::ConsumePrefix(&p, "ipv6:")) {
    // [addr]:port, the address percent-encoded where it has a zone.
    size_t end = p.find(']');
    if (p.empty() || p[0] != '[' || end == absl::string_view::npos) return "";
    return Unmapped(std::string(p.substr(1, end - 1)));
  }
  return "";
}

socklen_t ToSockaddr(const IpPrefix& a, uint16_t port, sockaddr_storage* ss) {
  std::memset(ss, 0, sizeof(*ss));
  if (a.family == AF_INET) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(ss);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    std::memcpy(&s4->sin_addr, a.addr.data(), 4);
    return sizeof(*s4);
  }
  auto* s6 = reinterpret_cast<sockaddr_in6*>(ss);
  s6->sin6_family = AF_INET6;
  s6->sin6_port = htons(port);
  std::memcpy(&s6->sin6_addr, a.addr.data(), 16);
  return sizeof(*s6);
}

// Connects `path` to `port` within `timeout`; the socket is blocking after.
absl::StatusOr<UniqueFd> Dial(const Path& path, uint16_t port, absl::Duration timeout) {
  UniqueFd fd(::socket(path.remote.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "socket");
  if (!path.fallback) {
    sockaddr_storage local;
    socklen_t len = ToSockaddr(path.local, 0, &local);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), len) != 0) {
      return ErrnoStatus(errno, absl::StrCat("bind ", path.local.AddressText()));
    }
  }
  sockaddr_storage remote;
  socklen_t len = ToSockaddr(path.remote, port, &remote);
  const std::string to = HostPort(path.remote, port);
  PODLINK_RETURN_IF_ERROR(BeginConnect(fd.get(), reinterpret_cast<sockaddr*>(&remote), len, to));
  absl::StatusOr<bool> done = ConnectDone(fd.get(), timeout);
  if (!done.ok()) return absl::UnavailableError(absl::StrCat("connect to ", to, ": ", done.status().message()));
  if (!*done) {
    return absl::UnavailableError(absl::StrCat("connect to ", to, ": no answer within ", absl::FormatDuration(timeout)));
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

absl::Status ReadFullBefore(int fd, void* buf, size_t len, absl::Time deadline) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("deadline");
    pollfd pf{fd, POLLIN, 0};
    int r = ::poll(&pf, 1, static_cast<int>(ms));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::DeadlineExceededError("deadline");
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return absl::UnavailableError("closed");
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace podlink::mesh
