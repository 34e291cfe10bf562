// Sweeps and keepalives: idle importers, pods gone, hellos to the peers this node holds regions of.
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

void MeshEngine::KeepAlive() {
  std::set<std::shared_ptr<Peer>> peers;
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() - last_keepalive_ < options_.keepalive) return;
    last_keepalive_ = absl::Now();
    for (auto& p : handles_.Peers()) peers.insert(std::move(p));
    for (const auto& f : owner_->grants().Forwards()) peers.insert(f->peer);  // a relay holds grants onward too
  }
  // Asynchronous calls on the peers' channels: never queued behind a peer
  // worker's long task, never blocking this thread.
  struct Call {
    std::shared_ptr<pb::Mesh::Stub> stub;
    grpc::ClientContext ctx;
    pb::HelloRequest req;
    pb::HelloResponse resp;
  };
  for (const std::shared_ptr<Peer>& p : peers) {
    std::shared_ptr<pb::Mesh::Stub> stub = p->stub();
    if (stub == nullptr) continue;
    auto call = std::make_shared<Call>();
    call->stub = stub;
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
    call->req.set_version(PODLINK_VERSION);
    call->req.set_instance(instance_);
    Call* c = call.get();
    stub->async()->Hello(&c->ctx, &c->req, &c->resp, [call](grpc::Status) mutable { call.reset(); });
  }
}

void MeshEngine::SweepLinks() {
  for (const auto& p : peers_.All()) {
    if (std::shared_ptr<DataLinks> l = p->links()) l->Sweep();
  }
}

}  // namespace podlink::mesh
