// The importing side's opens: direct, through relays (a routed open's claim
// and answer: routed.cc), a second route for two-hop striping; handles
// dropped.
#include "daemon/mesh/importer/opener.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/control/answer_once.h"
#include "daemon/mesh/links/stopping.h"

namespace podlink::mesh {

namespace {
const ComponentLog OpenerLog("mesh");
}  // namespace

void Opener::OpenRemote(uint64_t session, const PodInfo& pod, RemoteTarget target, OpenDone done) {
  if (target.node_name.empty() || target.node_name == options_.node_name) {
    return done(absl::InvalidArgumentError("a remote region names another node"));
  }
  if (target.port == 0 || target.port > 65535) return done(absl::InvalidArgumentError("bad mesh port"));
  if (!ValidNodeName(target.node_name)) {
    return done(absl::InvalidArgumentError("a node name is 1 to 253 of a-z, 0-9, '-' and '.'"));
  }
  pb::OpenRegionRequest req;
  pb::ForwardedIdentity* who = req.mutable_importer();
  who->set_node(options_.node_name);
  who->set_key(pod.key);
  who->set_pod_uid(pod.uid);
  who->set_namespace_(pod.namespace_);
  who->set_pod_name(pod.name);
  who->mutable_annotations()->insert(pod.annotations.begin(), pod.annotations.end());
  who->set_source(pod.source);
  if (!target.name.empty()) {
    req.set_name(target.name);
  } else {
    req.set_export_id(target.export_id);
  }
  const pb::OpenRegionRequest unrouted = req;
  // The node to call: the owner when a cable reaches it, else the first
  // relay of the shortest route through nodes this one knows, else (only if
  // configured) the owner through the kernel's routing.
  RemoteTarget hop = target;
  std::vector<std::string> relays;               // the route's, first hop first; empty: direct
  uint64_t route_nonce = 0;                      // the route's claim's
  std::shared_ptr<seal::EphemeralKey> seal_key;  // the route's: the region is sealed end to end
  std::vector<IpPrefix> local = routing_.local();
  std::vector<IpPrefix> remote = ParsePrefixes(target.addresses);
  const bool cabled = !ChoosePaths(local, remote, false).empty();
  if (!cabled) {
    std::map<std::string, std::vector<IpPrefix>> graph;
    std::map<std::string, KnownNodes::Known> known = known_->Snapshot();
    for (const auto& [name, k] : known) graph[name] = ParsePrefixes(k.addresses);
    graph[target.node_name] = remote;  // the descriptor's word, for this open only
    std::optional<std::vector<std::string>> via =
        RelayPath(options_.node_name, local, graph, target.node_name, routing_.trust());
    if (via.has_value() && !via->empty()) {
      if (absl::Status st = signer_->SignRoute(target, *via, &req, &route_nonce, &seal_key); !st.ok()) {
        return done(st);
      }
      relays = *via;
      hop.node_name = via->front();
      hop.addresses = known[hop.node_name].addresses;
      hop.port = known[hop.node_name].port;
      OpenerLog()->info("event=mesh_route destination={} via={}", target.node_name, absl::StrJoin(*via, ","));
      ++routed_opens_;
    } else if (!options_.fallback) {
      std::vector<std::string> mine;
      for (const IpPrefix& a : local) mine.push_back(a.ToString());
      return done(absl::FailedPreconditionError(absl::StrCat(
          "no direct link reaches node ", target.node_name, ": it advertises [", absl::StrJoin(target.addresses, ", "),
          "], this node has [", absl::StrJoin(mine, ", "),
          "], and no node this one knows (mesh.peers, or a daemon it talked to) relays to it (set mesh.fallback to "
          "let the kernel route)")));
    }
  }
  const bool two_hop = cabled && options_.two_hop_stripe;
  OpenThrough(hop, req, target.node_name, relays.size(),
              [this, session, done = std::move(done), destination = target.node_name, via = relays, two_hop, target,
               unrouted, route_nonce, seal_key](absl::StatusOr<Carried> opened) {
                if (!opened.ok()) return done(opened.status());
                const pb::OpenRegionResponse& resp = opened->resp;
                std::shared_ptr<seal::SealedLinks> sealed;
                if (!via.empty()) {
                  absl::StatusOr<std::shared_ptr<seal::SealedLinks>> route =
                      SealRoute(destination, route_nonce, *seal_key, opened->carrier, resp);
                  if (!route.ok()) {
                    OpenerLog()->warn("event=mesh_route_refused destination={} via={} why={}", destination,
                                      absl::StrJoin(via, ","), LogQuoted(route.status().message()));
                    ReleaseRemoteGrant(opened->carrier.get(), resp.grant());
                    return done(route.status());
                  }
                  sealed = *std::move(route);
                }
                absl::StatusOr<uint64_t> added =
                    stopping() ? StoppingStatus()
                               : handles_->Add(Handle{session, opened->carrier, resp.grant(), resp.size(),
                                                      resp.instance(), destination, via, nullptr, sealed});
                if (!added.ok()) {
                  ReleaseRemoteGrant(opened->carrier.get(), resp.grant());  // its verbs keys too
                  return done(added.status());
                }
                RemoteRegionInfo info;
                info.handle = *added;
                info.export_id = resp.export_id();
                info.size = resp.size();
                info.handle_type = resp.handle_type();
                info.owner_namespace = resp.owner_namespace();
                info.owner_name = resp.owner_name();
                const uint64_t handle = info.handle, export_id = info.export_id, size = info.size;
                done(info);
                if (two_hop) AddTwoHop(session, handle, target, unrouted, export_id, size);
              });
}

void Opener::OpenThrough(const RemoteTarget& hop, pb::OpenRegionRequest req, const std::string& destination,
                         size_t relays, std::function<void(absl::StatusOr<Carried>)> got) {
  // Over this node's transport to a relay too: over verbs the relay stages
  // the region (its bounce pool holds each slice until the next node took
  // it); one that cannot is reached over TCP instead (below).
  std::shared_ptr<Peer> peer = connector_->PeerFor(hop, /*tcp=*/false);
  if (peer == nullptr) return got(connector_->NoPeer());
  // The task holds no reference to the peer (it runs on the peer's own
  // worker, which the peer outlives). Whatever holds the open's answer — the
  // task, the open over TCP it may go on to — answers it once; one dropped
  // on the way (engine stopping) answers as it goes.
  auto answer = std::make_shared<AnswerOnce<Carried>>(
      std::move(got),
      absl::StrCat("the open of a region of node ", destination, " was dropped (podlinkd is stopping)"));
  Peer* p = peer.get();
  bool posted = p->Post([this, p, hop, req = std::move(req), answer, destination, relays] {
    std::shared_ptr<Peer> peer = p->shared_from_this();
    auto done = [answer](absl::StatusOr<Carried> r) { (*answer)(std::move(r)); };
    if (stopping()) return done(StoppingStatus());
    // The open itself, on a connected peer, on that peer's worker (`self`:
    // this lambda, to open again over TCP).
    auto open_on = [this, hop, req, done, destination, relays](const auto& self,
                                                               const std::shared_ptr<Peer>& peer) -> void {
      std::shared_ptr<pb::Mesh::Stub> stub = peer->stub();
      std::shared_ptr<DataLinks> links = peer->links();
      const bool registers = links != nullptr && links->RegistersRegions();
      pb::OpenRegionRequest open = req;
      open.set_verbs(registers);
      open.set_accepts_over_tcp(true);
      open.set_accepts_staged(registers);
      open.set_caller_instance(options_.instance);
      pb::OpenRegionResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.open_per_hop * static_cast<int64_t>(1 + relays)));
      if (absl::Status st = FromGrpc(stub->OpenRegion(&ctx, open, &resp), hop.node_name); !st.ok()) {
        // A relay that cannot stage over verbs (no bounce pool for this
        // node, or an older version): the hop to it goes over TCP.
        if (registers && hop.node_name != destination && RelayCannotStage(st)) {
          OpenerLog()->info("event=mesh_relay_over_tcp relay={} destination={} why={}", hop.node_name, destination,
                            LogQuoted(std::string(st.message()).substr(0, 256)));
          return connector_->OverTcp(hop, [self, done](absl::StatusOr<std::shared_ptr<Peer>> tcp) {
            if (!tcp.ok()) return done(tcp.status());
            self(self, *tcp);
          });
        }
        return done(st);
      }
      connector_->CarryGrant(
          peer, hop, resp,
          [done, resp](const std::shared_ptr<Peer>& carrier) {
            done(Carried{carrier, resp});
          },
          [done](absl::Status st) { done(std::move(st)); });
    };
    connector_->ConnectOrOverTcp(
        peer, hop, [open_on](const std::shared_ptr<Peer>& p) { open_on(open_on, p); },
        [done](absl::Status st) { done(std::move(st)); });
  });
  if (!posted) {
    (*answer)(connector_->NotQueued(hop.node_name));
  }
}

void Opener::AddTwoHop(uint64_t session, uint64_t handle, RemoteTarget target, pb::OpenRegionRequest req,
                       uint64_t export_id, uint64_t size) {
  // The export the direct open found, by id: a name could by now stand for
  // another export of the owner's.
  target.name.clear();
  target.export_id = export_id;
  req.clear_name();
  req.set_export_id(export_id);
  // A relay: a node this one knows that shares a subnet with this node and
  // has a cable to the target that more than its own word vouches for
  // (routes.h, TwoHopRelay).
  std::vector<IpPrefix> local = routing_.local(), remote = ParsePrefixes(target.addresses);
  std::map<std::string, KnownNodes::Known> known = known_->Snapshot();
  std::map<std::string, std::vector<IpPrefix>> graph;
  for (const auto& [name, k] : known) graph[name] = ParsePrefixes(k.addresses);
  std::optional<std::string> relay =
      TwoHopRelay(options_.node_name, local, graph, target.node_name, remote, routing_.trust());
  if (!relay.has_value()) return;  // no such relay known (yet): direct links only
  RemoteTarget hop;
  hop.node_name = *relay;
  hop.addresses = known[*relay].addresses;
  hop.port = known[*relay].port;
  uint64_t nonce = 0;
  std::shared_ptr<seal::EphemeralKey> seal_key;
  if (absl::Status st = signer_->SignRoute(target, {hop.node_name}, &req, &nonce, &seal_key, /*fenceable=*/true);
      !st.ok()) {
    OpenerLog()->warn("event=mesh_two_hop_failed destination={} relay={} why={}", target.node_name, hop.node_name,
                      LogQuoted(st.message()));
    return;
  }
  OpenThrough(hop, req, target.node_name, 1,
              [this, session, handle, nonce, export_id, size, relay = hop.node_name, destination = target.node_name,
               seal_key](absl::StatusOr<Carried> opened) {
                if (!opened.ok()) {
                  OpenerLog()->warn("event=mesh_two_hop_failed destination={} relay={} why={}", destination, relay,
                                    LogQuoted(opened.status().message().substr(0, 512)));
                  return;
                }
                absl::StatusOr<std::shared_ptr<seal::SealedLinks>> sealed =
                    SealRoute(destination, nonce, *seal_key, opened->carrier, opened->resp);
                if (!sealed.ok()) {
                  OpenerLog()->warn("event=mesh_two_hop_failed destination={} relay={} why={}", destination, relay,
                                    LogQuoted(sealed.status().message()));
                  return ReleaseRemoteGrant(opened->carrier.get(), opened->resp.grant());
                }
                if (opened->resp.export_id() != export_id || opened->resp.size() != size) {
                  OpenerLog()->warn(
                      "event=mesh_two_hop_failed destination={} relay={} why=\"the route reached export {} of "
                      "{} bytes, not {} of {}\"",
                      destination, relay, opened->resp.export_id(), opened->resp.size(), export_id, size);
                  return ReleaseRemoteGrant(opened->carrier.get(), opened->resp.grant());
                }
                auto route = std::make_shared<TwoHop>();
                route->peer = opened->carrier;
                route->grant = opened->resp.grant();
                route->instance = opened->resp.instance();
                route->nonce = nonce;
                route->sealed = *std::move(sealed);
                const bool attached = !stopping() && handles_->AttachTwoHop(session, handle, route);
                if (!attached) return ReleaseRemoteGrant(route->peer.get(), route->grant);  // the handle went first
                transfers_->counters().two_hop_routes.fetch_add(1, std::memory_order_relaxed);
                OpenerLog()->info("event=mesh_two_hop destination={} relay={} handle={}", destination, relay, handle);
              });
}

absl::Status Opener::DropHandle(uint64_t session, uint64_t handle) {
  std::optional<Handle> h = handles_->Remove(session, handle);
  if (!h.has_value()) {
    if (stopping()) return StoppingStatus();
    return absl::NotFoundError(absl::StrCat("no remote region ", handle, " in this session"));
  }
  ReleaseRemoteGrant(h->peer.get(), h->grant);
  if (h->two_hop != nullptr) ReleaseRemoteGrant(h->two_hop->peer.get(), h->two_hop->grant);
  return absl::OkStatus();
}

void Opener::DropSession(uint64_t session) {
  for (uint64_t id : handles_->OfSession(session)) (void)DropHandle(session, id);
}

absl::StatusOr<std::shared_ptr<seal::SealedLinks>> Opener::SealRoute(const std::string& destination, uint64_t nonce,
                                                                     const seal::EphemeralKey& key,
                                                                     const std::shared_ptr<Peer>& carrier,
                                                                     const pb::OpenRegionResponse& resp) {
  std::weak_ptr<Peer> weak = carrier;
  PODLINK_ASSIGN_OR_RETURN(
      std::shared_ptr<seal::SealedLinks> links,
      signer_->SealRoute(
          destination, nonce, key,
          [weak]() -> std::shared_ptr<DataLinks> {
            std::shared_ptr<Peer> p = weak.lock();
            return p == nullptr ? nullptr : p->links();
          },
          // Completions leave the carrier's link threads for the pump, which
          // seals, opens and submits the next step.
          [this](std::function<void()> task) { return transfers_->PostTwoHop(std::move(task)); }, resp));
  sealed_routes_.fetch_add(1, std::memory_order_relaxed);
  return links;
}

}  // namespace podlink::mesh
