// Grants held from a peer, given back, and a peer's answers translated.
#include "daemon/mesh/control/peer.h"

#include <chrono>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace podlink::mesh {

void ReleaseRemoteGrant(Peer* peer, uint64_t grant) {
  if (std::shared_ptr<DataLinks> links = peer->links()) links->DropRegion(grant);
  (void)peer->Post([peer, grant] {
    std::shared_ptr<pb::Mesh::Stub> stub = peer->stub();
    if (stub == nullptr) return;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::CloseRegionRequest req;
    req.set_grant(grant);
    pb::CloseRegionResponse ignored;
    (void)stub->CloseRegion(&ctx, req, &ignored);
  });
}

std::shared_ptr<pb::Mesh::Stub> NewMeshStub(
    const std::shared_ptr<grpc::experimental::CertificateProviderInterface>& certs, const std::string& node,
    const std::string& endpoint) {
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(certs);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  // The certificate must name the node we mean (the target name below).
  tls.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(node);
  return pb::Mesh::NewStub(grpc::CreateCustomChannel(endpoint, grpc::experimental::TlsCredentials(tls), args));
}

absl::Status FromGrpc(const grpc::Status& s, const std::string& node) {
  absl::Status st = FromGrpcStatus(s);
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("node ", node, ": ", st.message()));
}

bool RelayCannotStage(const absl::Status& st) {
  return st.code() == absl::StatusCode::kFailedPrecondition &&
         (absl::StrContains(st.message(), kRelayCannotStage) ||
          absl::StrContains(st.message(), "relayed regions ride TCP links"));
}

}  // namespace podlink::mesh
