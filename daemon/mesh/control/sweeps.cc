// Sweeps and keepalives: idle importers, pods gone, hellos to the peers this node holds regions of.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

void MeshEngine::SeenLocked(const std::string& node) {
  if (last_seen_.contains(node) || last_seen_.size() < 4096) last_seen_[node] = absl::Now();
}

void MeshEngine::Touch(const std::string& node) {
  absl::MutexLock l(&mu_);
  SeenLocked(node);
}

void MeshEngine::BeginCall(const std::string& node) {
  absl::MutexLock l(&mu_);
  SeenLocked(node);
  ++calls_of_[node];  // authenticated nodes only, each a handful of calls
}

void MeshEngine::EndCall(const std::string& node) {
  absl::MutexLock l(&mu_);
  SeenLocked(node);
  auto it = calls_of_.find(node);
  if (it != calls_of_.end() && --it->second == 0) calls_of_.erase(it);
}

void MeshEngine::SweepIdleImporters() {
  const absl::Time now = absl::Now();
  std::map<std::string, std::vector<uint64_t>> idle;
  absl::Duration paused;
  {
    absl::MutexLock l(&mu_);
    // A pause of this daemon itself (a starved host or guest, SIGSTOP, a stopped VM) is no importer's silence:
    // their keepalives wait unread in its sockets meanwhile, and the first sweep after it may run before they are
    // read. The time between two sweeps beyond their period and kPauseSlack is credited to every importer.
    if (last_sweep_ != absl::InfinitePast() && now - last_sweep_ > kHousekeepingPeriod + kPauseSlack) {
      paused = now - last_sweep_ - kHousekeepingPeriod;
      for (auto& [node, seen] : last_seen_) seen += paused;
      ++own_pauses_;
    }
    last_sweep_ = now;
    // By node (a handful), then the grants of idle ones only.
    // (The grant table's lock is a leaf: asked under mu_, so a node's Touch
    // before its next grant cannot fall between the check and the drop.)
    for (const std::string& node : grants_.Holders()) {
      if (admission_.Connected(node) || calls_of_.contains(node)) continue;
      auto seen = last_seen_.find(node);
      // A grant is given in a control call, which counts as seen.
      if (seen != last_seen_.end() && now - seen->second < options_.grant_idle_timeout) continue;
      idle[node] = grants_.GrantsOf(node);
    }
    for (const auto& [node, gs] : idle) {
      idle_peer_grants_dropped_ += gs.size();
      last_seen_.erase(node);
    }
  }
  if (paused > absl::ZeroDuration()) {
    Log()->warn("event=mesh_own_pause paused_for={} credited_to=importers", absl::FormatDuration(paused));
  }
  for (const auto& [node, gs] : idle) {
    Log()->warn("event=mesh_importer_gone node={} dropped_grants={} idle_for=\"more than {}\"", node, gs.size(),
                absl::FormatDuration(options_.grant_idle_timeout));
    for (uint64_t g : gs) CloseRegion(node, g);
  }
}

void MeshEngine::DropGrantsOfGonePods() {
  if (!host_->TracksRemotePods()) return;
  // The host is asked with no lock of the engine's held: it takes its own.
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
    Log()->warn("event=mesh_importer_pod_gone node={} pod_uid={} dropped_grants={}", who.first, LogQuoted(who.second),
                n);
    absl::MutexLock l(&mu_);
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
    for (const auto& f : grants_.Forwards()) peers.insert(f->peer);  // a relay holds grants onward too
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

}  // namespace podlink::mesh
