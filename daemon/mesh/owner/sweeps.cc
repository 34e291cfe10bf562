// The owner's sweeps (region_owner.h): the grants of importing nodes gone
// silent, and of importing pods gone.
#include <map>
#include <string>
#include <vector>

#include "common/log.h"
#include "daemon/mesh/owner/region_owner.h"

namespace podlink::mesh {

namespace {
const ComponentLog SweepLog("mesh");
}  // namespace

void RegionOwner::SweepIdleImporters(const std::function<bool(const std::string& node)>& connected) {
  // By node (a handful), then the grants of idle ones only, collected under
  // the liveness lock (leaf locks below it: the gate, the grant table).
  std::map<std::string, std::vector<uint64_t>> idle;
  const Liveness::Swept swept = liveness_.Sweep(grants_.Holders(), connected,
                                                [&](const std::string& node) { idle[node] = grants_.GrantsOf(node); });
  if (swept.paused > absl::ZeroDuration()) {
    SweepLog()->warn("event=mesh_own_pause paused_for={} credited_to=importers", absl::FormatDuration(swept.paused));
  }
  for (const auto& [node, gs] : idle) {
    counters_.idle_peer_grants_dropped += gs.size();
    SweepLog()->warn("event=mesh_importer_gone node={} dropped_grants={} idle_for=\"more than {}\"", node, gs.size(),
                     absl::FormatDuration(options_.grant_idle_timeout));
    for (uint64_t g : gs) CloseRegion(node, g);
  }
}

void RegionOwner::DropGrantsOfGonePods() {
  if (!host_->TracksRemotePods()) return;
  // The host is asked with no lock of the owner's held: it takes its own.
  const std::vector<GrantTable::Held> held = grants_.WithPodUid();
  std::map<std::string, bool> gone;
  std::map<std::pair<std::string, std::string>, size_t> dropped;  // (node, uid) -> grants
  for (const GrantTable::Held& h : held) {
    auto [it, fresh] = gone.try_emplace(h.pod_uid, false);
    if (fresh) it->second = host_->RemotePodGone(h.pod_uid);
    if (!it->second) continue;
    CloseRegion(h.node, h.grant);
    ++dropped[{h.node, h.pod_uid}];
  }
  for (const auto& [who, n] : dropped) {
    SweepLog()->warn("event=mesh_importer_pod_gone node={} pod_uid={} dropped_grants={}", who.first,
                     LogQuoted(who.second), n);
    counters_.gone_pod_grants_dropped += n;
  }
}

}  // namespace podlink::mesh
