// The verbs transport's links to a peer: its queue pairs path by path
// (VerbsNode::Connect), and a path's failed queue pairs replaced.
#include "daemon/mesh/verbs/verbs_connect.h"

#include <grpcpp/grpcpp.h>

#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/tcp/sockets.h"

namespace podlink::mesh::verbs {

namespace {
const ComponentLog VerbsConnectLog("mesh");
}  // namespace

VerbsNode::OpenVerbsCall VerbsLinkMaker::OpenVerbsOver(pb::Mesh::Stub& stub, const std::string& node) const {
  return [this, &stub, node](const pb::OpenVerbsRequest& req) -> absl::StatusOr<pb::OpenVerbsResponse> {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + connect_timeout_ + absl::Seconds(25)));
    pb::OpenVerbsResponse resp;
    PODLINK_RETURN_IF_ERROR(FromGrpc(stub.OpenVerbs(&ctx, req, &resp), node));
    return resp;
  };
}

absl::Status VerbsLinkMaker::Connect(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                                     const std::vector<Path>& paths, std::shared_ptr<pb::Mesh::Stub> stub,
                                     const pb::HelloResponse& hello, bool* verbs_failed) {
  const std::string endpoint = HostPort(paths.front().remote, target.port);
  absl::StatusOr<std::shared_ptr<VerbsLinks>> made =
      node_->Connect(target.node_name, paths, OpenVerbsOver(*stub, target.node_name));
  if (!made.ok()) {
    if (verbs_failed != nullptr) *verbs_failed = true;
    return made.status();
  }
  std::shared_ptr<VerbsLinks> vl = *std::move(made);
  // A path whose QPs all failed gets new ones in the background (the
  // owner drops the failed ones), while the other paths carry on.
  vl->set_on_path_down(RepairOnDown(peer, vl, paths));
  VerbsConnectLog()->info("event=mesh_peer_connected node={} control={} transport=verbs paths={} qps={}",
                          target.node_name, endpoint, paths.size(), vl->live());
  peer->set_stub(std::move(stub));
  peer->instance.store(hello.instance(), std::memory_order_release);
  peer->set_links(std::move(vl));
  return absl::OkStatus();
}

// The path's queue pairs that failed by now are replaced by new ones the peer
// accepts (OpenVerbs), and named to it once.
std::function<void(const std::string&)> VerbsLinkMaker::RepairOnDown(const std::shared_ptr<Peer>& peer,
                                                                     const std::shared_ptr<VerbsLinks>& links,
                                                                     const std::vector<Path>& paths) {
  std::weak_ptr<VerbsLinks> weak = links;
  RedoPath redo = [this, weak](const Path& path, const std::string& name, Peer& peer,
                               pb::Mesh::Stub& stub) -> absl::Status {
    std::shared_ptr<VerbsLinks> vl = weak.lock();
    if (vl == nullptr) return absl::OkStatus();
    // A path that cannot come back (cable still down) fails here and is
    // tried again with backoff; its old QPs are named once.
    std::vector<uint32_t> failed = vl->FailedRemoteQps(name);
    if (failed.empty()) return absl::OkStatus();  // an earlier repair replaced them
    PODLINK_RETURN_IF_ERROR(node_->ConnectPath(*vl, path, OpenVerbsOver(stub, peer.node()), failed));
    vl->MarkReported(failed);
    return absl::OkStatus();
  };
  return RepairWithStub(*repairs_, peer, links, std::move(redo), paths);
}

}  // namespace podlink::mesh::verbs
