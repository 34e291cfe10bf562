// Repair: links of a peer that went down, rebuilt in the background
// (control/repairs.h), with the peer's stub; the housekeeping thread.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

std::function<void(const std::string&)> MeshEngine::RepairOnDownWith(const std::shared_ptr<Peer>& peer,
                                                                     const std::shared_ptr<DataLinks>& links,
                                                                     RedoPath redo, const std::vector<Path>& paths) {
  std::weak_ptr<Peer> weak_peer = peer;
  Repairs::Redo with_stub = [weak_peer, redo = std::move(redo)](const Path& path,
                                                                const std::string& name) -> absl::Status {
    std::shared_ptr<Peer> p = weak_peer.lock();
    if (p == nullptr) return absl::OkStatus();  // nothing left to repair
    std::shared_ptr<pb::Mesh::Stub> stub = p->stub();
    if (stub == nullptr) return absl::OkStatus();
    return redo(path, name, *p, *stub);
  };
  return repairs_.OnDown(links, std::move(with_stub), paths);
}

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
    RefreshOwnAdvert();
    TradeAdverts();
  }
}

}  // namespace podlink::mesh
