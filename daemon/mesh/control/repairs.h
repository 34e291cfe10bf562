// Repairs (the control room's): a path of a peer's link set that failed is
// brought back in the background, with backoff, while the link set's other
// paths carry on. What bringing it back takes is the transport's (TCP: one
// connection dialed again with a new cookie; verbs: the path's failed queue
// pairs replaced); when and how often is this class's. Its own thread and
// lock (a leaf: a repair runs without it).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/links/links.h"

namespace podlink::mesh {

class Repairs {
 public:
  struct Timing {
    absl::Duration first = absl::Milliseconds(500);  // after the failure, and the first backoff
    absl::Duration most = absl::Seconds(5);          // the backoff doubles up to this
    absl::Duration tick = absl::Milliseconds(200);   // the thread looks at stopping this often at least
    size_t max_queued = 256;                         // repairs waiting at once (more are dropped)
  };
  // Brings `path` (named `name`, as the link set names it) back; an error
  // means it is tried again after the backoff.
  using Redo = std::function<absl::Status(const Path& path, const std::string& name)>;

  Repairs() : Repairs(Timing{}) {}
  explicit Repairs(Timing timing) : timing_(timing) {}
  ~Repairs();  // Stop()s and Join()s
  Repairs(const Repairs&) = delete;
  Repairs& operator=(const Repairs&) = delete;

  void Start();
  // Says stop: the thread ends after the repair it may be running, without
  // waiting for it; what is queued is dropped, and nothing more is queued.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the thread to end (after Stop).
  void Join();

  // What a link set calls when one of its paths fails: a repair of the path
  // of `paths` named so is queued (a name not among them is ignored). The
  // callback holds `links` weakly: once the link set is gone, or none of its
  // paths is up (the next open dials the peer again), its repairs are dropped.
  std::function<void(const std::string&)> OnDown(const std::shared_ptr<DataLinks>& links, Redo redo,
                                                 const std::vector<Path>& paths);

  uint64_t repaired() const { return repaired_.load(std::memory_order_relaxed); }
  size_t queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    std::weak_ptr<DataLinks> links;
    std::shared_ptr<const Redo> redo;
    Path path;
    std::string name;
    absl::Time next;
    absl::Duration backoff;
  };
  void Schedule(Job job) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const Timing timing_;
  mutable absl::Mutex mu_;
  std::vector<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> repaired_{0};
  std::thread thread_;
};

}  // namespace podlink::mesh
