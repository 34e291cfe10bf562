// The control room's table of peers (peer_table.h).
#include "daemon/mesh/control/peer_table.h"

#include <set>

namespace podlink::mesh {

std::shared_ptr<Peer> PeerTable::Get(const std::string& node, bool tcp, const InUse& in_use) {
  const std::string key = tcp ? node + "/tcp" : node;
  // Both destroyed after the lock is let go: a forgotten peer joins its
  // worker, and a copy of one in use may be the last reference to it by then
  // (a handle or grant dropped meanwhile).
  std::vector<std::shared_ptr<Peer>> forgotten;
  std::vector<std::shared_ptr<Peer>> used;
  absl::MutexLock l(&mu_);
  if (closed_) return nullptr;
  if (auto it = peers_.find(key); it != peers_.end()) return it->second;
  if (peers_.size() >= max_peers_) {
    if (in_use) used = in_use();
    std::set<const Peer*> backing;
    for (const auto& p : used) backing.insert(p.get());
    for (auto it = peers_.begin(); it != peers_.end();) {
      std::shared_ptr<DataLinks> links = it->second->links();
      if (it->second->idle() && !backing.contains(it->second.get()) && (links == nullptr || links->live() == 0)) {
        forgotten.push_back(std::move(it->second));
        it = peers_.erase(it);
      } else {
        ++it;
      }
    }
    if (peers_.size() >= max_peers_) return nullptr;
  }
  std::shared_ptr<Peer>& p = peers_[key];
  p = std::make_shared<Peer>(node, tcp);
  return p;
}

std::vector<std::shared_ptr<Peer>> PeerTable::All() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<Peer>> out;
  out.reserve(peers_.size());
  for (const auto& [key, p] : peers_) out.push_back(p);
  return out;
}

std::map<std::string, std::shared_ptr<Peer>> PeerTable::Snapshot() const {
  absl::MutexLock l(&mu_);
  return peers_;
}

size_t PeerTable::size() const {
  absl::MutexLock l(&mu_);
  return peers_.size();
}

std::map<std::string, std::shared_ptr<Peer>> PeerTable::Close() {
  absl::MutexLock l(&mu_);
  closed_ = true;
  std::map<std::string, std::shared_ptr<Peer>> out;
  out.swap(peers_);
  return out;
}

}  // namespace podlink::mesh
