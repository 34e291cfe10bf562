#include "daemon/mesh/control/liveness.h"

namespace podlink::mesh {

void Liveness::SeenLocked(const std::string& node) {
  if (last_seen_.contains(node) || last_seen_.size() < kMaxNodes) last_seen_[node] = absl::Now();
}

void Liveness::Seen(const std::string& node) {
  absl::MutexLock l(&mu_);
  SeenLocked(node);
}

void Liveness::BeginCall(const std::string& node) {
  absl::MutexLock l(&mu_);
  SeenLocked(node);
  ++calls_of_[node];  // authenticated nodes only, each a handful of calls
}

void Liveness::EndCall(const std::string& node) {
  absl::MutexLock l(&mu_);
  SeenLocked(node);
  auto it = calls_of_.find(node);
  if (it != calls_of_.end() && --it->second == 0) calls_of_.erase(it);
}

Liveness::Swept Liveness::Sweep(const std::vector<std::string>& holders,
                                const std::function<bool(const std::string&)>& connected,
                                const std::function<void(const std::string&)>& collect) {
  Swept out;
  const absl::Time now = absl::Now();
  absl::MutexLock l(&mu_);
  // A pause of this daemon itself is no importer's silence: their keepalives
  // wait unread in its sockets meanwhile, and the first sweep after it may
  // run before they are read. The time between two sweeps beyond their
  // period and the slack is credited to every importer.
  if (last_sweep_ != absl::InfinitePast() && now - last_sweep_ > period_ + slack_) {
    out.paused = now - last_sweep_ - period_;
    for (auto& [node, seen] : last_seen_) seen += out.paused;
    ++own_pauses_;
  }
  last_sweep_ = now;
  for (const std::string& node : holders) {
    if (calls_of_.contains(node) || connected(node)) continue;
    auto seen = last_seen_.find(node);
    // A grant is given in a control call, which counts as seen.
    if (seen != last_seen_.end() && now - seen->second < idle_) continue;
    collect(node);
    out.idle.push_back(node);
    last_seen_.erase(node);
  }
  return out;
}

uint64_t Liveness::own_pauses() const {
  absl::MutexLock l(&mu_);
  return own_pauses_;
}

}  // namespace podlink::mesh
