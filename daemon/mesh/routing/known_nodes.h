// The routing room's book of other nodes' control endpoints: from
// configuration (mesh.peers), a node's own Hello answer, and verified node
// adverts. What routes through relays are computed from, and where a relay
// finds the next one. Every entry is checked as it is learnt: a valid node
// name other than this node's, a port 1 to 65535, 1 to 64 addresses that
// parse; at most kMaxKnown nodes (a known node may always be learnt again).
// Its own lock, a leaf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/mesh/routing/addresses.h"

namespace podlink::mesh {

class KnownNodes {
 public:
  static constexpr size_t kMaxKnown = 1024;
  struct Known {
    std::vector<std::string> addresses;  // "addr/prefix"
    uint32_t port = 0;                   // its control port
  };

  explicit KnownNodes(std::string self) : self_(std::move(self)) {}

  // Learns (or replaces) `node`'s endpoint; false when refused (see above).
  bool Learn(const std::string& node, const std::vector<std::string>& addresses, uint32_t port)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `node` as a target to dial (node_name, addresses and port set), or nullopt.
  std::optional<RemoteTarget> Find(const std::string& node) const ABSL_LOCKS_EXCLUDED(mu_);
  std::map<std::string, Known> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string self_;
  mutable absl::Mutex mu_;
  std::map<std::string, Known> known_ ABSL_GUARDED_BY(mu_);
};

}  // namespace podlink::mesh
