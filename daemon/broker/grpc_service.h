// The gRPC face of the broker: authenticates each call by its session
// credential and converts messages; no logic of its own.
#pragma once

#include "daemon/broker/broker.h"
#include "podlink/v1/podlink.grpc.pb.h"

namespace podlink {

class BrokerService final : public v1::Broker::CallbackService {
 public:
  // Out of line: the generated base registers a handler template per method, and a constructor or destructor in
  // the header would compile them all again in each file that makes a BrokerService (main.cc; measured in
  // docs/results/main-cc-compile-2026-12-03-local).
  explicit BrokerService(Broker* broker);
  ~BrokerService() override;

  grpc::ServerUnaryReactor* GetNodeInfo(grpc::CallbackServerContext* ctx, const v1::GetNodeInfoRequest* req,
                                        v1::NodeInfo* resp) override;
  grpc::ServerUnaryReactor* WhoAmI(grpc::CallbackServerContext* ctx, const v1::WhoAmIRequest* req,
                                   v1::WhoAmIResponse* resp) override;
  grpc::ServerUnaryReactor* Export(grpc::CallbackServerContext* ctx, const v1::ExportRequest* req,
                                   v1::ExportResponse* resp) override;
  grpc::ServerUnaryReactor* Import(grpc::CallbackServerContext* ctx, const v1::ImportRequest* req,
                                   v1::ImportResponse* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* req,
                                    v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const v1::ListRequest* req,
                                 v1::ListResponse* resp) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const v1::GetStatsRequest* req,
                                     v1::Stats* resp) override;
  grpc::ServerUnaryReactor* OpenRelay(grpc::CallbackServerContext* ctx, const v1::OpenRelayRequest* req,
                                      v1::OpenRelayResponse* resp) override;
  grpc::ServerUnaryReactor* GetMeshStatus(grpc::CallbackServerContext* ctx, const v1::GetMeshStatusRequest* req,
                                          v1::MeshStatus* resp) override;
  grpc::ServerUnaryReactor* OpenRemote(grpc::CallbackServerContext* ctx, const v1::OpenRemoteRequest* req,
                                       v1::OpenRemoteResponse* resp) override;
  grpc::ServerUnaryReactor* JoinNcclNative(grpc::CallbackServerContext* ctx, const v1::JoinNcclNativeRequest* req,
                                           v1::JoinNcclNativeResponse* resp) override;
  grpc::ServerUnaryReactor* SyncNcclIpc(grpc::CallbackServerContext* ctx, const v1::SyncNcclIpcRequest* req,
                                        v1::SyncNcclIpcResponse* resp) override;
  grpc::ServerWriteReactor<v1::Event>* Watch(grpc::CallbackServerContext* ctx,
                                             const v1::WatchRequest* req) override;

 private:
  Broker* const broker_;
};

}  // namespace podlink
