// The origin's side of an open through relays: the route's claim signed,
// and the owner's signed answer checked before the sealed route is made.
#include "daemon/mesh/importer/routed.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_util.h"
#include "daemon/mesh/links/random.h"
#include "daemon/mesh/trust/origin_sign.h"
#include "daemon/mesh/trust/owner_answer.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

absl::Status RouteSigner::SignRoute(const RemoteTarget& target, const std::vector<std::string>& via,
                                    pb::OpenRegionRequest* req, uint64_t* nonce,
                                    std::shared_ptr<seal::EphemeralKey>* key, bool fenceable) const {
  pb::OriginClaim claim;
  claim.set_origin(node_name_);
  *claim.mutable_importer() = req->importer();
  claim.mutable_destination()->set_node(target.node_name);
  for (const std::string& a : target.addresses) claim.mutable_destination()->add_addresses(a);
  claim.mutable_destination()->set_port(target.port);
  for (const std::string& v : via) claim.add_via(v);
  if (!target.name.empty()) {
    claim.set_name(target.name);
  } else {
    claim.set_export_id(target.export_id);
  }
  claim.set_issued_unix_seconds(absl::ToUnixSeconds(absl::Now()));
  do {
    *nonce = RandomU64();
  } while (*nonce == 0);
  claim.set_nonce(*nonce);
  claim.set_fenceable(fenceable);
  PODLINK_ASSIGN_OR_RETURN(seal::EphemeralKey mine, seal::EphemeralKey::Generate());
  claim.set_seal_key(mine.public_key());
  *key = std::make_shared<seal::EphemeralKey>(std::move(mine));
  pb::Route* route = req->mutable_route();
  claim.SerializeToString(route->mutable_claim());
  const NodeCredentials::Pems pems = credentials_.Current();
  PODLINK_ASSIGN_OR_RETURN(std::string sig, SignWithKey(pems.key, route->claim()));
  route->set_signature(std::move(sig));
  route->set_origin_cert(pems.cert);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<seal::SealedLinks>> RouteSigner::SealRoute(
    const std::string& destination, uint64_t nonce, const seal::EphemeralKey& key, seal::SealedLinks::Carrier carrier,
    seal::SealedLinks::Defer defer, const pb::OpenRegionResponse& resp) const {
  // The owner's answer, signed: its seal key and window are its own.
  PODLINK_RETURN_IF_ERROR(CheckOwnerAnswer(credentials_.Current().ca, destination, node_name_, nonce, resp));
  if (resp.window_bytes() != seal::kWindowBytes) {
    return absl::FailedPreconditionError(absl::StrCat("node ", destination, " seals routes with a window of ",
                                                      resp.window_bytes(), " bytes, this node with ",
                                                      seal::kWindowBytes, " (podlinkd versions differ)"));
  }
  PODLINK_ASSIGN_OR_RETURN(seal::Key shared, key.Agree(resp.seal_key()));
  PODLINK_ASSIGN_OR_RETURN(seal::SealKeys keys, seal::DeriveSealKeys(shared, nonce, node_name_, destination,
                                                                     key.public_key(), resp.seal_key()));
  return std::make_shared<seal::SealedLinks>(keys, resp.grant(), resp.size(), std::move(carrier), std::move(defer));
}

}  // namespace podlink::mesh
