// Routes through relays, for nodes this one has no cable to.
//
// Two nodes are adjacent when they share a subnet (addresses.h: a direct
// path). A node knows the addresses of the nodes it is configured with
// (mesh.peers) and of every node whose daemon it has talked to (their Hello
// answers say it, under mutual TLS); the region descriptor names the
// destination's. The route is the shortest chain of known nodes, each
// adjacent to the next; among equally short ones, the one whose narrowest hop
// has the most direct paths (cables) between its ends.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "daemon/mesh/addresses.h"

namespace podlink::mesh {

inline constexpr size_t kMaxRelays = 3;

// The relays between `self` and `target`, first hop first: empty when the
// target is adjacent, nullopt when no route of at most `max_relays` relays
// exists. `known` holds every other node's addresses (the target's included).
std::optional<std::vector<std::string>> RelayPath(const std::string& self_name, const std::vector<IpPrefix>& self,
                                                  const std::map<std::string, std::vector<IpPrefix>>& known,
                                                  const std::string& target, size_t max_relays = kMaxRelays);

}  // namespace podlink::mesh
