// The book of other nodes' control endpoints (known_nodes.h).
#include "daemon/mesh/routing/known_nodes.h"

#include "daemon/mesh/routing/routes.h"

namespace podlink::mesh {

bool KnownNodes::Learn(const std::string& node, const std::vector<std::string>& addresses, uint32_t port) {
  if (!ValidNodeName(node) || node == self_ || port == 0 || port > 65535 || addresses.empty() ||
      addresses.size() > 64) {
    return false;
  }
  for (const std::string& a : addresses) {
    if (!IpPrefix::Parse(a).ok()) return false;
  }
  absl::MutexLock l(&mu_);
  if (!known_.contains(node) && known_.size() >= kMaxKnown) return false;
  known_[node] = Known{addresses, port};
  return true;
}

std::optional<RemoteTarget> KnownNodes::Find(const std::string& node) const {
  absl::MutexLock l(&mu_);
  auto it = known_.find(node);
  if (it == known_.end()) return std::nullopt;
  RemoteTarget t;
  t.node_name = node;
  t.addresses = it->second.addresses;
  t.port = it->second.port;
  return t;
}

std::map<std::string, KnownNodes::Known> KnownNodes::Snapshot() const {
  absl::MutexLock l(&mu_);
  return known_;
}

}  // namespace podlink::mesh
