#include "daemon/mesh/routing/addresses.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace podlink::mesh {
namespace {

int AddressBytes(int family) { return family == AF_INET ? 4 : 16; }

int PrefixOfMask(const sockaddr* mask, int family) {
  const uint8_t* b = family == AF_INET ? reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in*>(mask)->sin_addr)
                                       : reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr.s6_addr;
  int n = 0;
  for (int i = 0; i < AddressBytes(family); ++i) n += __builtin_popcount(b[i]);
  return n;
}

}  // namespace

absl::StatusOr<IpPrefix> IpPrefix::Parse(absl::string_view text) {
  IpPrefix p;
  std::string addr(text);
  int prefix = -1;
  if (size_t slash = addr.find('/'); slash != std::string::npos) {
    if (!absl::SimpleAtoi(addr.substr(slash + 1), &prefix)) {
      return absl::InvalidArgumentError(absl::StrCat("bad prefix length in address '", text, "'"));
    }
    addr.resize(slash);
  }
  if (::inet_pton(AF_INET, addr.c_str(), p.addr.data()) == 1) {
    p.family = AF_INET;
  } else if (::inet_pton(AF_INET6, addr.c_str(), p.addr.data()) == 1) {
    p.family = AF_INET6;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not an IPv4 or IPv6 address[/prefix]"));
  }
  int max = AddressBytes(p.family) * 8;
  if (prefix < 0) prefix = max;
  if (prefix == 0 || prefix > max) {
    return absl::InvalidArgumentError(absl::StrCat("prefix length of '", text, "' must be 1 to ", max));
  }
  p.prefix = prefix;
  return p;
}

std::string IpPrefix::AddressText() const {
  char buf[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(family, addr.data(), buf, sizeof(buf));
  return buf;
}

std::string IpPrefix::ToString() const { return absl::StrCat(AddressText(), "/", prefix); }

bool IpPrefix::SameNetwork(const IpPrefix& o) const {
  if (family != o.family || family == 0) return false;
  int full = prefix / 8, rest = prefix % 8;
  if (std::memcmp(addr.data(), o.addr.data(), full) != 0) return false;
  if (rest == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (addr[full] & mask) == (o.addr[full] & mask);
}

std::string HostPort(const IpPrefix& a, uint32_t port) {
  return a.family == AF_INET6 ? absl::StrCat("[", a.AddressText(), "]:", port) : absl::StrCat(a.AddressText(), ":", port);
}

std::vector<IpPrefix> ParsePrefixes(const std::vector<std::string>& texts) {
  std::vector<IpPrefix> out;
  for (const std::string& t : texts) {
    if (absl::StatusOr<IpPrefix> ip = IpPrefix::Parse(t); ip.ok()) out.push_back(*ip);
  }
  return out;
}

std::vector<IpPrefix> LocalAddresses(const std::vector<std::string>& interfaces) {
  std::vector<IpPrefix> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr) continue;
    int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    if (!interfaces.empty() && std::find(interfaces.begin(), interfaces.end(), i->ifa_name) == interfaces.end()) {
      continue;
    }
    IpPrefix p;
    p.family = family;
    p.netdev = i->ifa_name;
    if (family == AF_INET) {
      std::memcpy(p.addr.data(), &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, 4);
    } else {
      const in6_addr& a = reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&a)) continue;  // needs a scope: configure explicitly
      std::memcpy(p.addr.data(), a.s6_addr, 16);
    }
    p.prefix = PrefixOfMask(i->ifa_netmask, family);
    if (p.prefix == 0) continue;
    out.push_back(std::move(p));
  }
  ::freeifaddrs(list);
  return out;
}

std::string PathName(const Path& path) {
  return absl::StrCat(path.fallback ? "routed" : path.local.AddressText(), "->", path.remote.AddressText());
}

std::vector<Path> ChoosePaths(const std::vector<IpPrefix>& local, const std::vector<IpPrefix>& remote,
                              bool allow_fallback) {
  std::vector<Path> out;
  for (const IpPrefix& r : remote) {
    for (const IpPrefix& l : local) {
      if (l.prefix == r.prefix && l.SameNetwork(r) && !(l.addr == r.addr)) out.push_back({l, r, false});
    }
  }
  if (out.empty() && allow_fallback && !remote.empty()) {
    Path p;
    p.remote = remote.front();
    p.fallback = true;
    out.push_back(p);
  }
  return out;
}

}  // namespace podlink::mesh
