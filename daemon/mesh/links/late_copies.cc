#include "daemon/mesh/links/late_copies.h"

#include <iterator>

#include "absl/time/clock.h"

namespace podlink::mesh {

void LateCopies::Finish(const Key& key) {
  const Sender sender = SenderOf(key);
  const absl::Time now = absl::Now(), old = now - limits_.keep;
  absl::MutexLock l(&mu_);
  // Expiry walks everything: at most once a second, not per transfer.
  const bool prune = now - last_prune_ >= absl::Seconds(1);
  for (auto it = prune ? finished_.begin() : finished_.end(); it != finished_.end();) {
    auto& m = it->second;
    for (auto e = m.begin(); e != m.end();) e = e->second < old ? m.erase(e) : std::next(e);
    it = m.empty() && it->first != sender ? finished_.erase(it) : std::next(it);
  }
  if (prune) last_prune_ = now;
  if (!finished_.contains(sender)) {
    // The node's instances are neighbours in the map (ordered by node): its
    // stalest goes when it has its share.
    auto first = finished_.lower_bound({sender.first, 0});
    size_t instances = 0;
    auto stalest = finished_.end();
    absl::Time stalest_at = absl::InfiniteFuture();
    for (auto it = first; it != finished_.end() && it->first.first == sender.first; ++it, ++instances) {
      absl::Time newest = absl::InfinitePast();
      for (const auto& [t, at] : it->second) newest = std::max(newest, at);
      if (newest < stalest_at) stalest_at = newest, stalest = it;
    }
    if (instances >= limits_.instances_per_node && stalest != finished_.end()) finished_.erase(stalest);
    if (finished_.size() >= limits_.senders) finished_.erase(finished_.begin());
  }
  auto& m = finished_[sender];
  m[key.transfer] = now;
  if (m.size() > limits_.per_instance) m.erase(m.begin());  // numbers grow: its oldest
}

bool LateCopies::Finished(const Key& key) const {
  absl::MutexLock l(&mu_);
  auto it = finished_.find(SenderOf(key));
  return it != finished_.end() && it->second.contains(key.transfer);
}

bool LateCopies::BeginWrite(const Key& key) {
  absl::MutexLock l(&mu_);
  auto it = finished_.find(SenderOf(key));
  if (it != finished_.end() && it->second.contains(key.transfer)) return false;
  ++writing_[{SenderOf(key), key.transfer}];
  return true;
}

bool LateCopies::EndWrite(const Key& key) {
  absl::MutexLock l(&mu_);
  auto it = writing_.find({SenderOf(key), key.transfer});
  if (it == writing_.end() || --it->second != 0) return false;
  writing_.erase(it);
  return true;
}

bool LateCopies::Writing(const Key& key) const {
  absl::MutexLock l(&mu_);
  return writing_.contains({SenderOf(key), key.transfer});
}

bool LateCopies::AwaitWrites(const Key& key, absl::Duration timeout) {
  const std::pair<Sender, uint64_t> k{SenderOf(key), key.transfer};
  absl::MutexLock l(&mu_);
  auto none = [this, &k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_.contains(k); };
  return mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
}

size_t LateCopies::Entries() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [s, m] : finished_) n += m.size();
  return n;
}

}  // namespace podlink::mesh
