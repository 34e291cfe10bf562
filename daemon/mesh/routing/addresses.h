// Addresses of the mesh: which of this node's addresses podlinkd advertises,
// and which local address reaches which address of a peer node.
//
// A peer's region descriptor carries every address its daemon advertises
// ("10.0.1.2/30"). A pair (local, remote) is a direct path when both sit on
// the same subnet: a cable of its own, as in a direct-cabled mesh, or a
// shared rail switch. Every direct path becomes a link, so two cables give
// two links. Only when no subnet matches, and only when configured
// (mesh.fallback), does podlinkd let the kernel route to the peer's first
// address, never silently over a management network.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace podlink::mesh {

struct IpPrefix {
  int family = 0;  // AF_INET or AF_INET6
  std::array<uint8_t, 16> addr{};
  int prefix = 0;
  std::string netdev;  // local addresses only

  // "10.0.1.2/30", "fd00::1/64"; without "/n" the whole address (32 or 128).
  static absl::StatusOr<IpPrefix> Parse(absl::string_view text);
  std::string ToString() const;    // "10.0.1.2/30"
  std::string AddressText() const;  // "10.0.1.2"
  // Whether `other` lies in this address's network (same family, first
  // `prefix` bits equal).
  bool SameNetwork(const IpPrefix& other) const;
  bool operator==(const IpPrefix& o) const { return family == o.family && addr == o.addr && prefix == o.prefix; }
};

// The "addr/prefix" entries of `texts` that parse (peers' and descriptors'
// address lists; the rest is skipped).
std::vector<IpPrefix> ParsePrefixes(const std::vector<std::string>& texts);
// "10.0.1.2:7446", "[fd00::2]:7446": an address and port to dial.
std::string HostPort(const IpPrefix& a, uint32_t port);

// The node's addresses, from getifaddrs: up interfaces, no loopback, no IPv6
// link-local. `interfaces` non-empty: only those netdevs.
std::vector<IpPrefix> LocalAddresses(const std::vector<std::string>& interfaces);

struct Path {
  IpPrefix local;   // bind here
  IpPrefix remote;  // connect here
  bool fallback = false;
};

// "local->remote" ("routed->remote" for the fallback path): how link sets,
// repairs and logs name a path.
std::string PathName(const Path& path);

// Direct paths: every (local, remote) pair on one subnet with equal prefix
// lengths, in the order of `remote`. With none and `allow_fallback`, one
// path to the peer's first address from no particular local address.
std::vector<Path> ChoosePaths(const std::vector<IpPrefix>& local, const std::vector<IpPrefix>& remote,
                              bool allow_fallback);

// Another node as this one reaches it: its control endpoint and what to
// open there.
struct RemoteTarget {
  std::string node_name;
  std::vector<std::string> addresses;  // the owner daemon's "addr/prefix" list
  uint32_t port = 0;                   // its control port
  uint64_t export_id = 0;
  std::string name;                    // instead of export_id
};

}  // namespace podlink::mesh
