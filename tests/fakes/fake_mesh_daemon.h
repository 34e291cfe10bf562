// A stand-in for another node's podlinkd as the importing side talks to it: the
// Mesh gRPC service on loopback without TLS (the tests make its stubs), with the
// answers a test sets, and a record of what it was asked. For the control
// room's connector and the importer's opener without an engine (tests/unit/).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"

namespace podlink::testing {

class FakeMeshDaemon final : public podlink::mesh::v1::Mesh::Service {
 public:
  using HelloResponse = podlink::mesh::v1::HelloResponse;
  using OpenRegionRequest = podlink::mesh::v1::OpenRegionRequest;
  using OpenRegionResponse = podlink::mesh::v1::OpenRegionResponse;

  // Serves on 127.0.0.1, answering Hello as `node`.
  explicit FakeMeshDaemon(std::string node) {
    hello_.set_node_name(std::move(node));
    hello_.set_instance(0x5eed);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeMeshDaemon() override { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }

  uint32_t port() const { return static_cast<uint32_t>(port_); }
  // What Hello answers from now on.
  void AnswerHello(HelloResponse hello) {
    absl::MutexLock l(&mu_);
    hello_ = std::move(hello);
  }
  HelloResponse hello() const {
    absl::MutexLock l(&mu_);
    return hello_;
  }
  // What OpenRegion answers from now on (a status other than OK: that error).
  void AnswerOpen(OpenRegionResponse resp, grpc::Status st = grpc::Status::OK) {
    absl::MutexLock l(&mu_);
    open_ = std::move(resp);
    open_status_ = std::move(st);
  }
  int hellos() const {
    absl::MutexLock l(&mu_);
    return hellos_;
  }
  std::vector<OpenRegionRequest> opens() const {
    absl::MutexLock l(&mu_);
    return opens_;
  }
  // Waits (at most `within`) until CloseRegion was asked for `grant`.
  bool WaitClosed(uint64_t grant, absl::Duration within = absl::Seconds(10)) const {
    absl::MutexLock l(&mu_);
    auto closed = [this, grant]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (uint64_t g : closed_) {
        if (g == grant) return true;
      }
      return false;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&closed), within);
  }
  std::vector<uint64_t> closed() const {
    absl::MutexLock l(&mu_);
    return closed_;
  }

  grpc::Status Hello(grpc::ServerContext*, const podlink::mesh::v1::HelloRequest*, HelloResponse* resp) override {
    absl::MutexLock l(&mu_);
    ++hellos_;
    *resp = hello_;
    return grpc::Status::OK;
  }
  grpc::Status OpenRegion(grpc::ServerContext*, const OpenRegionRequest* req, OpenRegionResponse* resp) override {
    absl::MutexLock l(&mu_);
    opens_.push_back(*req);
    *resp = open_;
    return open_status_;
  }
  grpc::Status CloseRegion(grpc::ServerContext*, const podlink::mesh::v1::CloseRegionRequest* req,
                           podlink::mesh::v1::CloseRegionResponse*) override {
    absl::MutexLock l(&mu_);
    closed_.push_back(req->grant());
    return grpc::Status::OK;
  }

 private:
  mutable absl::Mutex mu_;
  HelloResponse hello_ ABSL_GUARDED_BY(mu_);
  OpenRegionResponse open_ ABSL_GUARDED_BY(mu_);
  grpc::Status open_status_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
  int hellos_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<OpenRegionRequest> opens_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> closed_ ABSL_GUARDED_BY(mu_);
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace podlink::testing
