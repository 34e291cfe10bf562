#include "daemon/mesh/owner/grant_table.h"

#include "absl/strings/str_cat.h"
#include "daemon/mesh/links/random.h"

namespace podlink::mesh {

GrantTable::Added GrantTable::Add(Grant g) {
  absl::MutexLock l(&mu_);
  if (closed_) return Added{.over = Over::kClosed};
  // Looked up without inserting: a refused Add leaves no empty counts behind.
  auto held = [](const std::map<std::string, uint32_t>& m, const std::string& k) {
    auto it = m.find(k);
    return it == m.end() ? 0u : it->second;
  };
  if (uint32_t n = held(per_node_, g.node); n >= limits_.per_node) return Added{.over = Over::kNode, .held = n};
  if (uint32_t n = held(per_pod_, g.pod); n >= limits_.per_pod) return Added{.over = Over::kPod, .held = n};
  if (uint32_t n = held(per_tenant_, g.tenant); n >= limits_.per_tenant) {
    return Added{.over = Over::kTenant, .held = n};
  }
  ++per_node_[g.node];
  ++per_pod_[g.pod];
  ++per_tenant_[g.tenant];
  uint64_t id = 0;
  while (id == 0 || grants_.contains(id)) id = RandomU64();
  if (g.nonce != 0) routed_.emplace(g.nonce, id);
  if (g.forward != nullptr) ++relayed_;
  grants_.emplace(id, std::move(g));
  return Added{.grant = id};
}

bool GrantTable::WithinLimits(const std::string& node, const std::string& pod, const std::string& tenant) const {
  absl::MutexLock l(&mu_);
  auto below = [](const std::map<std::string, uint32_t>& m, const std::string& k, uint32_t limit) {
    auto it = m.find(k);
    return it == m.end() || it->second < limit;
  };
  return !closed_ && below(per_node_, node, limits_.per_node) && below(per_pod_, pod, limits_.per_pod) &&
         below(per_tenant_, tenant, limits_.per_tenant);
}

Grant GrantTable::Forget(std::map<uint64_t, Grant>::iterator it) {
  const Grant& g = it->second;
  auto uncount = [](std::map<std::string, uint32_t>& held, const std::string& key) {
    if (auto c = held.find(key); c != held.end() && --c->second == 0) held.erase(c);
  };
  uncount(per_node_, g.node);
  uncount(per_pod_, g.pod);
  uncount(per_tenant_, g.tenant);
  if (g.nonce != 0) {
    auto [from, to] = routed_.equal_range(g.nonce);
    for (auto r = from; r != to; ++r) {
      if (r->second == it->first) {
        routed_.erase(r);
        break;
      }
    }
  }
  if (g.forward != nullptr) --relayed_;
  return std::move(grants_.extract(it).mapped());
}

std::optional<Grant> GrantTable::Remove(const std::string& node, uint64_t grant) {
  absl::MutexLock l(&mu_);
  auto it = grants_.find(grant);
  if (it == grants_.end() || it->second.node != node) return std::nullopt;
  return Forget(it);
}

std::optional<GrantTable::Found> GrantTable::Find(const std::string& node, uint64_t grant) const {
  absl::MutexLock l(&mu_);
  auto it = grants_.find(grant);
  if (it == grants_.end() || it->second.node != node) return std::nullopt;
  Found f;
  if (it->second.forward != nullptr) {
    f.forward = it->second.forward;
    return f;
  }
  f.record = it->second.record.lock();
  f.fenceable = it->second.nonce != 0;
  f.sealed = it->second.sealed;
  return f;
}

bool GrantTable::Contains(uint64_t grant) const {
  absl::MutexLock l(&mu_);
  return grants_.contains(grant);
}

bool GrantTable::BeginLanding(uint64_t grant) {
  absl::MutexLock l(&mu_);
  if (!grants_.contains(grant)) return false;
  ++landing_[grant];
  return true;
}

void GrantTable::EndLanding(uint64_t grant) {
  absl::MutexLock l(&mu_);
  auto it = landing_.find(grant);
  if (it != landing_.end() && --it->second == 0) landing_.erase(it);
}

absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>> GrantTable::Fence(const std::string& origin,
                                                                                uint64_t nonce) {
  if (nonce == 0) return absl::InvalidArgumentError("a route's nonce is not 0");
  absl::MutexLock l(&mu_);
  // The wait that follows holds a gRPC thread: one per origin at a time.
  if (!fencing_.insert(origin).second) {
    return absl::ResourceExhaustedError(absl::StrCat("node ", origin, " has a fence waiting here already"));
  }
  // A relay presenting the claim again gets nothing (claims live a minute).
  constexpr size_t kFencedNonces = 4096;
  const absl::Time now = absl::Now();
  for (auto it = fenced_nonces_.begin(); it != fenced_nonces_.end();) {
    it = now - it->second > kFencedFor ? fenced_nonces_.erase(it) : std::next(it);
  }
  if (fenced_nonces_.size() >= kFencedNonces) fenced_nonces_.erase(fenced_nonces_.begin());
  fenced_nonces_[{origin, nonce}] = now;
  std::vector<std::pair<std::string, uint64_t>> fenced;  // holder (the last relay), grant
  auto [from, to] = routed_.equal_range(nonce);
  for (auto r = from; r != to; ++r) {
    auto it = grants_.find(r->second);
    if (it != grants_.end() && it->second.origin == origin) fenced.emplace_back(it->second.node, r->second);
  }
  return fenced;
}

bool GrantTable::AwaitLanded(const std::string& origin, const std::vector<std::pair<std::string, uint64_t>>& fenced,
                             absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  fenced_total_ += fenced.size();
  auto quiet = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& f : fenced) {
      if (landing_.contains(f.second)) return false;
    }
    return true;
  };
  const bool landed = mu_.AwaitWithTimeout(absl::Condition(&quiet), timeout);
  fencing_.erase(origin);
  return landed;
}

bool GrantTable::Fenced(const std::string& origin, uint64_t nonce) const {
  absl::MutexLock l(&mu_);
  return fenced_nonces_.contains({origin, nonce});
}

std::optional<std::vector<uint64_t>> GrantTable::NewInstance(const std::string& node, uint64_t instance) {
  if (instance == 0) return std::nullopt;  // an older daemon: it does not say
  absl::MutexLock l(&mu_);
  uint64_t& seen = instances_[node];
  if (seen == instance) return std::nullopt;
  const bool restarted = seen != 0;
  seen = instance;
  if (!restarted) return std::nullopt;
  std::vector<uint64_t> stale;
  for (const auto& [id, g] : grants_) {
    if (g.node == node && g.caller_instance != 0 && g.caller_instance != instance) stale.push_back(id);
  }
  restarted_dropped_ += stale.size();
  return stale;
}

std::vector<std::string> GrantTable::Holders() const {
  absl::MutexLock l(&mu_);
  std::vector<std::string> out;
  for (const auto& [node, n] : per_node_) out.push_back(node);  // counts of 0 are erased
  return out;
}

std::vector<uint64_t> GrantTable::GrantsOf(const std::string& node) const {
  absl::MutexLock l(&mu_);
  std::vector<uint64_t> out;
  for (const auto& [id, g] : grants_) {
    if (g.node == node) out.push_back(id);
  }
  return out;
}

std::vector<GrantTable::Held> GrantTable::WithPodUid() const {
  absl::MutexLock l(&mu_);
  std::vector<Held> out;
  for (const auto& [id, g] : grants_) {
    if (!g.pod_uid.empty()) out.push_back(Held{g.node, g.pod_uid, id});
  }
  return out;
}

std::vector<std::shared_ptr<const Forward>> GrantTable::Forwards() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<const Forward>> out;
  for (const auto& [id, g] : grants_) {
    if (g.forward != nullptr) out.push_back(g.forward);
  }
  return out;
}

std::map<uint64_t, Grant> GrantTable::Close() {
  absl::MutexLock l(&mu_);
  closed_ = true;
  std::map<uint64_t, Grant> all;
  all.swap(grants_);
  per_node_.clear();
  per_pod_.clear();
  per_tenant_.clear();
  routed_.clear();
  relayed_ = 0;
  return all;
}

GrantTable::Counts GrantTable::counts() const {
  absl::MutexLock l(&mu_);
  return Counts{grants_.size(), relayed_, fenced_total_, restarted_dropped_};
}

}  // namespace podlink::mesh
