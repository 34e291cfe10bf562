// The importing daemon's data connections to one peer daemon (the TCP
// backend of a mesh link). Every direct path to the peer carries
// `connections_per_path` authenticated TCP connections; a transfer is cut
// into slices that the connections *pull* from one queue while they have
// fewer than `slices_in_flight` unanswered, so a faster cable takes more
// slices and unequal links balance themselves (multi-rail striping). A
// transfer that prefers some paths (nic_rank.h: those nearest its memory,
// and for one slice the fastest of them) is carried by their connections
// while any of them is up.
// A transfer completes when every slice is answered, with the first error.
//
// A connection that fails (reset, TCP_USER_TIMEOUT, protocol error) hands
// the slices it carried back to the head of the queue for the remaining
// connections (at most kMaxAttempts sends per slice); a transfer that needed
// that ends with DONE, so the receiver drops late copies (wire.h). When no
// connection is left, everything queued fails with UNAVAILABLE and the peer
// must be dialed again.
//
// With `zero_copy`, a write's slices of a pod's host export go to the kernel
// without a copy (MSG_ZEROCOPY: ZeroCopySends in wire.h), per connection
// while the kernel can.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/mesh/links/links.h"
#include "daemon/mesh/links/slices.h"
#include "daemon/mesh/links/wire.h"

namespace podlink::mesh {

class PeerLinks final : public DataLinks {
 public:
  static constexpr uint32_t kMaxAttempts = 3;

  // A request unanswered for `answer_timeout` (the peer is alive but silent)
  // fails its connection like a reset would.
  PeerLinks(std::string node, uint64_t slice_bytes, uint32_t slices_in_flight,
            absl::Duration answer_timeout = absl::Seconds(30), bool zero_copy = false);
  // Random per instance; sent in every connection's AUTH (wire.h).
  const char* transport() const override { return "tcp"; }
  uint64_t instance() const override { return instance_; }
  ~PeerLinks() override;  // fails whatever is queued or in flight with UNAVAILABLE, joins the threads
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;

  // Takes an authenticated data connection (AUTH sent) over `path`. Joins
  // and forgets connections that failed before.
  void AddConnection(UniqueFd fd, std::string path) ABSL_LOCKS_EXCLUDED(mu_);
  // Called (on the failing connection's thread, no lock held) with the path
  // of each connection that fails while the links are in use.
  void set_on_down(std::function<void(const std::string& path)> f) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    on_down_ = std::move(f);
  }
  // Queues `op`; UNAVAILABLE (and `done` never called) when no connection is up.
  absl::Status Submit(LinkOp op) override ABSL_LOCKS_EXCLUDED(mu_);
  size_t live() const override ABSL_LOCKS_EXCLUDED(mu_);
  LinkStats Stats() const override ABSL_LOCKS_EXCLUDED(mu_);
  // Per connection: path, up, bytes sent.
  std::vector<std::tuple<std::string, bool, uint64_t>> Connections() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A slice's tag (wire.h): (op number << 32) | index, the DONE record's index kDoneSliceIndex.
  static uint64_t Tag(const Slice& s) {
    return (uint64_t{static_cast<uint32_t>(s.op->number)} << 32) | (s.done_record ? kDoneSliceIndex : s.index);
  }
  struct Conn {
    UniqueFd fd;
    std::string path;
    bool dead = false;                  // guarded by PeerLinks::mu_
    std::map<uint64_t, Slice> unacked;  // guarded by PeerLinks::mu_
    uint64_t bytes_sent = 0;            // guarded by PeerLinks::mu_
    explicit Conn(ZeroCopyCounters* counters) : zc(counters) {}
    ZeroCopySends zc;                   // sends by tx; completions reaped by tx and rx
    bool zc_logged_off = false;         // guarded by PeerLinks::mu_
    std::thread tx, rx;
  };

  // The first queued slice connection c may carry (its op's path
  // preference, nic_rank.h).
  std::optional<Slice> NextFor(const Conn& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(Conn& c);
  void Receive(Conn& c);
  // Fails connection c; its unanswered slices, and `owned` (one the caller
  // took out of c.unacked), go to the other connections or fail.
  void Kill(Conn& c, const absl::Status& why, Slice* owned = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes c's zero-copy completions (returns how many messages); says once
  // when the kernel made the connection stop asking.
  int ReapZeroCopy(Conn& c) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string node_;
  const uint64_t instance_;
  const uint64_t slice_bytes_;
  const uint32_t slices_in_flight_;
  const absl::Duration answer_timeout_;
  const bool zero_copy_;

  mutable absl::Mutex mu_;  // protects everything below and the Conn fields marked so
  absl::CondVar cv_;        // queue, room or state changed
  SliceScheduler sched_;   // the queue: guarded by mu_
  std::vector<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> up_paths_ ABSL_GUARDED_BY(mu_);  // paths with a connection up
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  LinkStats stats_ ABSL_GUARDED_BY(mu_);
  ZeroCopyCounters zc_counters_;  // all connections'; atomics
  std::function<void(const std::string&)> on_down_ ABSL_GUARDED_BY(mu_);
};

}  // namespace podlink::mesh
