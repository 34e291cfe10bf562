// The late-copy guard every transport's owner side keeps (TCP data server,
// verbs staging).
//
// A slice whose connection or queue pair failed after it went out is sent
// again elsewhere; the first copy may still arrive. A transfer that needed
// such a resend ends with DONE, and from then on late copies of its slices
// are dropped, so none lands after the transfer completed (the pod may have
// reused the memory). A write between its check and its last byte is counted,
// and DONE is answered only once none of its transfer's writes is landing. A
// notification is delivered once per transfer.
//
// A transfer is named by its sender: the node (from its authenticated
// connection), the link set's instance and the transfer's number. The table
// is bounded so that DONE frames of invented transfers and instances grow
// nothing but the sender's own small share: per link instance its newest
// transfers, per node its newest instances, and in all; entries older than
// `keep` go (late copies are in flight for about the senders' timeouts).
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace podlink::mesh {

class LateCopies {
 public:
  struct Key {
    std::string node;
    uint64_t instance = 0;  // the sender's link set
    uint64_t transfer = 0;
  };
  struct Limits {
    size_t per_instance = 8192;
    size_t instances_per_node = 8;
    size_t senders = 1024;  // (node, instance) pairs in all
    absl::Duration keep = absl::Minutes(1);
  };
  explicit LateCopies(Limits limits) : limits_(limits) {}
  LateCopies() : LateCopies(Limits{}) {}

  // The transfer ended (DONE, or its notification delivered).
  void Finish(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  bool Finished(const Key& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // A write of the transfer is about to land: false when it has ended (a
  // late copy: drop it); otherwise counted until EndWrite. The check and the
  // count are one decision.
  bool BeginWrite(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  // The write landed or failed; true when it was the last of its transfer in progress.
  bool EndWrite(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  bool Writing(const Key& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // True once no write of the transfer is in progress (false: timed out).
  bool AwaitWrites(const Key& key, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Ended transfers remembered now.
  size_t Entries() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Sender = std::pair<std::string, uint64_t>;  // node, link instance
  static Sender SenderOf(const Key& k) { return {k.node, k.instance}; }

  const Limits limits_;
  mutable absl::Mutex mu_;
  std::map<Sender, std::map<uint64_t, absl::Time>> finished_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<Sender, uint64_t>, uint32_t> writing_ ABSL_GUARDED_BY(mu_);
  absl::Time last_prune_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace podlink::mesh
