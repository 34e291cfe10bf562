// The importer's handle table: the regions of other nodes this node's pods
// opened (a handle each, held by the pod's session), at most a limit per
// session, and the second route a handle may stripe over. Its own lock, a
// leaf: nothing is called out of it while it is held (docs/architecture.md,
// the lock order).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace podlink::mesh {

class Peer;  // control/peer.h
namespace seal {
class SealedLinks;
}

// A second route to a node this one is cabled to, through a relay cabled to
// both (mesh.two_hop_stripe); it joins large transfers' stripes.
struct TwoHop {
  std::shared_ptr<Peer> peer;  // the relay's, whose links carry the route
  uint64_t grant = 0;          // the relay's grant
  uint64_t instance = 0;       // the relay daemon's instance that issued it
  uint64_t nonce = 0;          // the route's claim: the owner fences it by this
  std::atomic<bool> failed{false};  // a chunk failed on it: not used again
  std::shared_ptr<seal::SealedLinks> sealed;  // the route is sealed end to end; its chunks go through this
};

struct Handle {
  uint64_t session = 0;
  std::shared_ptr<Peer> peer;
  uint64_t grant = 0;
  uint64_t size = 0;
  uint64_t instance = 0;            // the peer daemon's instance that issued the grant
  std::string destination;          // the owner's node (peer is the first relay when via is set)
  std::vector<std::string> via;     // relays, first hop first
  std::shared_ptr<TwoHop> two_hop;  // mesh.two_hop_stripe: a second route, once open
  std::shared_ptr<seal::SealedLinks> sealed;  // through relays: every operation goes sealed through this
};

class HandleTable {
 public:
  explicit HandleTable(uint32_t per_session) : per_session_(per_session) {}

  // The new handle (kRemoteHandleBit set, never reused); RESOURCE_EXHAUSTED
  // when the session holds its limit, UNAVAILABLE once closed.
  absl::StatusOr<uint64_t> Add(Handle h) ABSL_LOCKS_EXCLUDED(mu_);
  // Only for the session that holds it (nullopt otherwise).
  std::optional<Handle> Find(uint64_t session, uint64_t handle) const ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<Handle> Remove(uint64_t session, uint64_t handle) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<uint64_t> OfSession(uint64_t session) const ABSL_LOCKS_EXCLUDED(mu_);
  // Joins `route` to the session's handle; false when the handle is gone,
  // has a second route already, or the table is closed.
  bool AttachTwoHop(uint64_t session, uint64_t handle, std::shared_ptr<TwoHop> route) ABSL_LOCKS_EXCLUDED(mu_);
  // The peers whose links the handles use (two-hop relays' too).
  std::vector<std::shared_ptr<Peer>> Peers() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Handle> All() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses every Add from now on and gives back what it held.
  std::map<uint64_t, Handle> Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint32_t per_session_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Handle> handles_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint32_t> per_session_held_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace podlink::mesh
