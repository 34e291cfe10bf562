// Routes through relays, for nodes this one has no cable to.
//
// Two nodes are adjacent when they share a subnet (addresses.h: a direct
// path). A node knows the addresses of the nodes it is configured with
// (mesh.peers) and of every node whose daemon it has talked to (their Hello
// answers say it, under mutual TLS) or whose signed advert it holds; the
// region descriptor names the destination's. The route is the shortest chain
// of known nodes, each adjacent to the next; among equally short ones, the
// one whose narrowest hop has the most cables (distinct shared subnets)
// between its ends.
//
// A node's word about its own addresses does not make a cable between two
// other nodes: a relay could claim addresses in its victim's subnet and draw
// the routes to that victim through itself. A subnet joins two nodes other
// than this one only when both ends' signed adverts name each other as
// neighbours (each has talked to the other over that kind of direct path,
// CableTrust::confirmed), or when the operator configured the first end's
// address there (mesh.peers) and the second end is either configured there
// too or the destination (whose identity the last hop's TLS checks). This
// node's own cables need no word: its dial over them checks the peer's
// certificate.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/mesh/routing/addresses.h"

namespace podlink::mesh {

inline constexpr size_t kMaxRelays = 3;

// A node's name as certificates and adverts carry it (a DNS name: lower-case
// letters, digits, '-' and '.', at most 253).
bool ValidNodeName(const std::string& n);

// What makes a cable between two nodes other than this one (above).
struct CableTrust {
  // The operator's word: mesh.peers addresses, by node.
  std::map<std::string, std::vector<IpPrefix>> configured;
  // Pairs of nodes whose current adverts name each other (first < second).
  std::set<std::pair<std::string, std::string>> confirmed;
  // Tests of the graph alone: every claim is a cable.
  bool believe_all = false;

  bool Confirmed(const std::string& x, const std::string& y) const {
    return confirmed.contains(x < y ? std::make_pair(x, y) : std::make_pair(y, x));
  }
};

// The distinct subnets in which both `x` and `y` have an address (equal
// prefix lengths), as "network/prefix".
std::set<std::string> SharedSubnets(const std::vector<IpPrefix>& x, const std::vector<IpPrefix>& y);

// The cables between two nodes other than this one, `x` and `y`: their
// distinct shared subnets that some word other than their own vouches for
// (above). `y_is_target`: y is the destination, whose addresses come from the
// region descriptor and whose identity the last hop's TLS checks.
size_t TrustedCables(const std::string& x_name, const std::vector<IpPrefix>& x, const std::string& y_name,
                     const std::vector<IpPrefix>& y, bool y_is_target, const CableTrust& trust);

// The relays between `self` and `target`, first hop first: empty when the
// target is adjacent, nullopt when no route of at most `max_relays` relays
// exists. `known` holds every other node's addresses (the target's included).
std::optional<std::vector<std::string>> RelayPath(const std::string& self_name, const std::vector<IpPrefix>& self,
                                                  const std::map<std::string, std::vector<IpPrefix>>& known,
                                                  const std::string& target, const CableTrust& trust,
                                                  size_t max_relays = kMaxRelays);

// The relay for two-hop striping to `target`, a node cabled to this one: a
// known node other than both that shares a subnet with this node (a cable of
// this node's own, checked by its dial) and has a trusted cable to the target
// (TrustedCables: a relay's claim to share the target's subnet is not enough).
// Among several, the one with the most such cables, then the first by name;
// nullopt when there is none.
std::optional<std::string> TwoHopRelay(const std::string& self_name, const std::vector<IpPrefix>& self,
                                       const std::map<std::string, std::vector<IpPrefix>>& known,
                                       const std::string& target, const std::vector<IpPrefix>& target_addrs,
                                       const CableTrust& trust);

}  // namespace podlink::mesh
