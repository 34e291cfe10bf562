// The exporting side's grants: close, lookup, landing, fences, and timed GPU copies.
#include "daemon/mesh/owner/region_owner.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

namespace {
const ComponentLog GrantLog("mesh");
}  // namespace

void RegionOwner::CloseRegion(const std::string& node, uint64_t grant) {
  if (rooms_.unregister_verbs) rooms_.unregister_verbs(node, grant);
  std::optional<Grant> g = grants_.Remove(node, grant);
  if (!g.has_value()) return;
  // A relay closes its own grant onward.
  if (g->forward != nullptr) ReleaseRemoteGrant(g->forward->peer.get(), g->forward->grant);
}

absl::StatusOr<std::shared_ptr<DataLinks>> Forward::OnwardLinks() const {
  if (peer->instance.load(std::memory_order_acquire) != instance) {
    return absl::UnavailableError(absl::StrCat("node ", peer->node(), "'s podlinkd restarted: open the region again"));
  }
  std::shared_ptr<DataLinks> links = peer->links();
  if (links == nullptr || links->live() == 0) {
    return absl::UnavailableError(absl::StrCat("this relay has no link up to node ", peer->node()));
  }
  return links;
}

absl::StatusOr<RegionOwner::Granted> RegionOwner::LookupGrant(const std::string& node, uint64_t grant) {
  std::optional<Granted> g = grants_.Find(node, grant);
  if (!g.has_value()) return absl::NotFoundError(absl::StrCat("no grant ", grant, " for node ", node));
  if (g->forward != nullptr) return *std::move(g);
  if (g->record == nullptr || !host_->ExportLive(*g->record)) {
    CloseRegion(node, grant);
    return absl::NotFoundError(absl::StrCat("the export behind grant ", grant, " was withdrawn"));
  }
  return *std::move(g);
}

class RegionOwner::GrantLander : public seal::Lander {
 public:
  GrantLander(RegionOwner* e, uint64_t grant, const Granted& g) : e_(e), grant_(grant), g_(g) {}
  absl::Status CopyIn(uint64_t offset, const char* src, uint64_t n) override {
    if (g_.fenceable && !e_->grants_.BeginLanding(grant_)) {
      return absl::FailedPreconditionError("the route was fenced");
    }
    absl::Status st = e_->StagedCopy(*g_.record, /*write=*/true, offset, const_cast<char*>(src), n);
    if (g_.fenceable) e_->grants_.EndLanding(grant_);
    return st;
  }
  absl::Status CopyOut(uint64_t offset, char* dst, uint64_t n) override {
    return e_->StagedCopy(*g_.record, /*write=*/false, offset, dst, n);
  }
  absl::Status Notify(uint64_t value) override { return e_->host_->NotifyOwner(*g_.record, value); }

 private:
  RegionOwner* const e_;
  const uint64_t grant_;
  const Granted& g_;
};

std::unique_ptr<seal::Lander> RegionOwner::LanderFor(uint64_t grant, const Granted& g) {
  return std::make_unique<GrantLander>(this, grant, g);
}

absl::Status RegionOwner::LandFenceable(int fd, uint64_t grant, char* dst, uint64_t n, absl::Status* landed) {
  for (uint64_t done = 0; done < n;) {
    const uint64_t chunk = std::min<uint64_t>(kGpuChunk, n - done);
    char* buf = ChunkBuffer();
    PODLINK_RETURN_IF_ERROR(ReadFull(fd, buf, chunk));
    if (landed->ok() && !grants_.BeginLanding(grant)) *landed = absl::FailedPreconditionError("the route was fenced");
    if (landed->ok()) {
      std::memcpy(dst + done, buf, chunk);
      grants_.EndLanding(grant);
    }
    done += chunk;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> RegionOwner::FenceRoute(const std::string& origin, uint64_t nonce) {
  PODLINK_ASSIGN_OR_RETURN(auto fenced, grants_.Fence(origin, nonce));  // holder (the last relay), grant
  // Closed first: frames on them are refused from now on, and a frame
  // already being read lands no further chunk (GrantTable::BeginLanding). Then the
  // chunks being copied in right now finish.
  for (const auto& [holder, g] : fenced) CloseRegion(holder, g);
  const bool landed = grants_.AwaitLanded(origin, fenced, 2 * options_.io_timeout);
  if (!landed) {
    GrantLog()->warn("event=mesh_fence_timeout origin={} grants={}", origin, fenced.size());
    return absl::DeadlineExceededError(absl::StrCat("node ", node_name_, ": a chunk on node ", origin,
                                                    "'s fenced route is still being copied in"));
  }
  GrantLog()->info("event=mesh_fence origin={} grants={}", origin, fenced.size());
  return static_cast<uint32_t>(fenced.size());
}

absl::StatusOr<std::shared_ptr<const ExportRecord>> RegionOwner::GrantedExport(const std::string& node,
                                                                               uint64_t grant) {
  PODLINK_ASSIGN_OR_RETURN(Granted g, LookupGrant(node, grant));
  if (g.forward != nullptr) {
    return absl::NotFoundError(absl::StrCat("grant ", grant, " is a relay's: no export of this node behind it"));
  }
  return g.record;
}

absl::Status RegionOwner::TimedGpuCopy(const std::function<absl::Status()>& copy) {
  const absl::Time t0 = absl::Now();
  absl::Status st = copy();
  if (st.ok()) gpu_copies_.Observe(absl::ToDoubleSeconds(absl::Now() - t0));
  return st;
}

char* ChunkBuffer() {
  thread_local std::unique_ptr<char[]> buf;
  if (buf == nullptr) buf.reset(new char[kGpuChunk]);
  return buf.get();
}

}  // namespace podlink::mesh
