// The mesh's control service (internal to the engine): authenticates by the
// TLS peer and calls the engine.
#pragma once

#include "daemon/mesh/engine_util.h"

namespace podlink::mesh {

class MeshEngine::Service final : public pb::Mesh::CallbackService {
 public:
  explicit Service(MeshEngine* e) : e_(e) {}

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* ctx, const pb::HelloRequest* req,
                                  pb::HelloResponse* resp) override {
    return Run(ctx, [&](const std::string& node) {
      if (node != e_->node_name_) e_->adverts_->SawNeighbour(node, SourceOfGrpcPeer(ctx->peer()));
      if (node != e_->node_name_) e_->owner_->SeenInstance(node, req->instance());
      if (node != e_->node_name_) e_->adverts_->Accept(node, req->adverts());
      e_->adverts_->AddTo(resp->mutable_adverts());
      resp->set_node_name(e_->node_name_);
      resp->set_version(PODLINK_VERSION);
      resp->set_instance(e_->instance_);
      resp->set_data_port(e_->data_port_);
      for (const std::string& a : e_->AdvertisedAddresses()) resp->add_addresses(a);
      resp->set_control_port(e_->control_port_);
      for (pb::LinkInfo& l : e_->LocalLinks()) *resp->add_links() = std::move(l);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* OpenLink(grpc::CallbackServerContext* ctx, const pb::OpenLinkRequest* req,
                                     pb::OpenLinkResponse* resp) override {
    return Run(ctx, [&](const std::string& node) -> absl::Status {
      PODLINK_ASSIGN_OR_RETURN(std::vector<std::string> cookies,
                               e_->admission_.IssueCookies(node, req->connections(), SourceOfGrpcPeer(ctx->peer()),
                                                {req->sources().begin(), req->sources().end()}));
      for (auto& c : cookies) resp->add_cookies(std::move(c));
      resp->set_data_port(e_->data_port_);
      resp->set_instance(e_->instance_);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* OpenRegion(grpc::CallbackServerContext* ctx, const pb::OpenRegionRequest* req,
                                       pb::OpenRegionResponse* resp) override {
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
    const bool peer = *node != e_->node_name_;
    if (peer) e_->liveness_.BeginCall(*node);
    e_->owner_->OpenRegionFor(*node, *req, [answer, e = e_, peer, n = *node](absl::StatusOr<pb::OpenRegionResponse> out) {
      if (answer->done) return;
      answer->done = true;
      if (peer) e->liveness_.EndCall(n);
      if (out.ok()) *answer->resp = *std::move(out);
      answer->r->Finish(ToGrpcStatus(out.status()));
    });
    return r;
  }
  grpc::ServerUnaryReactor* OpenVerbs(grpc::CallbackServerContext* ctx, const pb::OpenVerbsRequest* req,
                                      pb::OpenVerbsResponse* resp) override {
    return Run(ctx, [&](const std::string& node) -> absl::Status {
      PODLINK_ASSIGN_OR_RETURN(*resp, e_->verbs_->Accept(node, *req, e_->advertised_));
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* FenceRoute(grpc::CallbackServerContext* ctx, const pb::FenceRouteRequest* req,
                                       pb::FenceRouteResponse* resp) override {
    return Run(ctx, [&](const std::string& node) -> absl::Status {
      PODLINK_ASSIGN_OR_RETURN(uint32_t closed, e_->owner_->FenceRoute(node, req->nonce()));
      resp->set_grants_closed(closed);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* CloseRegion(grpc::CallbackServerContext* ctx, const pb::CloseRegionRequest* req,
                                        pb::CloseRegionResponse*) override {
    return Run(ctx, [&](const std::string& node) {
      e_->owner_->CloseRegion(node, req->grant());
      return absl::OkStatus();
    });
  }

 private:
  // The peer's node name: the identity of its verified certificate.
  static absl::StatusOr<std::string> PeerNode(grpc::CallbackServerContext* ctx) {
    std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
    std::vector<grpc::string_ref> ids;
    if (auth != nullptr && auth->IsPeerAuthenticated()) ids = auth->GetPeerIdentity();
    if (ids.empty()) return absl::UnauthenticatedError("mesh peers must present a node certificate");
    // A certificate names exactly one node (its first SAN, else its CN).
    return std::string(ids.front().data(), ids.front().size());
  }
  template <typename F>
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, F&& f) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    absl::StatusOr<std::string> node = PeerNode(ctx);
    // Alive for as long as a call that may take long (an owner registering
    // memory for RDMA) runs, while its keepalives may wait behind it.
    const bool peer = node.ok() && *node != e_->node_name_;
    if (peer) e_->liveness_.BeginCall(*node);
    absl::Status st = node.ok() ? f(*node) : node.status();
    if (peer) e_->liveness_.EndCall(*node);
    r->Finish(ToGrpcStatus(st));
    return r;
  }
  MeshEngine* const e_;
};

}  // namespace podlink::mesh
