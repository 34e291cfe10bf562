// The control room's table of peers: the other nodes this one talks to, one
// Peer each (and one more for a node whose links must be TCP whatever the
// configured transport), at most a bound in all. When the table is full, peers
// that are idle, have no link up and back nothing this node holds (a pod's
// handle, a relay's onward grant) are forgotten first: names pods asked for
// that never answered cannot keep real peers out. Its own lock, taken before
// the handle and grant tables' (the in-use question) and a peer's own; a
// forgotten peer is destroyed after it is let go.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/mesh/control/peer.h"

namespace podlink::mesh {

class PeerTable {
 public:
  static constexpr size_t kMaxPeers = 256;  // other nodes talked to at once

  explicit PeerTable(size_t max_peers = kMaxPeers) : max_peers_(max_peers) {}

  // The peers that back what this node holds, asked only when the table is
  // full, under the table's lock: it may take leaf locks (the handle and
  // grant tables'), never call into the table.
  using InUse = std::function<std::vector<std::shared_ptr<Peer>>()>;
  // `node`'s peer (`tcp`: the one kept for TCP links), made when there is
  // none; nullptr when the table is full of peers in use, or closed.
  std::shared_ptr<Peer> Get(const std::string& node, bool tcp, const InUse& in_use) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<Peer>> All() const ABSL_LOCKS_EXCLUDED(mu_);
  std::map<std::string, std::shared_ptr<Peer>> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);  // by Get's key
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses every Get from now on and gives back the peers (the caller stops them).
  std::map<std::string, std::shared_ptr<Peer>> Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t max_peers_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);  // by node, "/tcp" for a TCP-only one
};

}  // namespace podlink::mesh
