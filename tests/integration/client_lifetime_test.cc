// libpodlink's own resources over a session's life, against a fake podlinkd
// in the test process (a descriptor channel that greets with HELLO and a
// podlink.v1.Broker gRPC service), so the test decides when each message
// arrives.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/fd_channel.h"
#include "common/metadata_keys.h"
#include "common/unique_fd.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "podlink/client.h"
#include "podlink/v1/podlink.grpc.pb.h"

namespace podlink::testing {
namespace {

// Descriptors of this process that are memfds named `name`.
int OpenMemfds(const std::string& name) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("/memfd:" + name + " ", 0) == 0) ++n;
  }
  return n;
}

// Imports are answered with a fresh memfd named after the export id
// ("export-<id>"), delivered on the descriptor channel before the answer,
// as podlinkd does. An import of kLateExport is held until the client has
// given up on it (its deadline passed) and only then delivered and answered.
class FakeBroker final : public v1::Broker::Service {
 public:
  static constexpr uint64_t kLateExport = 13;
  static constexpr uint64_t kUnavailableExport = 14;  // answered UNAVAILABLE by the daemon itself

  void set_channel(int sock) {
    absl::MutexLock l(&mu_);
    sock_ = sock;
  }
  absl::Notification& late_delivered() { return late_delivered_; }

  grpc::Status Import(grpc::ServerContext* ctx, const v1::ImportRequest* req, v1::ImportResponse* resp) override {
    const uint64_t id = req->export_id();
    if (id == kUnavailableExport) {
      ctx->AddTrailingMetadata(kAnswerMetadataKey, "podlinkd");  // as podlinkd marks its answers
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "node node-b: connection refused (the daemon's own answer)");
    }
    if (id == kLateExport) {
      for (int i = 0; i < 2000 && !ctx->IsCancelled(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    const std::string name = "export-" + std::to_string(id);
    UniqueFd mem(::memfd_create(name.c_str(), MFD_CLOEXEC));
    if (!mem || ::ftruncate(mem.get(), 4096) != 0) return grpc::Status(grpc::StatusCode::INTERNAL, "memfd");
    FdMessage m;
    m.type = static_cast<uint16_t>(FdMsgType::kDeliver);
    m.a = id;
    {
      absl::MutexLock l(&mu_);
      m.seq = next_slot_++;
      if (!SendFdMessage(sock_, m, mem.get(), /*dontwait=*/true).ok()) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "could not deliver");
      }
    }
    if (id == kLateExport) late_delivered_.Notify();
    resp->mutable_export_()->set_export_id(id);
    resp->mutable_export_()->set_size(4096);
    resp->mutable_export_()->set_handle_type(v1::HANDLE_TYPE_HOST_MEMFD);
    resp->set_delivery_slot(m.seq);
    return grpc::Status::OK;
  }

 private:
  absl::Mutex mu_;  // protects the channel and the slot counter
  int sock_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t next_slot_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Notification late_delivered_;
};

// The fake daemon's sockets in a temporary directory; serves one client.
class FakeDaemon {
 public:
  FakeDaemon() {
    char tmpl[] = "/tmp/podlink-fake-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    listener_.Reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s/podlink.fd.sock", dir_.c_str());
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listener_.get(), 4), 0);
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + dir_ + "/podlink.sock", grpc::InsecureServerCredentials());
    b.RegisterService(&broker_);
    server_ = b.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    greeter_ = std::thread([this] {
      channel_.Reset(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      FdMessage hello;
      hello.type = static_cast<uint16_t>(FdMsgType::kHello);
      hello.seq = 1;
      hello.a = 0x1111;
      hello.b = 0x2222;
      EXPECT_TRUE(SendFdMessage(channel_.get(), hello, -1, false).ok());
      broker_.set_channel(channel_.get());
    });
  }
  ~FakeDaemon() {
    if (greeter_.joinable()) greeter_.join();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    std::filesystem::remove_all(dir_);
  }
  // Once the client is connected.
  void Greeted() { greeter_.join(); }
  // The RPC server goes away (podlinkd gone).
  void StopServer() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_.reset();
  }
  const std::string& dir() const { return dir_; }
  FakeBroker& broker() { return broker_; }

 private:
  std::string dir_;
  UniqueFd listener_, channel_;
  FakeBroker broker_;
  std::unique_ptr<grpc::Server> server_;
  std::thread greeter_;
};

// An import the client gave up on (its call timed out) is delivered later.
// Nobody will claim that descriptor: the client must not keep it open for
// the rest of its life, only until it has read deliveries for a while.
TEST(ClientLifetime, ADeliveryForAnImportThatTimedOutIsNotKept) {
  constexpr absl::Duration kTimeout = absl::Milliseconds(500);
  const std::string late = "export-" + std::to_string(FakeBroker::kLateExport);
  FakeDaemon fake;
  auto client = Client::Connect({.socket_dir = fake.dir(), .timeout = kTimeout});
  ASSERT_TRUE(client.ok()) << client.status();
  fake.Greeted();

  auto timed_out = (*client)->Import(FakeBroker::kLateExport);
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded) << timed_out.status();
  ASSERT_TRUE(fake.broker().late_delivered().WaitForNotificationWithTimeout(absl::Seconds(20)));

  // The next import reads the late delivery off the channel on the way to its own.
  {
    auto imp = (*client)->Import(1);
    ASSERT_TRUE(imp.ok()) << imp.status();
    EXPECT_EQ(imp->info().export_id, 1u);
    EXPECT_EQ(OpenMemfds("export-1"), 1);
  }
  // Long after any Import could still claim it, later deliveries come in.
  absl::SleepFor(3 * kTimeout);
  for (uint64_t id : {2, 3}) {
    auto imp = (*client)->Import(id);
    ASSERT_TRUE(imp.ok()) << imp.status();
    EXPECT_EQ(imp->info().export_id, id);
    EXPECT_EQ(OpenMemfds("export-" + std::to_string(id)), 1) << "the import's own descriptor";
  }
  EXPECT_EQ(OpenMemfds(late), 0) << "the client still holds the descriptor delivered for the import that timed out";
  EXPECT_EQ(OpenMemfds("export-1"), 0);
}

// UNAVAILABLE from podlinkd itself (another node unreachable, podlinkd
// stopping) comes through as podlinkd said it; only a daemon the client
// cannot reach is called unreachable.
TEST(ClientLifetime, OnlyADaemonThatCannotBeReachedIsCalledUnreachable) {
  FakeDaemon fake;
  auto client = Client::Connect({.socket_dir = fake.dir(), .timeout = absl::Seconds(5)});
  ASSERT_TRUE(client.ok()) << client.status();
  fake.Greeted();
  auto answered = (*client)->Import(FakeBroker::kUnavailableExport);
  EXPECT_EQ(answered.status().code(), absl::StatusCode::kUnavailable) << answered.status();
  EXPECT_NE(answered.status().message().find("node node-b: connection refused"), std::string::npos)
      << answered.status();
  EXPECT_EQ(answered.status().message().find("podlinkd unreachable"), std::string::npos) << answered.status();
  fake.StopServer();
  auto gone = (*client)->Import(1);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable) << gone.status();
  EXPECT_NE(gone.status().message().find("podlinkd unreachable"), std::string::npos) << gone.status();
}

}  // namespace
}  // namespace podlink::testing
