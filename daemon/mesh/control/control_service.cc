// The mesh's control service (control_service.h): each call authenticated by
// its TLS peer and handed to its room.
#include "daemon/mesh/control/control_service.h"

#include <memory>

#include "common/status_util.h"
#include "daemon/mesh/tcp/sockets.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

grpc::ServerUnaryReactor* ControlService::Hello(grpc::CallbackServerContext* ctx, const pb::HelloRequest* req,
                                                pb::HelloResponse* resp) {
  return Run(ctx, [&](const std::string& node) {
    if (node != options_.node_name) {
      rooms_.adverts->SawNeighbour(node, SourceOfGrpcPeer(ctx->peer()));
      rooms_.owner->SeenInstance(node, req->instance());
      rooms_.adverts->Accept(node, req->adverts());
    }
    rooms_.adverts->AddTo(resp->mutable_adverts());
    resp->set_node_name(options_.node_name);
    resp->set_version(PODLINK_VERSION);
    resp->set_instance(options_.instance);
    resp->set_data_port(options_.data_port);
    rooms_.describe(resp);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ControlService::OpenLink(grpc::CallbackServerContext* ctx, const pb::OpenLinkRequest* req,
                                                   pb::OpenLinkResponse* resp) {
  return Run(ctx, [&](const std::string& node) -> absl::Status {
    PODLINK_ASSIGN_OR_RETURN(std::vector<std::string> cookies,
                             rooms_.admission->IssueCookies(node, req->connections(), SourceOfGrpcPeer(ctx->peer()),
                                                            {req->sources().begin(), req->sources().end()}));
    for (auto& c : cookies) resp->add_cookies(std::move(c));
    resp->set_data_port(options_.data_port);
    resp->set_instance(options_.instance);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ControlService::OpenRegion(grpc::CallbackServerContext* ctx, const pb::OpenRegionRequest* req,
                                                     pb::OpenRegionResponse* resp) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  absl::StatusOr<std::string> node = PeerNode(ctx);
  if (!node.ok()) {
    r->Finish(ToGrpcStatus(node.status()));
    return r;
  }
  // A relayed open is answered later, from a mesh thread; if its task is
  // dropped (the engine stopping), the answer's owner still finishes it.
  struct Answer {
    Answer(grpc::ServerUnaryReactor* r, pb::OpenRegionResponse* resp) : r(r), resp(resp) {}
    Answer(const Answer&) = delete;
    Answer& operator=(const Answer&) = delete;
    ~Answer() {
      if (!done) r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is stopping"));
    }
    grpc::ServerUnaryReactor* const r;
    pb::OpenRegionResponse* const resp;
    bool done = false;
  };
  auto answer = std::make_shared<Answer>(r, resp);
  // In flight until answered (a relayed open waits on the next hop).
  const bool peer = *node != options_.node_name;
  if (peer) rooms_.liveness->BeginCall(*node);
  rooms_.owner->OpenRegionFor(
      *node, *req, [answer, liveness = rooms_.liveness, peer, n = *node](absl::StatusOr<pb::OpenRegionResponse> out) {
        if (answer->done) return;
        answer->done = true;
        if (peer) liveness->EndCall(n);
        if (out.ok()) *answer->resp = *std::move(out);
        answer->r->Finish(ToGrpcStatus(out.status()));
      });
  return r;
}

grpc::ServerUnaryReactor* ControlService::OpenVerbs(grpc::CallbackServerContext* ctx, const pb::OpenVerbsRequest* req,
                                                    pb::OpenVerbsResponse* resp) {
  return Run(ctx, [&](const std::string& node) -> absl::Status {
    PODLINK_ASSIGN_OR_RETURN(*resp, rooms_.verbs->Accept(node, *req, options_.advertised));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ControlService::FenceRoute(grpc::CallbackServerContext* ctx, const pb::FenceRouteRequest* req,
                                                     pb::FenceRouteResponse* resp) {
  return Run(ctx, [&](const std::string& node) -> absl::Status {
    PODLINK_ASSIGN_OR_RETURN(uint32_t closed, rooms_.owner->FenceRoute(node, req->nonce()));
    resp->set_grants_closed(closed);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ControlService::CloseRegion(grpc::CallbackServerContext* ctx,
                                                      const pb::CloseRegionRequest* req, pb::CloseRegionResponse*) {
  return Run(ctx, [&](const std::string& node) {
    rooms_.owner->CloseRegion(node, req->grant());
    return absl::OkStatus();
  });
}

absl::StatusOr<std::string> ControlService::PeerNode(grpc::CallbackServerContext* ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  std::vector<grpc::string_ref> ids;
  if (auth != nullptr && auth->IsPeerAuthenticated()) ids = auth->GetPeerIdentity();
  if (ids.empty()) return absl::UnauthenticatedError("mesh peers must present a node certificate");
  // A certificate names exactly one node (its first SAN, else its CN).
  return std::string(ids.front().data(), ids.front().size());
}

grpc::ServerUnaryReactor* ControlService::Run(grpc::CallbackServerContext* ctx,
                                              const std::function<absl::Status(const std::string& node)>& f) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  absl::StatusOr<std::string> node = PeerNode(ctx);
  // Alive for as long as a call that may take long (an owner registering
  // memory for RDMA) runs, while its keepalives may wait behind it.
  const bool peer = node.ok() && *node != options_.node_name;
  if (peer) rooms_.liveness->BeginCall(*node);
  absl::Status st = node.ok() ? f(*node) : node.status();
  if (peer) rooms_.liveness->EndCall(*node);
  r->Finish(ToGrpcStatus(st));
  return r;
}

}  // namespace podlink::mesh
