#include "daemon/mesh/links/node_shares.h"

#include <algorithm>

namespace podlink::mesh {

bool NodeShares::RoomLocked(const std::string& node, uint64_t n) const {
  auto it = by_node_.find(node);
  const uint64_t mine = it == by_node_.end() ? 0 : it->second;
  const uint64_t cap = rules_.one_oversized ? std::max(rules_.cap, n) : rules_.cap;
  if (used_ + n > cap || mine + n > rules_.per_node) return false;
  const bool last_quarter = used_ + n > rules_.cap - rules_.cap / 4;
  return !(rules_.last_quarter_for_small && last_quarter && mine + n > rules_.cap / 8);
}

void NodeShares::TakeLocked(const std::string& node, uint64_t n) {
  used_ += n;
  by_node_[node] += n;
}

bool NodeShares::TryTake(const std::string& node, uint64_t n) {
  absl::MutexLock l(&mu_);
  if (stopped_ || !RoomLocked(node, n)) return false;
  TakeLocked(node, n);
  return true;
}

bool NodeShares::Take(const std::string& node, uint64_t n, absl::Duration wait) {
  absl::MutexLock l(&mu_);
  auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || RoomLocked(node, n); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&room), wait) || stopped_) return false;
  TakeLocked(node, n);
  return true;
}

void NodeShares::Give(const std::string& node, uint64_t n) {
  absl::MutexLock l(&mu_);
  used_ -= std::min(used_, n);
  auto it = by_node_.find(node);
  if (it == by_node_.end()) return;
  it->second -= std::min(it->second, n);
  if (it->second == 0) by_node_.erase(it);
}

void NodeShares::Stop() {
  absl::MutexLock l(&mu_);
  stopped_ = true;
}

uint64_t NodeShares::used() const {
  absl::MutexLock l(&mu_);
  return used_;
}

}  // namespace podlink::mesh
