// The owner's grant table: what this node gave other nodes (a grant each,
// bound to the node that asked), the limits on how many a node, a pod and a
// tenant hold, and the fences of routed opens. Its own lock, a leaf: nothing
// is called out of it while it is held, so any room may ask it while holding
// its own lock (docs/architecture.md, the lock order).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace podlink {
struct ExportRecord;
}

namespace podlink::mesh {

// A relay's grant: requests on it go on to the next node (mesh_engine.h).
struct Forward;
namespace seal {
class SealedRegion;
}

struct Grant {
  std::string node;  // the holder
  std::weak_ptr<const ExportRecord> record;
  std::string pod;  // "mesh/" + origin node + "/" + the importing pod's identity key
  std::shared_ptr<const Forward> forward;  // set on a relay
  uint64_t caller_instance = 0;            // the holder daemon's instance (0: it did not say)
  // A fenceable routed open's (given to the last relay): the origin node and
  // its claim's nonce, by which the origin may fence the route; 0 for every
  // other grant.
  std::string origin;
  uint64_t nonce = 0;
  std::string tenant;   // "mesh/" + origin node + "/" + the importing pod's namespace
  std::string pod_uid;  // the importing pod's UID as forwarded (empty: none)
  // A routed open's (the owner's side): sealed end to end, its frames go to
  // this window and never touch the export (seal/window.h).
  std::shared_ptr<seal::SealedRegion> sealed;
};

class GrantTable {
 public:
  struct Limits {
    uint32_t per_node = 4096;
    uint32_t per_pod = 1024;
    uint32_t per_tenant = 2048;
  };
  explicit GrantTable(Limits limits) : limits_(limits) {}

  // Which limit an Add met (the caller says it in its own words).
  enum class Over { kNone, kNode, kPod, kTenant, kClosed };
  struct Added {
    uint64_t grant = 0;  // unguessable, never 0, never reused while held
    Over over = Over::kNone;
    uint32_t held = 0;  // what the holder already held of the limit met
  };
  // Adds `g` unless its node, pod or tenant holds its limit already, or the
  // table is closed (the engine stopping). A fenceable grant (nonce set) is
  // known by its nonce from then on (Fence).
  Added Add(Grant g) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a grant for them would be within the limits now.
  bool WithinLimits(const std::string& node, const std::string& pod, const std::string& tenant) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Takes `node`'s grant out; nullopt when there is none such of that node.
  std::optional<Grant> Remove(const std::string& node, uint64_t grant) ABSL_LOCKS_EXCLUDED(mu_);

  // What a data connection needs of a grant, looked up per frame.
  struct Found {
    std::shared_ptr<const ExportRecord> record;  // null: the export is gone (or a relay's grant)
    std::shared_ptr<const Forward> forward;
    bool fenceable = false;
    std::shared_ptr<seal::SealedRegion> sealed;
  };
  std::optional<Found> Find(const std::string& node, uint64_t grant) const ABSL_LOCKS_EXCLUDED(mu_);
  bool Contains(uint64_t grant) const ABSL_LOCKS_EXCLUDED(mu_);

  // A fenceable grant's bytes land a chunk at a time, each between these
  // two: false when the grant is gone (fenced) by then.
  bool BeginLanding(uint64_t grant) ABSL_LOCKS_EXCLUDED(mu_);
  void EndLanding(uint64_t grant) ABSL_LOCKS_EXCLUDED(mu_);

  // A fence of `origin`'s route under claim `nonce`, in two steps: Fence
  // refuses the nonce from now on (at least kFencedFor) and names the grants to
  // close (holder, grant); the caller closes them, then AwaitLanded waits
  // (`timeout` at most) for the chunks still being copied into them and ends
  // the fence. One fence per origin at a time (RESOURCE_EXHAUSTED).
  static constexpr absl::Duration kFencedFor = absl::Minutes(2);
  absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>> Fence(const std::string& origin, uint64_t nonce)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool AwaitLanded(const std::string& origin, const std::vector<std::pair<std::string, uint64_t>>& fenced,
                   absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  bool Fenced(const std::string& origin, uint64_t nonce) const ABSL_LOCKS_EXCLUDED(mu_);

  // `node`'s daemon said its instance: when it changed (a restart), the
  // grants the old instance held, to be closed; nullopt when it did not
  // change (or was not said: an older daemon).
  std::optional<std::vector<uint64_t>> NewInstance(const std::string& node, uint64_t instance) ABSL_LOCKS_EXCLUDED(mu_);

  // Nodes holding at least one grant, and a node's grants.
  std::vector<std::string> Holders() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<uint64_t> GrantsOf(const std::string& node) const ABSL_LOCKS_EXCLUDED(mu_);
  struct Held {
    std::string node, pod_uid;
    uint64_t grant = 0;
  };
  // Grants whose importing pod's UID was forwarded.
  std::vector<Held> WithPodUid() const ABSL_LOCKS_EXCLUDED(mu_);
  // What relays' grants forward to (their next nodes stay in use).
  std::vector<std::shared_ptr<const Forward>> Forwards() const ABSL_LOCKS_EXCLUDED(mu_);

  // Refuses every Add from now on and gives back what it held.
  std::map<uint64_t, Grant> Close() ABSL_LOCKS_EXCLUDED(mu_);

  struct Counts {
    uint64_t grants = 0, relayed = 0;           // held now; relays' among them
    uint64_t fenced = 0, restarted_dropped = 0;  // totals
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Takes a grant out of the table and its counts.
  Grant Forget(std::map<uint64_t, Grant>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Grant> grants_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> per_node_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> per_pod_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> per_tenant_ ABSL_GUARDED_BY(mu_);
  uint64_t relayed_ ABSL_GUARDED_BY(mu_) = 0;
  // Fenceable routed opens' grants by their claim's nonce (Fence looks them
  // up without walking every grant: a peer may fence as often as it likes).
  std::multimap<uint64_t, uint64_t> routed_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, uint64_t>, absl::Time> fenced_nonces_ ABSL_GUARDED_BY(mu_);  // origin, nonce
  // Origins with a fence waiting (one each: an honest daemon sends its
  // fences one at a time).
  std::set<std::string> fencing_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint32_t> landing_ ABSL_GUARDED_BY(mu_);  // fenceable grants' chunks being copied in
  std::map<std::string, uint64_t> instances_ ABSL_GUARDED_BY(mu_);  // holders' daemon instances
  uint64_t fenced_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t restarted_dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace podlink::mesh
