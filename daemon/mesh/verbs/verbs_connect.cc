// The verbs transport's links to a peer: its queue pairs path by path
// (VerbsNode::Connect), and a path's failed queue pairs replaced.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

absl::Status MeshEngine::ConnectVerbsLinks(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                                           const std::vector<Path>& paths, std::shared_ptr<pb::Mesh::Stub> stub,
                                           const pb::HelloResponse& hello, bool* verbs_failed) {
  Peer& p = *peer;
  const std::string endpoint = HostPort(paths.front().remote, target.port);
  auto open = [&](const pb::OpenVerbsRequest& req) -> absl::StatusOr<pb::OpenVerbsResponse> {
    grpc::ClientContext ctx;
    // The owner may open its device and make QPs first: more than a
    // handshake (seconds on emulated soft-RoCE).
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout + absl::Seconds(25)));
    pb::OpenVerbsResponse resp;
    PODLINK_RETURN_IF_ERROR(FromGrpc(stub->OpenVerbs(&ctx, req, &resp), target.node_name));
    return resp;
  };
  absl::StatusOr<std::shared_ptr<verbs::VerbsLinks>> made = verbs_->Connect(target.node_name, paths, open);
  if (!made.ok()) {
    if (verbs_failed != nullptr) *verbs_failed = true;
    return made.status();
  }
  std::shared_ptr<verbs::VerbsLinks> vl = *std::move(made);
  // A path whose QPs all failed gets new ones in the background (the
  // owner drops the failed ones), while the other paths carry on.
  vl->set_on_path_down(RepairOnDown(peer, vl, paths));
  Log()->info("event=mesh_peer_connected node={} control={} transport=verbs paths={} qps={}", target.node_name,
              endpoint, paths.size(), vl->live());
  p.set_stub(std::move(stub));
  p.instance.store(hello.instance(), std::memory_order_release);
  p.set_links(std::move(vl));
  return absl::OkStatus();
}

// The verbs transport's repair: the path's queue pairs that failed by now are
// replaced by new ones the peer accepts (OpenVerbs), and named to it once.
std::function<void(const std::string&)> MeshEngine::RepairOnDown(const std::shared_ptr<Peer>& peer,
                                                                 const std::shared_ptr<verbs::VerbsLinks>& links,
                                                                 const std::vector<Path>& paths) {
  std::weak_ptr<verbs::VerbsLinks> weak = links;
  RedoPath redo = [this, weak](const Path& path, const std::string& name, Peer& peer,
                               pb::Mesh::Stub& stub) -> absl::Status {
    std::shared_ptr<verbs::VerbsLinks> vl = weak.lock();
    if (vl == nullptr) return absl::OkStatus();
    auto open = [&](const pb::OpenVerbsRequest& req) -> absl::StatusOr<pb::OpenVerbsResponse> {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout + absl::Seconds(25)));
      pb::OpenVerbsResponse resp;
      PODLINK_RETURN_IF_ERROR(FromGrpc(stub.OpenVerbs(&ctx, req, &resp), peer.node()));
      return resp;
    };
    // A path that cannot come back (cable still down) fails here and is
    // tried again with backoff; its old QPs are named once.
    std::vector<uint32_t> failed = vl->FailedRemoteQps(name);
    if (failed.empty()) return absl::OkStatus();  // an earlier repair replaced them
    PODLINK_RETURN_IF_ERROR(verbs_->ConnectPath(*vl, path, open, failed));
    vl->MarkReported(failed);
    return absl::OkStatus();
  };
  return RepairOnDownWith(peer, links, std::move(redo), paths);
}

}  // namespace podlink::mesh
