// The exporting side's grants: close, lookup, landing, fences.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

void MeshEngine::CloseRegion(const std::string& node, uint64_t grant) {
  {
    absl::MutexLock l(&verbs_mu_);
    if (verbs_server_ != nullptr) verbs_server_->Unregister(grant, node);
  }
  std::shared_ptr<const Forward> fwd;
  {
    absl::MutexLock l(&mu_);
    auto it = grants_.find(grant);
    if (it == grants_.end() || it->second.node != node) return;
    --grants_per_node_[node];
    if (auto p = grants_per_pod_.find(it->second.pod); p != grants_per_pod_.end() && --p->second == 0) {
      grants_per_pod_.erase(p);
    }
    if (auto t = grants_per_tenant_.find(it->second.tenant); t != grants_per_tenant_.end() && --t->second == 0) {
      grants_per_tenant_.erase(t);
    }
    fwd = std::move(it->second.forward);
    if (const uint64_t nonce = it->second.nonce; nonce != 0) {
      auto [from, to] = routed_grants_.equal_range(nonce);
      for (auto r = from; r != to; ++r) {
        if (r->second == grant) {
          routed_grants_.erase(r);
          break;
        }
      }
    }
    grants_.erase(it);
  }
  // A relay closes its own grant onward.
  if (fwd != nullptr) ReleaseRemoteGrant(fwd->peer.get(), fwd->grant);
}

absl::StatusOr<MeshEngine::Granted> MeshEngine::LookupGrant(const std::string& node, uint64_t grant) {
  Granted g;
  {
    absl::MutexLock l(&mu_);
    auto it = grants_.find(grant);
    if (it == grants_.end() || it->second.node != node) {
      return absl::NotFoundError(absl::StrCat("no grant ", grant, " for node ", node));
    }
    if (it->second.forward != nullptr) {
      g.forward = it->second.forward;
      return g;
    }
    g.record = it->second.record.lock();
    g.fenceable = it->second.nonce != 0;
    g.sealed = it->second.sealed;
  }
  if (g.record == nullptr || !host_->ExportLive(*g.record)) {
    CloseRegion(node, grant);
    return absl::NotFoundError(absl::StrCat("the export behind grant ", grant, " was withdrawn"));
  }
  return g;
}

class MeshEngine::GrantLander : public seal::Lander {
 public:
  GrantLander(MeshEngine* e, uint64_t grant, const Granted& g) : e_(e), grant_(grant), g_(g) {}
  absl::Status CopyIn(uint64_t offset, const char* src, uint64_t n) override {
    if (g_.fenceable && !e_->BeginLanding(grant_)) return absl::FailedPreconditionError("the route was fenced");
    absl::Status st = e_->StagedCopy(*g_.record, /*write=*/true, offset, const_cast<char*>(src), n);
    if (g_.fenceable) e_->EndLanding(grant_);
    return st;
  }
  absl::Status CopyOut(uint64_t offset, char* dst, uint64_t n) override {
    return e_->StagedCopy(*g_.record, /*write=*/false, offset, dst, n);
  }
  absl::Status Notify(uint64_t value) override { return e_->host_->NotifyOwner(*g_.record, value); }

 private:
  MeshEngine* const e_;
  const uint64_t grant_;
  const Granted& g_;
};

std::unique_ptr<seal::Lander> MeshEngine::LanderFor(uint64_t grant, const Granted& g) {
  return std::make_unique<GrantLander>(this, grant, g);
}

bool MeshEngine::BeginLanding(uint64_t grant) {
  absl::MutexLock l(&mu_);
  if (!grants_.contains(grant)) return false;
  ++grant_writes_[grant];
  return true;
}

void MeshEngine::EndLanding(uint64_t grant) {
  absl::MutexLock l(&mu_);
  auto it = grant_writes_.find(grant);
  if (it != grant_writes_.end() && --it->second == 0) grant_writes_.erase(it);
}

absl::Status MeshEngine::LandFenceable(int fd, uint64_t grant, char* dst, uint64_t n, absl::Status* landed) {
  for (uint64_t done = 0; done < n;) {
    const uint64_t chunk = std::min<uint64_t>(kGpuChunk, n - done);
    char* buf = ChunkBuffer();
    PODLINK_RETURN_IF_ERROR(ReadFull(fd, buf, chunk));
    if (landed->ok() && !BeginLanding(grant)) *landed = absl::FailedPreconditionError("the route was fenced");
    if (landed->ok()) {
      std::memcpy(dst + done, buf, chunk);
      EndLanding(grant);
    }
    done += chunk;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> MeshEngine::FenceRoute(const std::string& origin, uint64_t nonce) {
  if (nonce == 0) return absl::InvalidArgumentError("a route's nonce is not 0");
  std::vector<std::pair<std::string, uint64_t>> fenced;  // holder (the last relay), grant
  {
    absl::MutexLock l(&mu_);
    // The wait below holds a gRPC thread: one per origin at a time.
    if (!fencing_.insert(origin).second) {
      return absl::ResourceExhaustedError(absl::StrCat("node ", origin, " has a fence waiting here already"));
    }
    // A relay presenting the claim again gets nothing (claims live a minute).
    constexpr size_t kFencedNonces = 4096;
    const absl::Time now = absl::Now();
    for (auto it = fenced_nonces_.begin(); it != fenced_nonces_.end();) {
      it = now - it->second > absl::Minutes(2) ? fenced_nonces_.erase(it) : std::next(it);
    }
    if (fenced_nonces_.size() >= kFencedNonces) fenced_nonces_.erase(fenced_nonces_.begin());
    fenced_nonces_[{origin, nonce}] = now;
    auto [from, to] = routed_grants_.equal_range(nonce);
    for (auto r = from; r != to; ++r) {
      auto it = grants_.find(r->second);
      if (it != grants_.end() && it->second.origin == origin) fenced.emplace_back(it->second.node, r->second);
    }
  }
  // Closed first: frames on them are refused from now on, and a frame
  // already being read lands no further chunk (BeginLanding). Then the
  // chunks being copied in right now finish.
  for (const auto& [holder, g] : fenced) CloseRegion(holder, g);
  absl::MutexLock l(&mu_);
  fenced_grants_ += fenced.size();
  auto quiet = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& f : fenced) {
      if (grant_writes_.contains(f.second)) return false;
    }
    return true;
  };
  const bool landed = mu_.AwaitWithTimeout(absl::Condition(&quiet), 2 * options_.io_timeout);
  fencing_.erase(origin);
  if (!landed) {
    Log()->warn("event=mesh_fence_timeout origin={} grants={}", origin, fenced.size());
    return absl::DeadlineExceededError(absl::StrCat("node ", node_name_, ": a chunk on node ", origin,
                                                    "'s fenced route is still being copied in"));
  }
  Log()->info("event=mesh_fence origin={} grants={}", origin, fenced.size());
  return static_cast<uint32_t>(fenced.size());
}

absl::StatusOr<std::shared_ptr<const ExportRecord>> MeshEngine::GrantedExport(const std::string& node,
                                                                              uint64_t grant) {
  PODLINK_ASSIGN_OR_RETURN(Granted g, LookupGrant(node, grant));
  if (g.forward != nullptr) {
    return absl::NotFoundError(absl::StrCat("grant ", grant, " is a relay's: no export of this node behind it"));
  }
  return g.record;
}

}  // namespace podlink::mesh
