#include "daemon/broker/grpc_service.h"

#include <deque>

#include "common/status_util.h"
#include "daemon/broker/stream_reactor.h"

namespace podlink {
namespace {

absl::StatusOr<std::shared_ptr<Session>> SessionOf(Broker* broker, grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kSessionMetadataKey);
  absl::string_view cred = it == md.end() ? absl::string_view() : absl::string_view(it->second.data(), it->second.size());
  return broker->Authenticate(cred);
}

// Runs `fn(session)` and finishes the call with its status.
template <typename Fn>
grpc::ServerUnaryReactor* Unary(Broker* broker, grpc::CallbackServerContext* ctx, Fn fn) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  ctx->AddTrailingMetadata(kAnswerMetadataKey, "podlinkd");
  absl::StatusOr<std::shared_ptr<Session>> s = SessionOf(broker, ctx);
  r->Finish(ToGrpcStatus(s.ok() ? fn(**s) : s.status()));
  return r;
}

template <typename T>
absl::Status Assign(absl::StatusOr<T> v, T* out) {
  if (!v.ok()) return v.status();
  *out = *std::move(v);
  return absl::OkStatus();
}

// A Watch stream for the broker's events.
class WatchReactor : public QueuedWriteReactor<v1::Event>, public EventSink {
 public:
  void Push(const v1::Event& e) override { QueuedWriteReactor::Push(e); }
  void Close(const v1::Event& e) override { QueuedWriteReactor::Close(e); }
  bool done() const override { return finished(); }
};

}  // namespace

BrokerService::BrokerService(Broker* broker) : broker_(broker) {}
BrokerService::~BrokerService() = default;

grpc::ServerUnaryReactor* BrokerService::GetNodeInfo(grpc::CallbackServerContext* ctx,
                                                     const v1::GetNodeInfoRequest*, v1::NodeInfo* resp) {
  return Unary(broker_, ctx, [&](Session&) {
    *resp = broker_->GetNodeInfo();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* BrokerService::JoinNcclNative(grpc::CallbackServerContext* ctx,
                                                        const v1::JoinNcclNativeRequest*,
                                                        v1::JoinNcclNativeResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->JoinNcclNative(s), resp); });
}

grpc::ServerUnaryReactor* BrokerService::SyncNcclIpc(grpc::CallbackServerContext* ctx, const v1::SyncNcclIpcRequest*,
                                                     v1::SyncNcclIpcResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->SyncNcclIpc(s), resp); });
}

grpc::ServerUnaryReactor* BrokerService::WhoAmI(grpc::CallbackServerContext* ctx, const v1::WhoAmIRequest*,
                                                v1::WhoAmIResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) {
    *resp = broker_->WhoAmI(s);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* BrokerService::Export(grpc::CallbackServerContext* ctx, const v1::ExportRequest* req,
                                                v1::ExportResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->Export(s, *req), resp); });
}

grpc::ServerUnaryReactor* BrokerService::Import(grpc::CallbackServerContext* ctx, const v1::ImportRequest* req,
                                                v1::ImportResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->Import(s, *req), resp); });
}

grpc::ServerUnaryReactor* BrokerService::Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* req,
                                                 v1::ReleaseResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->Release(s, *req), resp); });
}

grpc::ServerUnaryReactor* BrokerService::List(grpc::CallbackServerContext* ctx, const v1::ListRequest* req,
                                              v1::ListResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->List(s, *req), resp); });
}

grpc::ServerUnaryReactor* BrokerService::GetStats(grpc::CallbackServerContext* ctx, const v1::GetStatsRequest*,
                                                  v1::Stats* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->GetStats(s), resp); });
}

grpc::ServerUnaryReactor* BrokerService::OpenRelay(grpc::CallbackServerContext* ctx, const v1::OpenRelayRequest* req,
                                                   v1::OpenRelayResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->OpenRelay(s, *req), resp); });
}

grpc::ServerUnaryReactor* BrokerService::GetMeshStatus(grpc::CallbackServerContext* ctx,
                                                       const v1::GetMeshStatusRequest*, v1::MeshStatus* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->GetMeshStatus(s), resp); });
}

grpc::ServerUnaryReactor* BrokerService::OpenRemote(grpc::CallbackServerContext* ctx,
                                                    const v1::OpenRemoteRequest* req, v1::OpenRemoteResponse* resp) {
  // Finished later, from the mesh thread that reached the other node.
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  ctx->AddTrailingMetadata(kAnswerMetadataKey, "podlinkd");
  absl::StatusOr<std::shared_ptr<Session>> s = SessionOf(broker_, ctx);
  if (!s.ok()) {
    r->Finish(ToGrpcStatus(s.status()));
    return r;
  }
  broker_->OpenRemote(**s, *req, [r, resp](absl::StatusOr<v1::OpenRemoteResponse> out) {
    r->Finish(ToGrpcStatus(Assign(std::move(out), resp)));
  });
  return r;
}

grpc::ServerWriteReactor<v1::Event>* BrokerService::Watch(grpc::CallbackServerContext* ctx,
                                                          const v1::WatchRequest*) {
  auto reactor = std::make_shared<WatchReactor>();
  reactor->Begin(reactor);  // kept alive by itself until OnDone
  absl::StatusOr<std::shared_ptr<Session>> s = SessionOf(broker_, ctx);
  absl::Status st = s.ok() ? broker_->AddWatcher(**s, reactor) : s.status();
  if (!st.ok()) reactor->FinishNow(ToGrpcStatus(st));
  return reactor.get();
}

}  // namespace podlink
