// Memory a daemon holds for other nodes, shared out fairly: a cap in all,
// a share per peer node, and optionally the last quarter of the cap only for
// nodes holding less than an eighth of it (so a few nodes that take all they
// may still leave room for the others). The relay's staging for forwarded
// requests and the sealed windows of routed opens each keep one.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace podlink::mesh {

class NodeShares {
 public:
  struct Rules {
    uint64_t cap = 0;       // in all
    uint64_t per_node = 0;  // one node at most
    // The last quarter of the cap only for nodes holding less than an eighth.
    bool last_quarter_for_small = false;
    // One request larger than the cap may still be taken while nothing else is.
    bool one_oversized = false;
  };
  explicit NodeShares(Rules rules) : rules_(rules) {}

  // Takes `n` for `node` if the rules allow it now.
  bool TryTake(const std::string& node, uint64_t n) ABSL_LOCKS_EXCLUDED(mu_);
  // The same, waiting up to `wait` for room; false once stopped.
  bool Take(const std::string& node, uint64_t n, absl::Duration wait) ABSL_LOCKS_EXCLUDED(mu_);
  void Give(const std::string& node, uint64_t n) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes nothing from now on; waiting takes end (false).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t used() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool RoomLocked(const std::string& node, uint64_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeLocked(const std::string& node, uint64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Rules rules_;
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint64_t> by_node_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace podlink::mesh
