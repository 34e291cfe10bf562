// Repair: links of a peer that went down, rebuilt in the background.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

std::function<void(const std::string&)> MeshEngine::RepairOnDownWith(const std::shared_ptr<Peer>& peer,
                                                                     const std::shared_ptr<DataLinks>& links,
                                                                     RedoPath redo, const std::vector<Path>& paths,
                                                                     uint32_t data_port) {
  std::map<std::string, Path> by_name;
  for (const Path& path : paths) by_name[PathName(path)] = path;
  std::weak_ptr<Peer> weak_peer = peer;
  std::weak_ptr<DataLinks> weak_links = links;
  return [this, weak_peer, weak_links, redo = std::move(redo), by_name = std::move(by_name),
          data_port](const std::string& name) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return;
    Repair r;
    r.peer = weak_peer;
    r.links = weak_links;
    r.redo = redo;
    r.path = it->second;
    r.name = name;
    r.data_port = data_port;
    r.backoff = absl::Milliseconds(500);
    r.next = absl::Now() + r.backoff;
    ScheduleRepair(std::move(r));
  };
}

void MeshEngine::ScheduleRepair(Repair r) {
  absl::MutexLock l(&mu_);
  if (stopping_.load(std::memory_order_acquire) || repairs_.size() >= 256) return;
  // A repair that replaces every part of its path that failed by then (verbs:
  // the path's QPs) is scheduled once per path; a TCP repair is one
  // connection each.
  if (std::shared_ptr<DataLinks> links = r.links.lock(); links != nullptr && links->RepairsWholePath()) {
    for (const Repair& other : repairs_) {
      if (other.name == r.name && !other.links.owner_before(r.links) && !r.links.owner_before(other.links)) return;
    }
  }
  repairs_.push_back(std::move(r));
}

void MeshEngine::RepairLoop() {
  for (;;) {
    std::vector<Repair> due;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_.load(std::memory_order_acquire)) return true;
        absl::Time now = absl::Now();
        for (const Repair& r : repairs_) {
          if (r.next <= now) return true;
        }
        return false;
      };
      // Wakes for new work, for the next due repair, and to look at stopping_.
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200));
      if (stopping_.load(std::memory_order_acquire)) return;
      absl::Time now = absl::Now();
      for (auto it = repairs_.begin(); it != repairs_.end();) {
        if (it->next <= now) {
          due.push_back(std::move(*it));
          it = repairs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Repair& r : due) {
      std::shared_ptr<DataLinks> links = r.links.lock();
      // Gone, or the whole peer is down (the next open dials it again).
      if (links == nullptr || links->live() == 0) continue;
      absl::Status st = RepairOnce(r);
      if (st.ok()) {
        Log()->info("event=mesh_connection_repaired path={} connections={}", r.name, links->live());
        ++repaired_connections_;
        continue;
      }
      r.backoff = std::min(r.backoff * 2, absl::Seconds(5));
      r.next = absl::Now() + r.backoff;
      ScheduleRepair(std::move(r));
    }
  }
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
    SweepVerbs();
    SweepLinks();
    RefreshLocalLinks();
    ReloadPems();
    SweepIdleImporters();
    DropGrantsOfGonePods();
    KeepAlive();
    RefreshOwnAdvert();
    TradeAdverts();
  }
}

absl::Status MeshEngine::RepairOnce(Repair& r) {
  std::shared_ptr<Peer> peer = r.peer.lock();
  std::shared_ptr<DataLinks> any = r.links.lock();
  if (peer == nullptr || any == nullptr || !r.redo) return absl::OkStatus();  // nothing left to repair
  std::shared_ptr<pb::Mesh::Stub> stub = peer->stub();
  if (stub == nullptr) return absl::OkStatus();
  return r.redo(r, *peer, *stub);
}

}  // namespace podlink::mesh
