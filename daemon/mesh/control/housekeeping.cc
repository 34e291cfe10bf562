// The housekeeping thread: sweeps, keepalives, adverts and certificate
// reloads, every 200 ms (repairs: control/repairs.h, on a thread of their own).
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

// Every 200 ms, on a thread of its own: a repair can wait seconds on a dial
// or an OpenVerbs call, and none of this may wait behind it (the sweep ends
// RDMA access to a withdrawn export; keepalives and adverts keep this node's
// grants and routes alive elsewhere).
void MeshEngine::HousekeepingLoop() {
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      auto stop = [this] { return stopping_.load(std::memory_order_acquire); };
      mu_.AwaitWithTimeout(absl::Condition(&stop), kHousekeepingPeriod);
      if (stop()) return;
    }
    // Registrations whose grant closed or whose export went away are dropped.
    verbs_->Sweep([this](uint64_t grant) { return owner_->grants().Contains(grant); },
                  [this](const std::string& node, uint64_t grant) { (void)owner_->GrantedExport(node, grant); });
    SweepLinks();
    local_nics_.RefreshIfDue(advertised_);
    credentials_.Refresh();
    SweepIdleImporters();
    DropGrantsOfGonePods();
    KeepAlive();
    adverts_->RefreshOwn(AdvertisedAddresses(), control_port_);
    adverts_->Trade();
  }
}

}  // namespace podlink::mesh
