#include "daemon/mesh/trust/owner_answer.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "daemon/mesh/trust/origin_sign.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

absl::Status SignOwnerAnswer(const std::string& owner, const pb::OriginClaim& claim, const std::string& key_pem,
                             const std::string& cert_pem, pb::OpenRegionResponse* resp) {
  pb::OwnerAnswer a;
  a.set_owner(owner);
  a.set_origin(claim.origin());
  a.set_claim_nonce(claim.nonce());
  a.set_export_id(resp->export_id());
  a.set_size(resp->size());
  a.set_handle_type(resp->handle_type());
  a.set_owner_namespace(resp->owner_namespace());
  a.set_owner_name(resp->owner_name());
  a.set_seal_key(resp->seal_key());
  a.set_window_bytes(resp->window_bytes());
  a.SerializeToString(resp->mutable_owner_answer());
  PODLINK_ASSIGN_OR_RETURN(std::string sig, SignWithKey(key_pem, resp->owner_answer()));
  resp->set_owner_signature(std::move(sig));
  resp->set_owner_cert(cert_pem);
  return absl::OkStatus();
}

absl::Status CheckOwnerAnswer(const std::string& ca_pem, const std::string& destination, const std::string& origin,
                              uint64_t nonce, const pb::OpenRegionResponse& resp) {
  constexpr size_t kMaxAnswer = 4 << 10;
  auto refuse = [&](absl::string_view why) {
    return absl::PermissionDeniedError(absl::StrCat("the answer through the relays is not node ", destination,
                                                    "'s: ", why));
  };
  if (resp.owner_answer().empty() || resp.owner_signature().empty()) return refuse("it is not signed");
  if (resp.owner_answer().size() > kMaxAnswer || resp.owner_cert().size() > kMaxCertPem ||
      resp.owner_signature().size() > kMaxSignature) {
    return refuse("oversized");
  }
  if (absl::Status st =
          VerifyNodeSignature(ca_pem, resp.owner_cert(), destination, resp.owner_answer(), resp.owner_signature());
      !st.ok()) {
    return refuse(st.message());
  }
  pb::OwnerAnswer a;
  if (!a.ParseFromString(resp.owner_answer())) return refuse("it does not parse");
  if (a.owner() != destination || a.origin() != origin || a.claim_nonce() != nonce) {
    return refuse("it answers another request");
  }
  if (a.export_id() != resp.export_id() || a.size() != resp.size() || a.handle_type() != resp.handle_type() ||
      a.owner_namespace() != resp.owner_namespace() || a.owner_name() != resp.owner_name() ||
      a.seal_key() != resp.seal_key() || a.window_bytes() != resp.window_bytes()) {
    return refuse("a relay changed it");
  }
  return absl::OkStatus();
}

}  // namespace podlink::mesh
