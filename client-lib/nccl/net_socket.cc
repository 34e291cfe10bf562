#include "client-lib/nccl/net_socket.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <fstream>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_util.h"
#include "common/tcp_connect.h"

namespace podlink::ncclnet {
namespace {

struct IfFilter {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;

  bool Matches(const std::string& name) const {
    if (names.empty()) return true;
    bool hit = false;
    for (const std::string& n : names) {
      if (exact ? name == n : name.rfind(n, 0) == 0) hit = true;
    }
    return exclude ? !hit : hit;
  }
};

IfFilter ParseFilter(const char* spec) {
  IfFilter f;
  if (spec == nullptr) return f;
  std::string s = spec;
  if (!s.empty() && s[0] == '^') {
    f.exclude = true;
    s.erase(0, 1);
  }
  if (!s.empty() && s[0] == '=') {
    f.exact = true;
    s.erase(0, 1);
  }
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) f.names.emplace_back(part);
  return f;
}

void Tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

std::string SockAddr::ToString() const {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<SockAddr> ChooseListenAddress(std::string* ifname) {
  const char* spec = std::getenv("PODLINK_NCCL_SOCKET_IFNAME");
  if (spec == nullptr || *spec == '\0') spec = std::getenv("NCCL_SOCKET_IFNAME");
  bool explicit_filter = spec != nullptr && *spec != '\0';
  IfFilter filter = ParseFilter(explicit_filter ? spec : nullptr);
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return ErrnoStatus(errno, "getifaddrs");
  SockAddr best, loopback;
  std::string best_name, loopback_name;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_UP) == 0) continue;
    std::string name = i->ifa_name;
    if (!filter.Matches(name)) continue;
    SockAddr a;
    std::memcpy(&a.ss, i->ifa_addr, sizeof(sockaddr_in));
    a.len = sizeof(sockaddr_in);
    bool is_lo = (i->ifa_flags & IFF_LOOPBACK) != 0;
    if (is_lo && !explicit_filter) {
      if (loopback.len == 0) loopback = a, loopback_name = name;
      continue;
    }
    if (best.len == 0) best = a, best_name = name;
  }
  ::freeifaddrs(list);
  if (best.len == 0 && loopback.len != 0) best = loopback, best_name = loopback_name;
  if (best.len == 0) {
    return absl::NotFoundError(absl::StrCat("no up IPv4 interface matches '", explicit_filter ? spec : "",
                                            "' (set PODLINK_NCCL_SOCKET_IFNAME or NCCL_SOCKET_IFNAME)"));
  }
  if (ifname != nullptr) *ifname = best_name;
  return best;
}

int InterfaceSpeedMbps(const std::string& ifname, const std::string& sysfs_net) {
  constexpr int kUnknown = 10000;
  if (ifname.empty() || ifname.find('/') != std::string::npos || ifname == "." || ifname == "..") return kUnknown;
  std::ifstream f(sysfs_net + "/" + ifname + "/speed");
  long long mbps = 0;
  if (!(f >> mbps) || mbps <= 0 || mbps > INT_MAX) return kUnknown;
  return static_cast<int>(mbps);
}

absl::StatusOr<UniqueFd> ListenOn(SockAddr& addr) {
  UniqueFd fd(::socket(addr.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "socket");
  reinterpret_cast<sockaddr_in*>(&addr.ss)->sin_port = 0;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr.ss), addr.len) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind ", addr.ToString()));
  }
  if (::listen(fd.get(), 128) != 0) return ErrnoStatus(errno, "listen");
  socklen_t len = sizeof(addr.ss);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr.ss), &len) != 0) {
    return ErrnoStatus(errno, "getsockname");
  }
  addr.len = len;
  return fd;
}

absl::StatusOr<UniqueFd> StartConnect(const SockAddr& to) {
  UniqueFd fd(::socket(to.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "socket");
  Tune(fd.get());
  if (to.ss.ss_family == AF_INET) {
    uint32_t target = reinterpret_cast<const sockaddr_in*>(&to.ss)->sin_addr.s_addr;
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) == 0) {
      for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr || i->ifa_addr->sa_family != AF_INET ||
            (i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) {
          continue;
        }
        uint32_t local = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
        uint32_t mask = reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr;
        if (mask != 0 && (local & mask) == (target & mask)) {
          sockaddr_in src{};
          src.sin_family = AF_INET;
          src.sin_addr.s_addr = local;
          (void)::bind(fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof(src));  // best effort
          break;
        }
      }
      ::freeifaddrs(list);
    }
  }
  PODLINK_RETURN_IF_ERROR(BeginConnect(fd.get(), reinterpret_cast<const sockaddr*>(&to.ss), to.len, to.ToString()));
  return fd;
}

absl::StatusOr<size_t> SendSome(int fd, const void* p, size_t n) {
  for (;;) {
    ssize_t r = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno == EPIPE || errno == ECONNRESET) return absl::UnavailableError("the peer closed the connection");
    return ErrnoStatus(errno, "send");
  }
}

absl::StatusOr<size_t> RecvSome(int fd, void* p, size_t n) {
  if (n == 0) return 0;
  for (;;) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) return absl::UnavailableError("the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno == ECONNRESET) return absl::UnavailableError("the peer reset the connection");
    return ErrnoStatus(errno, "recv");
  }
}

bool PeerClosed(int fd) {
  char c;
  ssize_t r = ::recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
  if (r == 0) return true;
  return r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace podlink::ncclnet
