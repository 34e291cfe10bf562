// The mesh's control service (daemon/mesh/control/control_service.h) as a caller without a node certificate sees
// it: every call (Hello, OpenLink, OpenRegion, OpenVerbs, FenceRoute, CloseRegion) is refused UNAUTHENTICATED
// before it reaches any room. The rooms here are absent (null): a call that reached one would crash the test.
#include "daemon/mesh/control/control_service.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace podlink::mesh {
namespace {

namespace pb = podlink::mesh::v1;

class NoCertificate : public ::testing::Test {
 protected:
  NoCertificate() : service_(ControlService::Options{.node_name = "node-a", .instance = 7, .data_port = 7447}, {}) {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    stub_ =
        pb::Mesh::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  ~NoCertificate() override { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }

  // A context that gives up after 10 s (no unbounded wait).
  static std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }
  static void ExpectRefused(const grpc::Status& st, const char* call) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << call << ": " << st.error_message();
    EXPECT_NE(st.error_message().find("node certificate"), std::string::npos) << call << ": " << st.error_message();
  }

  ControlService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::Mesh::Stub> stub_;
};

TEST_F(NoCertificate, EveryCallIsRefusedBeforeItReachesARoom) {
  {
    pb::HelloRequest req;
    req.set_instance(99);
    req.add_adverts()->set_entry("forged");
    pb::HelloResponse resp;
    ExpectRefused(stub_->Hello(Ctx().get(), req, &resp), "Hello");
    EXPECT_TRUE(resp.node_name().empty());  // nothing of this node is said
  }
  {
    pb::OpenLinkRequest req;
    req.set_connections(64);
    pb::OpenLinkResponse resp;
    ExpectRefused(stub_->OpenLink(Ctx().get(), req, &resp), "OpenLink");
    EXPECT_EQ(resp.cookies_size(), 0);
  }
  {
    pb::OpenRegionRequest req;
    req.mutable_importer()->set_node("node-b");
    req.set_export_id(1);
    pb::OpenRegionResponse resp;
    ExpectRefused(stub_->OpenRegion(Ctx().get(), req, &resp), "OpenRegion");
    EXPECT_EQ(resp.grant(), 0u);
  }
  {
    pb::OpenVerbsRequest req;
    pb::OpenVerbsResponse resp;
    ExpectRefused(stub_->OpenVerbs(Ctx().get(), req, &resp), "OpenVerbs");
  }
  {
    pb::FenceRouteRequest req;
    req.set_nonce(5);
    pb::FenceRouteResponse resp;
    ExpectRefused(stub_->FenceRoute(Ctx().get(), req, &resp), "FenceRoute");
  }
  {
    pb::CloseRegionRequest req;
    req.set_grant(1);
    pb::CloseRegionResponse resp;
    ExpectRefused(stub_->CloseRegion(Ctx().get(), req, &resp), "CloseRegion");
  }
}

}  // namespace
}  // namespace podlink::mesh
