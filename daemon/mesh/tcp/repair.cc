// The TCP transport's repair: a connection that failed is dialed again over
// its path with a fresh cookie from the peer.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

std::function<void(const std::string&)> MeshEngine::RepairOnDown(const std::shared_ptr<Peer>& peer,
                                                                 const std::shared_ptr<PeerLinks>& links,
                                                                 const std::vector<Path>& paths, uint32_t data_port) {
  std::weak_ptr<PeerLinks> weak = links;
  RedoPath redo = [this, weak, data_port](const Path& path, const std::string& name, Peer& peer,
                                         pb::Mesh::Stub& stub) -> absl::Status {
    std::shared_ptr<PeerLinks> links = weak.lock();
    if (links == nullptr) return absl::OkStatus();
    pb::OpenLinkResponse link;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    pb::OpenLinkRequest req;
    req.set_connections(1);
    PODLINK_RETURN_IF_ERROR(FromGrpc(stub.OpenLink(&ctx, req, &link), peer.node()));
    if (link.cookies_size() != 1) return absl::UnavailableError("OpenLink returned no cookie");
    PODLINK_ASSIGN_OR_RETURN(UniqueFd fd,
                             DialData(path, data_port, link.cookies(0), links->instance(), absl::Seconds(2)));
    links->AddConnection(std::move(fd), name);
    return absl::OkStatus();
  };
  return RepairOnDownWith(peer, links, std::move(redo), paths);
}

}  // namespace podlink::mesh
