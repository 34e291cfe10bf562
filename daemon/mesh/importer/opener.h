// The importing side's opens (the importer's room): a pod's open of another
// node's region, straight to the owner where a cable reaches it, else through
// the relays of the shortest route this node knows (its claim signed, the
// owner's answer checked and the route sealed: routed.h), else (only with
// mesh.fallback) through the kernel's routing; with mesh.two_hop_stripe, a
// second route through a relay joined to the handle afterwards. Handles go to
// the handle table; what reaches a node is the connector's
// (control/connector.h). No lock of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/identity/pod_source.h"
#include "daemon/mesh/control/connector.h"
#include "daemon/mesh/importer/handle_table.h"
#include "daemon/mesh/importer/routed.h"
#include "daemon/mesh/importer/transfer.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/routing/known_nodes.h"
#include "daemon/mesh/routing/routes.h"
#include "podlink/mesh/v1/mesh.pb.h"

namespace podlink::mesh {

// What a pod opened of another node's region, as its session sees it.
struct RemoteRegionInfo {
  uint64_t handle = 0;  // has kRemoteHandleBit
  uint64_t export_id = 0;
  uint64_t size = 0;
  uint32_t handle_type = 0;
  std::string owner_namespace, owner_name;
};

class Opener {
 public:
  struct Options {
    std::string node_name;  // this node's
    uint64_t instance = 0;  // this daemon's (the owner binds grants to it)
    bool fallback = false;  // mesh.fallback
    // mesh.two_hop_stripe, where the transport's links stripe (LinkMaker::stripes_two_hop).
    bool two_hop_stripe = false;
    // How long an open may take per node still ahead on its route.
    absl::Duration open_per_hop = absl::Seconds(10);
  };
  struct Routing {
    std::function<std::vector<IpPrefix>()> local;  // this node's addresses for choosing paths
    std::function<CableTrust()> trust;             // what makes a cable between two other nodes (routes.h)
  };
  // Every pointer outlives this (the engine's rooms).
  Opener(Options options, Routing routing, Connector* connector, HandleTable* handles, RemoteTransfers* transfers,
         const RouteSigner* signer, const KnownNodes* known, const std::atomic<bool>* stopping)
      : options_(std::move(options)),
        routing_(std::move(routing)),
        connector_(connector),
        handles_(handles),
        transfers_(transfers),
        signer_(signer),
        known_(known),
        stopping_(stopping) {}

  using OpenDone = std::function<void(absl::StatusOr<RemoteRegionInfo>)>;
  // Opens `target` for `pod` (session `session`) in the background; `done`
  // runs once, on a mesh thread (or at once for a request refused as it is).
  void OpenRemote(uint64_t session, const PodInfo& pod, RemoteTarget target, OpenDone done);
  // Opens `req` (its route, if any, already signed) on `hop`'s daemon, on
  // that peer's worker, `relays` nodes still ahead of `destination`; `got`
  // gets the peer whose links carry the grant and the answer — the grant is
  // then the caller's to keep or give back. A relay's onward open too.
  void OpenThrough(const RemoteTarget& hop, pb::OpenRegionRequest req, const std::string& destination, size_t relays,
                   std::function<void(absl::StatusOr<Carried>)> got);
  // Drops a handle the session holds, its grants given back (NOT_FOUND: none such).
  absl::Status DropHandle(uint64_t session, uint64_t handle);
  void DropSession(uint64_t session);

  uint64_t routed_opens() const { return routed_opens_.load(std::memory_order_relaxed); }
  uint64_t sealed_routes() const { return sealed_routes_.load(std::memory_order_relaxed); }

 private:
  bool stopping() const { return stopping_->load(std::memory_order_acquire); }
  // After a direct open of export `export_id` (`size` bytes): a relay cabled
  // to this node and to `target` is asked for the same export (a fenceable
  // route); its grant joins the session's `handle` when it names that export.
  void AddTwoHop(uint64_t session, uint64_t handle, RemoteTarget target, pb::OpenRegionRequest req, uint64_t export_id,
                 uint64_t size);
  // The importer's end of a sealed route whose owner answered `resp` (its
  // signed answer checked) to the claim that carried `key`, over `carrier`'s links.
  absl::StatusOr<std::shared_ptr<seal::SealedLinks>> SealRoute(const std::string& destination, uint64_t nonce,
                                                               const seal::EphemeralKey& key,
                                                               const std::shared_ptr<Peer>& carrier,
                                                               const pb::OpenRegionResponse& resp);

  const Options options_;
  const Routing routing_;
  Connector* const connector_;
  HandleTable* const handles_;
  RemoteTransfers* const transfers_;
  const RouteSigner* const signer_;
  const KnownNodes* const known_;
  const std::atomic<bool>* const stopping_;
  std::atomic<uint64_t> routed_opens_{0};   // opens that went through relays
  std::atomic<uint64_t> sealed_routes_{0};  // routed opens this node sealed as the importer
};

}  // namespace podlink::mesh
