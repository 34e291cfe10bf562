// Grants held from a peer, given back.
#include "daemon/mesh/control/peer.h"

#include <chrono>

#include <grpcpp/grpcpp.h>

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

}  // namespace podlink::mesh
