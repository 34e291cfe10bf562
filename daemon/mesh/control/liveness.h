// Which importing nodes are alive (the control room's): when each was last
// seen (a control call, a grant given, a data connection's end), the control
// calls each has in flight, and the sweep that finds the nodes gone quiet,
// crediting to every node the time this daemon itself did not run (a starved
// host, SIGSTOP, a paused VM: their keepalives wait unread meanwhile). Its
// own lock; the sweep asks `connected` and `collect` under it, which must
// take only leaf locks (the data server's gate, the grant table).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace podlink::mesh {

// HousekeepingLoop runs this often; a gap between two of its sweeps longer than that by kPauseSlack is this
// daemon's own pause (SweepIdleImporters).
constexpr absl::Duration kHousekeepingPeriod = absl::Milliseconds(200);
constexpr absl::Duration kPauseSlack = absl::Milliseconds(500);

class Liveness {
 public:
  static constexpr size_t kMaxNodes = 4096;  // nodes remembered (authenticated ones: a handful)

  // `idle`: mesh.grant_idle_timeout; `period`: how often Sweep runs; a gap
  // between two sweeps longer than `period` by `slack` is this daemon's own
  // pause.
  Liveness(absl::Duration idle, absl::Duration period, absl::Duration slack)
      : idle_(idle), period_(period), slack_(slack) {}

  void Seen(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // A control call of `node` in flight: the node is not idle until it ends.
  void BeginCall(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  void EndCall(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);

  struct Swept {
    std::vector<std::string> idle;  // forgotten now: the caller drops what they held
    absl::Duration paused;          // this daemon's own pause credited (zero: none)
  };
  // Of `holders`, the nodes with no call in flight, not `connected`, and not
  // seen for longer than `idle`; `collect` is called for each under the lock
  // (so a Seen before a node's next grant cannot fall between the check and
  // what the caller collects).
  Swept Sweep(const std::vector<std::string>& holders, const std::function<bool(const std::string&)>& connected,
              const std::function<void(const std::string&)>& collect) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t own_pauses() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void SeenLocked(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration idle_, period_, slack_;
  mutable absl::Mutex mu_;
  std::map<std::string, absl::Time> last_seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> calls_of_ ABSL_GUARDED_BY(mu_);
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t own_pauses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace podlink::mesh
