// The owner's sweeps: the grants of importing nodes gone silent, and of
// importing pods gone.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

void MeshEngine::SweepIdleImporters() {
  // By node (a handful), then the grants of idle ones only, collected under
  // the liveness lock (leaf locks below it: the gate, the grant table).
  std::map<std::string, std::vector<uint64_t>> idle;
  const Liveness::Swept swept = liveness_.Sweep(
      owner_->grants().Holders(), [this](const std::string& node) { return admission_.Connected(node); },
      [&](const std::string& node) { idle[node] = owner_->grants().GrantsOf(node); });
  if (swept.paused > absl::ZeroDuration()) {
    Log()->warn("event=mesh_own_pause paused_for={} credited_to=importers", absl::FormatDuration(swept.paused));
  }
  for (const auto& [node, gs] : idle) {
    idle_peer_grants_dropped_ += gs.size();
    Log()->warn("event=mesh_importer_gone node={} dropped_grants={} idle_for=\"more than {}\"", node, gs.size(),
                absl::FormatDuration(options_.grant_idle_timeout));
    for (uint64_t g : gs) owner_->CloseRegion(node, g);
  }
}

void MeshEngine::DropGrantsOfGonePods() {
  if (!host_->TracksRemotePods()) return;
  // The host is asked with no lock of the engine's held: it takes its own.
  const std::vector<GrantTable::Held> held = owner_->grants().WithPodUid();
  std::map<std::string, bool> gone;
  std::map<std::pair<std::string, std::string>, size_t> dropped;  // (node, uid) -> grants
  for (const GrantTable::Held& h : held) {
    auto [it, fresh] = gone.try_emplace(h.pod_uid, false);
    if (fresh) it->second = host_->RemotePodGone(h.pod_uid);
    if (!it->second) continue;
    owner_->CloseRegion(h.node, h.grant);
    ++dropped[{h.node, h.pod_uid}];
  }
  for (const auto& [who, n] : dropped) {
    Log()->warn("event=mesh_importer_pod_gone node={} pod_uid={} dropped_grants={}", who.first, LogQuoted(who.second),
                n);
    gone_pod_grants_dropped_ += n;
  }
}

}  // namespace podlink::mesh
