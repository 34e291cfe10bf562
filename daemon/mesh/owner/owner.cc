// The owner's room (region_owner.h): its making and stopping, claims, opens
// of this node's regions, and relay opens for other nodes.
#include "daemon/mesh/owner/region_owner.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/trust/origin_sign.h"
#include "daemon/mesh/trust/owner_answer.h"
#include "daemon/mesh/routing/routes.h"
#include "daemon/mesh/seal/seal_crypto.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

namespace {
const ComponentLog OpenLog("mesh");
}  // namespace

// --- exporting side ----------------------------------------------------------

RegionOwner::RegionOwner(Options options, MeshHost* host, const NodeCredentials* credentials, Liveness* liveness,
                         LateCopies* late_copies, Rooms rooms)
    : options_(std::move(options)),
      host_(host),
      credentials_(*credentials),
      liveness_(*liveness),
      late_copies_(*late_copies),
      rooms_(std::move(rooms)) {}

void RegionOwner::BeginStop() {
  stopping_.store(true, std::memory_order_release);
  relay_staging_.Stop();  // serving threads waiting for room go on (and end)
}

std::map<uint64_t, Grant> RegionOwner::CloseAll() { return grants_.Close(); }

void RegionOwner::SeenInstance(const std::string& node, uint64_t instance) {
  std::optional<std::vector<uint64_t>> stale = grants_.NewInstance(node, instance);
  if (!stale.has_value()) return;
  OpenLog()->info("event=mesh_peer_restarted node={} dropped_grants={}", node, stale->size());
  for (uint64_t g : *stale) CloseRegion(node, g);
}

uint64_t RegionOwner::GrantForTesting(const std::string& node, std::shared_ptr<const ExportRecord> rec) {
  liveness_.Seen(node);  // a grant given is a sign of life, however long the node was quiet
  Grant g;
  g.node = node;
  g.record = std::move(rec);
  g.pod = node + "/test";
  return grants_.Add(std::move(g)).grant;
}

void RegionOwner::OpenRegionFor(const std::string& node, const pb::OpenRegionRequest& req, RegionDone done) {
  if (node != node_name_) SeenInstance(node, req.caller_instance());
  if (!req.has_route()) return done(OpenRegion(node, req));
  absl::StatusOr<CheckedClaim> claim = CheckClaim(node, req.route());
  if (!claim.ok()) {
    OpenLog()->warn("event=mesh_deny peer={} reason={}", node, LogQuoted(claim.status().message()));
    ++counters_.denials;
    return done(claim.status());
  }
  if (claim->next.empty()) {
    absl::StatusOr<pb::OpenRegionResponse> resp = OpenRegion(node, req, &claim->claim);
    if (resp.ok()) {
      if (absl::Status st = SignOwnerAnswer(claim->claim, &*resp); !st.ok()) {
        CloseRegion(node, resp->grant());
        return done(absl::UnavailableError(absl::StrCat("the owner could not sign its answer: ", st.message())));
      }
    }
    return done(std::move(resp));
  }
  Relay(node, *claim, req, std::move(done));
}

absl::Status RegionOwner::SignOwnerAnswer(const pb::OriginClaim& claim, pb::OpenRegionResponse* resp) const {
  const NodeCredentials::Pems pems = credentials_.Current();
  return mesh::SignOwnerAnswer(node_name_, claim, pems.key, pems.cert, resp);
}

absl::StatusOr<RegionOwner::CheckedClaim> RegionOwner::CheckClaim(const std::string& caller,
                                                                const pb::Route& route) const {
  constexpr size_t kMaxClaim = 64 << 10;
  CheckedClaim out;
  pb::OriginClaim& claim = out.claim;
  if (route.claim().size() > kMaxClaim || !claim.ParseFromString(route.claim())) {
    return absl::PermissionDeniedError("the route's claim does not parse");
  }
  if (!ValidNodeName(claim.origin()) || !ValidNodeName(claim.destination().node())) {
    return absl::PermissionDeniedError("the claim names no valid origin or destination");
  }
  PODLINK_RETURN_IF_ERROR(VerifyNodeSignature(credentials_.Current().ca, route.origin_cert(), claim.origin(), route.claim(),
                                              route.signature()));
  // Fresh: a claim is used within seconds of being made (a minute for
  // clocks that differ).
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  if (claim.issued_unix_seconds() < now - 60 || claim.issued_unix_seconds() > now + 60) {
    return absl::PermissionDeniedError(absl::StrCat("the claim of node ", claim.origin(), " is stale or from the future"));
  }
  if (claim.importer().node() != claim.origin()) {
    return absl::PermissionDeniedError(absl::StrCat("node ", claim.origin(), " cannot open regions for pods of node '",
                                                    claim.importer().node(), "'"));
  }
  const auto& via = claim.via();
  if (via.empty() || static_cast<size_t>(via.size()) > kMaxRelays) {
    return absl::PermissionDeniedError(absl::StrCat("a route has 1 to ", kMaxRelays, " relays"));
  }
  std::set<std::string> seen = {claim.origin(), claim.destination().node()};
  if (seen.size() != 2) return absl::PermissionDeniedError("a route's origin is its destination");
  for (const std::string& v : via) {
    if (!seen.insert(v).second) return absl::PermissionDeniedError("a route names a node twice");
  }
  // This node's place on the route, and the caller must be the node before it.
  std::string before;
  if (claim.destination().node() == node_name_) {
    before = via.Get(via.size() - 1);
  } else {
    int at = 0;
    while (at < via.size() && via.Get(at) != node_name_) ++at;
    if (at == via.size()) {
      return absl::PermissionDeniedError(absl::StrCat("node ", node_name_, " is not on the route of node ",
                                                      claim.origin(), "'s claim"));
    }
    before = at == 0 ? claim.origin() : via.Get(at - 1);
    out.next_is_relay = at + 1 < via.size();
    out.relays_after = via.size() - at - 1;
    out.next = out.next_is_relay ? via.Get(at + 1) : claim.destination().node();
  }
  if (caller != before) {
    return absl::PermissionDeniedError(absl::StrCat("node ", caller, " is not the hop before this node on node ",
                                                    claim.origin(), "'s route (", before, " is)"));
  }
  return out;
}

absl::StatusOr<pb::OpenRegionResponse> RegionOwner::OpenRegion(const std::string& node,
                                                               const pb::OpenRegionRequest& plain,
                                                               const pb::OriginClaim* claim) {
  if (node == node_name_) {
    return absl::PermissionDeniedError(absl::StrCat("a peer presented this node's own name '", node, "'"));
  }
  if (plain.has_route() && claim == nullptr) return absl::PermissionDeniedError("a relayed open without its checked claim");
  // Relayed: the importer and the target are what the origin signed (its
  // claim was checked by OpenRegionFor), and the pod is the origin's.
  std::string origin = node;
  pb::OpenRegionRequest req = plain;
  if (claim != nullptr) {
    origin = claim->origin();
    *req.mutable_importer() = claim->importer();
    if (claim->target_case() == pb::OriginClaim::kName) {
      req.set_name(claim->name());
    } else {
      req.set_export_id(claim->export_id());
    }
    if (origin == node_name_) {
      return absl::PermissionDeniedError("a relay presented a claim of this node's own pods");
    }
    if (grants_.Fenced(origin, claim->nonce())) {
      ++counters_.denials;
      return absl::PermissionDeniedError(absl::StrCat("node ", origin, " fenced this route"));
    }
  }
  const pb::ForwardedIdentity& who = req.importer();
  if (who.node() != origin) {
    OpenLog()->warn("event=mesh_deny peer={} claimed_node={} reason=\"a daemon speaks only for its own node's pods\"",
                    node, LogQuoted(who.node()));
    ++counters_.denials;
    return absl::PermissionDeniedError(absl::StrCat("the daemon of node ", node,
                                                    " cannot open regions for pods of node '", who.node(), "'"));
  }
  if (who.key().empty() || who.namespace_().empty() || who.pod_name().empty()) {
    return absl::InvalidArgumentError("the forwarded identity needs key, namespace and pod name");
  }
  PodInfo pod;
  // Never the same pod as a local one. Where the API server confirms pods,
  // the key is the UID it confirms, so a node cannot vary it to get round
  // the limit of grants per pod.
  pod.key = absl::StrCat("mesh/", origin, "/", host_->TracksRemotePods() ? who.pod_uid() : who.key());
  pod.uid = who.pod_uid();
  pod.namespace_ = who.namespace_();
  pod.name = who.pod_name();
  pod.annotations.insert(who.annotations().begin(), who.annotations().end());
  pod.node = origin;
  pod.source = origin == node ? "mesh:" + node : absl::StrCat("mesh:", origin, " via ", node);
  absl::StatusOr<std::shared_ptr<const ExportRecord>> rec = host_->AuthorizeRemote(pod, req);
  if (!rec.ok()) {
    ++counters_.denials;
    return rec.status();
  }
  pb::OpenRegionResponse resp;
  // Through relays: sealed end to end with the origin (seal/window.h), keys
  // from the origin's key in its signed claim and one of this open's own.
  std::shared_ptr<seal::SealedRegion> sealed;
  if (claim != nullptr) {
    absl::StatusOr<seal::EphemeralKey> mine = seal::EphemeralKey::Generate();
    if (!mine.ok()) return mine.status();
    absl::StatusOr<seal::Key> shared =
        claim->seal_key().empty()
            ? absl::PermissionDeniedError(absl::StrCat("node ", origin, "'s claim carries no seal key: regions "
                                                       "opened through relays are sealed end to end (upgrade its "
                                                       "podlinkd)"))
            : mine->Agree(claim->seal_key());
    if (!shared.ok()) {
      ++counters_.denials;
      return shared.status();
    }
    PODLINK_ASSIGN_OR_RETURN(seal::SealKeys keys,
                             seal::DeriveSealKeys(*shared, claim->nonce(), origin, node_name_, claim->seal_key(),
                                                  mine->public_key()));
    sealed = std::make_shared<seal::SealedRegion>(keys, (*rec)->size, node, &seal_budget_, &seal_counters_);
    resp.set_seal_key(mine->public_key());
    resp.set_window_bytes(seal::kWindowBytes);
  }
  {
    const std::string tenant = TenantOf(origin, pod.namespace_);
    // A fenceable route's grant: known by its nonce, its writes landing
    // chunk by chunk (LandFenceable), never registered for RDMA below.
    const bool fenceable = claim != nullptr && claim->fenceable() && claim->nonce() != 0;
    // A grant given is a sign of life, however long the node was quiet; said
    // before it is given, so the idle sweep cannot take it on its way in.
    liveness_.Seen(node);
    const GrantTable::Added added =
        grants_.Add(Grant{node, *rec, pod.key, nullptr, req.caller_instance(), fenceable ? origin : std::string(),
                          fenceable ? claim->nonce() : 0, tenant, pod.uid, sealed});
    switch (added.over) {
      case GrantTable::Over::kNone:
        break;
      case GrantTable::Over::kNode:
        return absl::ResourceExhaustedError(absl::StrCat("node ", node, " holds ", added.held, " grants (the limit)"));
      case GrantTable::Over::kPod:
        return absl::ResourceExhaustedError(
            absl::StrCat("pod ", pod.Ref(), " holds ", added.held, " regions of this node (the limit)"));
      case GrantTable::Over::kTenant:
        return absl::ResourceExhaustedError(absl::StrCat("namespace ", pod.namespace_, " of node ", origin, " holds ",
                                                         added.held, " regions of this node (the limit per tenant)"));
      case GrantTable::Over::kClosed:
        return StoppingStatus();
    }
    resp.set_grant(added.grant);
  }
  if (req.verbs()) {
    absl::Status st = rooms_.register_for_verbs
                          ? rooms_.register_for_verbs(node, resp.grant(), *rec, req.accepts_over_tcp(),
                                                      req.accepts_staged(), /*may_register=*/sealed == nullptr, &resp)
                          : absl::FailedPreconditionError("this node serves no verbs");
    if (!st.ok()) {
      CloseRegion(node, resp.grant());
      return st;
    }
  }
  resp.set_export_id((*rec)->id);
  resp.set_size((*rec)->size);
  resp.set_handle_type(3);  // podlink.v1.HANDLE_TYPE_HOST_MEMFD
  resp.set_owner_namespace((*rec)->owner.namespace_);
  resp.set_owner_name((*rec)->owner.name);
  resp.set_instance(instance_);
  OpenLog()->info("event=mesh_grant peer={} pod={}/{} export={} grant={} origin={}", node, pod.namespace_, pod.name,
                  (*rec)->id, resp.grant(), origin);
  return resp;
}

void RegionOwner::Relay(const std::string& caller, const CheckedClaim& checked, const pb::OpenRegionRequest& req,
                        RegionDone done) {
  // Over the caller's queue pairs a relay's grant is staged: its bounce
  // pool for the caller holds each slice until the next node took it (a
  // relay has no memory of its own to register). An importer that cannot
  // take staged grants, or a relay that cannot pin a pool, uses TCP to here.
  uint64_t staged_slice = 0;
  if (req.verbs()) {
    absl::Status st = req.accepts_staged() ? absl::OkStatus()
                                           : absl::FailedPreconditionError(
                                                 "relayed regions ride TCP links to a relay unless staged over verbs");
    absl::StatusOr<uint64_t> slot = absl::FailedPreconditionError("this node serves no verbs");
    if (st.ok() && rooms_.prepare_staging) slot = rooms_.prepare_staging(caller);
    if (st.ok()) st = slot.status();
    if (!st.ok()) {
      return done(absl::FailedPreconditionError(absl::StrCat("relay ", node_name_, kRelayCannotStage, st.message())));
    }
    staged_slice = *slot;
  }
  // The next node: the relay after this one (it must be known here), or the
  // destination (whose addresses the origin signed).
  const pb::OriginClaim& claim = checked.claim;
  RemoteTarget next;
  next.node_name = checked.next;
  if (checked.next_is_relay) {
    std::optional<RemoteTarget> known = rooms_.known ? rooms_.known(next.node_name) : std::nullopt;
    if (!known.has_value()) {
      return done(absl::FailedPreconditionError(
          absl::StrCat("relay ", node_name_, " does not know node ", next.node_name, " (mesh.peers)")));
    }
    next.addresses = std::move(known->addresses);
    next.port = known->port;
  } else {
    next.addresses.assign(claim.destination().addresses().begin(), claim.destination().addresses().end());
    next.port = claim.destination().port();
  }
  if (next.port == 0 || next.port > 65535 || next.addresses.size() > 64) {
    return done(absl::InvalidArgumentError("the route's next node has no valid port or too many addresses"));
  }
  const std::string pod = absl::StrCat("mesh/", claim.origin(), "/", claim.importer().key());
  const std::string tenant = TenantOf(claim.origin(), claim.importer().namespace_());
  if (!grants_.WithinLimits(caller, pod, tenant)) {
    if (stopping_.load(std::memory_order_acquire)) return done(StoppingStatus());
    return done(absl::ResourceExhaustedError(absl::StrCat("node ", caller, " or its pod holds its limit of grants")));
  }
  // Onward as this node opens for its own pods (OpenThrough: over its own
  // transport, a next relay staging the region for this one as this one does
  // for the caller, or over TCP where it cannot), then the relay's grant,
  // forwarding to the next node's grant on the peer that carries it.
  if (!rooms_.open_through) {
    return done(absl::FailedPreconditionError(absl::StrCat("node ", node_name_, " relays for no node")));
  }
  rooms_.open_through(next, req, claim.destination().node(), checked.relays_after,
              [this, caller, req, pod, tenant, done = std::move(done), origin = claim.origin(), next,
               staged_slice](absl::StatusOr<Carried> opened) {
                if (!opened.ok()) return done(opened.status());
                InstallRelayGrant(caller, req, pod, tenant, origin, next.node_name, staged_slice,
                                  std::move(opened->carrier), std::move(opened->resp), done);
              });
}

void RegionOwner::InstallRelayGrant(const std::string& caller, const pb::OpenRegionRequest& req,
                                    const std::string& pod, const std::string& tenant, const std::string& origin,
                                    const std::string& next, uint64_t staged_slice, std::shared_ptr<Peer> carrier,
                                    pb::OpenRegionResponse resp, const RegionDone& done) {
  // A sealed route's grant addresses the owner's window, not the export.
  const uint64_t addressable = resp.window_bytes() != 0 ? resp.window_bytes() : resp.size();
  auto fwd = std::make_shared<Forward>(Forward{carrier, resp.grant(), addressable, resp.instance()});
  liveness_.Seen(caller);  // a grant given is a sign of life (before it: see OpenRegion)
  const GrantTable::Added added =
      stopping_.load(std::memory_order_acquire)
          ? GrantTable::Added{.over = GrantTable::Over::kClosed}
          : grants_.Add(Grant{caller, {}, pod, fwd, req.caller_instance(), {}, 0, tenant, {}, nullptr});
  if (added.over != GrantTable::Over::kNone) {
    ReleaseRemoteGrant(carrier.get(), resp.grant());
    if (added.over == GrantTable::Over::kClosed) return done(StoppingStatus());
    return done(absl::ResourceExhaustedError(absl::StrCat("node ", caller, " or its pod holds its limit of grants")));
  }
  const uint64_t g = added.grant;
  ++counters_.relayed_opens;
  OpenLog()->info("event=mesh_relay_grant peer={} origin={} next={} grant={}", caller, origin, next, g);
  resp.set_grant(g);
  resp.set_instance(instance_);
  resp.clear_verbs_keys();
  resp.clear_over_tcp_reason();
  resp.clear_staged_reason();
  resp.clear_staged_slice_bytes();
  if (staged_slice != 0) {
    resp.set_staged_reason(absl::StrCat("relay ", node_name_, " stores and forwards"));
    resp.set_staged_slice_bytes(staged_slice);
  }
  done(std::move(resp));
}

}  // namespace podlink::mesh
