// End-to-end authentication of a request that crosses relays.
//
// Between neighbours the mesh trusts the TLS peer (its certificate names the
// node). A request a relay forwards comes from the relay, not from the node
// whose pod asked, so the importing node signs what it asks for (mesh.proto
// OriginClaim) with its own node key and sends its certificate along; the
// owner verifies both against the mesh CA before it believes anything the
// claim says.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace podlink::mesh {

inline constexpr size_t kMaxCertPem = 16 << 10;
inline constexpr size_t kMaxSignature = 1024;

// OpenSSL's last error as text, and its error queue cleared.
std::string OpenSslError();

// A SHA-256 signature of `data` by the PEM private key (EC or RSA).
absl::StatusOr<std::string> SignWithKey(const std::string& key_pem, absl::string_view data);

// Whether the PEM private key belongs to the first certificate of `cert_pem`.
bool KeyMatchesCertificate(const std::string& key_pem, absl::string_view cert_pem);

// The node a PEM certificate names, as the mesh's TLS does: its first DNS
// subject alternative name, else its common name.
absl::StatusOr<std::string> CertificateNode(absl::string_view cert_pem);

// OK when `cert_pem` (leaf first, intermediates after) chains to a CA of
// `ca_pem`, is valid now for client authentication, names `node`, and its key
// signed `data` with `signature`; PERMISSION_DENIED otherwise, saying why.
absl::Status VerifyNodeSignature(const std::string& ca_pem, absl::string_view cert_pem, const std::string& node,
                                 absl::string_view data, absl::string_view signature);

}  // namespace podlink::mesh
