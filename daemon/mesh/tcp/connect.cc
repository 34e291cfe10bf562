// The TCP transport's links to a peer: its data connections over every path,
// each dialed with a cookie from the peer's OpenLink.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

absl::Status MeshEngine::ConnectTcpLinks(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                                         const std::vector<Path>& paths, std::shared_ptr<pb::Mesh::Stub> stub,
                                         const pb::HelloResponse& hello, bool* verbs_failed) {
  Peer& p = *peer;
  const std::string endpoint = HostPort(paths.front().remote, target.port);
  auto deadline = [this] { return absl::ToChronoTime(absl::Now() + options_.connect_timeout); };
  uint32_t per_path = options_.connections_per_path;
  pb::OpenLinkResponse link;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    pb::OpenLinkRequest req;
    req.set_connections(static_cast<uint32_t>(std::min<size_t>(64, paths.size() * per_path)));
    // Where its connections come from: each path binds its own local address.
    for (const Path& path : paths) {
      if (path.fallback || req.sources_size() >= static_cast<int>(DataAdmission::kMaxClaimedSources)) continue;
      std::string local = path.local.AddressText();
      if (std::find(req.sources().begin(), req.sources().end(), local) == req.sources().end()) {
        req.add_sources(std::move(local));
      }
    }
    PODLINK_RETURN_IF_ERROR(FromGrpc(stub->OpenLink(&ctx, req, &link), target.node_name));
  }
  auto links = std::make_shared<PeerLinks>(target.node_name, options_.slice_bytes, options_.slices_in_flight,
                                           options_.answer_timeout, options_.tcp_zero_copy);
  int cookie = 0;
  absl::Status last;
  for (const Path& path : paths) {
    for (uint32_t i = 0; i < per_path && cookie < link.cookies_size(); ++i) {
      absl::StatusOr<UniqueFd> fd = DialData(path, link.data_port(), link.cookies(cookie++), links->instance(),
                                             options_.connect_timeout);
      if (fd.ok()) {
        links->AddConnection(*std::move(fd), PathName(path));
      } else {
        last = fd.status();
      }
    }
  }
  if (links->live() == 0) {
    return absl::UnavailableError(absl::StrCat("no data connection to node ", target.node_name, ": ", last.message()));
  }
  Log()->info("event=mesh_peer_connected node={} control={} paths={} connections={}", target.node_name, endpoint,
              paths.size(), links->live());
  // A connection that fails later is dialed again over its path.
  links->set_on_down(RepairOnDown(peer, links, paths, link.data_port()));
  p.set_stub(std::move(stub));
  p.instance.store(hello.instance(), std::memory_order_release);
  p.set_links(std::move(links));
  return absl::OkStatus();
}

}  // namespace podlink::mesh
