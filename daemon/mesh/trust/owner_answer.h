// The owner's word on an open that crossed relays (mesh.proto OwnerAnswer).
//
// The origin signs what it asks for (origin_sign.h, OriginClaim); the owner
// answers in its own name: what the importer relies on (owner, origin, the
// claim's nonce, export, size, handle type, owning pod), signed with the
// owner's node key, with its certificate. The relays pass it on unchanged,
// and the origin believes the grant only when the answer is the destination's
// and bound to its own claim: a relay can neither answer in the owner's place
// nor change what the owner said.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "podlink/mesh/v1/mesh.pb.h"

namespace podlink::mesh {

// Fills resp's owner_answer, owner_signature and owner_cert from resp's own
// fields and `claim`, as node `owner` with its PEM key and certificate.
absl::Status SignOwnerAnswer(const std::string& owner, const podlink::mesh::v1::OriginClaim& claim,
                             const std::string& key_pem, const std::string& cert_pem,
                             podlink::mesh::v1::OpenRegionResponse* resp);

// OK when resp carries an answer of `destination` (certificate from the CA
// of `ca_pem`, signature over the answer) to `origin`'s claim `nonce`, saying
// what resp says; PERMISSION_DENIED otherwise, with why.
absl::Status CheckOwnerAnswer(const std::string& ca_pem, const std::string& destination, const std::string& origin,
                              uint64_t nonce, const podlink::mesh::v1::OpenRegionResponse& resp);

}  // namespace podlink::mesh
