// The origin's side of an open through relays (the importer's room):
// - the route's claim (mesh.proto OriginClaim: who asks, for what, from whom,
//   through which relays, when, a fresh nonce and an ephemeral seal key),
//   signed with this node's key, its certificate alongside (SignRoute);
// - the owner's answer checked before anything is believed of it: signed by
//   the destination named, for this claim's nonce, with a window of this
//   version's size; then the importer's end of the sealed route over the
//   carrier's links (SealRoute).
// Whatever the relays did on the way, a route that passes carries only what
// origin and owner can read (seal/window.h). No lock of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/control/credentials.h"
#include "daemon/mesh/seal/seal_crypto.h"
#include "daemon/mesh/seal/window.h"
#include "podlink/mesh/v1/mesh.pb.h"

namespace podlink::mesh {

class RouteSigner {
 public:
  // `credentials` outlives this (the engine's).
  RouteSigner(std::string node_name, const NodeCredentials* credentials)
      : node_name_(std::move(node_name)), credentials_(*credentials) {}

  // Signs `req`'s route to `target` through `via` (the claim's nonce in
  // *nonce, never 0; `fenceable`: the owner lands it so that FenceRoute can
  // stop it). The claim carries a new ephemeral seal key (its private half in
  // *key).
  absl::Status SignRoute(const RemoteTarget& target, const std::vector<std::string>& via,
                         podlink::mesh::v1::OpenRegionRequest* req, uint64_t* nonce,
                         std::shared_ptr<seal::EphemeralKey>* key, bool fenceable = false) const;
  // The importer's end of the sealed route whose owner `destination`
  // answered `resp` to the claim of `nonce` that carried `key`; its units go
  // over `carrier`'s links, its completions are run through `defer`.
  // PERMISSION_DENIED when the answer is not the destination's own for this
  // claim, unchanged.
  absl::StatusOr<std::shared_ptr<seal::SealedLinks>> SealRoute(const std::string& destination, uint64_t nonce,
                                                               const seal::EphemeralKey& key,
                                                               seal::SealedLinks::Carrier carrier,
                                                               seal::SealedLinks::Defer defer,
                                                               const podlink::mesh::v1::OpenRegionResponse& resp) const;

 private:
  const std::string node_name_;
  const NodeCredentials& credentials_;
};

}  // namespace podlink::mesh
