// The device plugin against a test kubelet: registration, ListAndWatch with
// health that goes bad and recovers, Allocate, GetPreferredAllocation, and
// re-registration after the plugin's socket is removed or kubelet restarts.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "daemon/deviceplugin/device_plugin.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace podlink {
namespace {

using namespace std::chrono_literals;

// A kubelet's Registration service on <dir>/kubelet.sock.
class TestKubelet final : public v1beta1::Registration::Service {
 public:
  explicit TestKubelet(const std::string& dir) : dir_(dir) { Start(); }
  ~TestKubelet() { Stop(); }
  void Start() {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + dir_ + "/kubelet.sock", grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  void Stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + 1s);
    server_.reset();
    ::unlink((dir_ + "/kubelet.sock").c_str());
  }
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* req, v1beta1::Empty*) override {
    std::lock_guard<std::mutex> l(mu_);
    requests_.push_back(*req);
    if (refuse_) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "resource name podlink.io/peer taken");
    return grpc::Status::OK;
  }
  void Refuse(bool r) {
    std::lock_guard<std::mutex> l(mu_);
    refuse_ = r;
  }
  std::vector<v1beta1::RegisterRequest> Requests() {
    std::lock_guard<std::mutex> l(mu_);
    return requests_;
  }
  bool WaitFor(size_t n) {
    for (int i = 0; i < 300; ++i) {
      if (Requests().size() >= n) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

 private:
  std::string dir_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<v1beta1::RegisterRequest> requests_;
  bool refuse_ = false;
};

class DevicePluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/podlink-dp-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    kubelet_ = std::make_unique<TestKubelet>(dir_);
    DevicePluginConfig c;
    c.dir = dir_;
    c.devices = 8;
    c.host_socket_dir = "/run/podlink";
    c.host_lib_dir = "/opt/podlink/lib";
    c.check_interval = absl::Milliseconds(20);
    auto p = DevicePlugin::Start(c, [this](std::string* why) {
      if (!healthy_) *why = "test says unhealthy";
      return healthy_.load();
    });
    ASSERT_TRUE(p.ok()) << p.status();
    plugin_ = *std::move(p);
  }
  void TearDown() override {
    plugin_.reset();
    kubelet_.reset();
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!system(cmd.c_str());
  }
  std::unique_ptr<v1beta1::DevicePlugin::Stub> Stub() {
    return v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix:" + dir_ + "/podlink.sock", grpc::InsecureChannelCredentials()));
  }

  std::string dir_;
  std::atomic<bool> healthy_{true};
  std::unique_ptr<TestKubelet> kubelet_;
  std::unique_ptr<DevicePlugin> plugin_;
};

TEST_F(DevicePluginTest, RegistersWithKubelet) {
  ASSERT_TRUE(kubelet_->WaitFor(1));
  auto r = kubelet_->Requests()[0];
  EXPECT_EQ(r.version(), "v1beta1");
  EXPECT_EQ(r.endpoint(), "podlink.sock");
  EXPECT_EQ(r.resource_name(), "podlink.io/peer");
  EXPECT_TRUE(r.options().get_preferred_allocation_available());
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/podlink.sock").c_str(), &st), 0);  // served before registering
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  auto stub = Stub();
  grpc::ClientContext ctx;
  v1beta1::DevicePluginOptions opts;
  ASSERT_TRUE(stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &opts).ok());
  EXPECT_FALSE(opts.pre_start_required());
  EXPECT_TRUE(opts.get_preferred_allocation_available());
}

TEST_F(DevicePluginTest, ListAndWatchFollowsHealthBothWays) {
  ASSERT_TRUE(kubelet_->WaitFor(1));
  auto stub = Stub();
  grpc::ClientContext ctx;
  auto reader = stub->ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse r;
  ASSERT_TRUE(reader->Read(&r));
  ASSERT_EQ(r.devices_size(), 8);
  EXPECT_EQ(r.devices(0).id(), "podlink-peer-0");
  for (const auto& d : r.devices()) EXPECT_EQ(d.health(), "Healthy");
  healthy_ = false;
  ASSERT_TRUE(reader->Read(&r));
  for (const auto& d : r.devices()) EXPECT_EQ(d.health(), "Unhealthy");
  healthy_ = true;  // recoverable, not one-way
  ASSERT_TRUE(reader->Read(&r));
  for (const auto& d : r.devices()) EXPECT_EQ(d.health(), "Healthy");
  ctx.TryCancel();
}

TEST_F(DevicePluginTest, AllocateMountsSocketAndLibraryAndSetsEnvironment) {
  ASSERT_TRUE(kubelet_->WaitFor(1));
  auto stub = Stub();
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("podlink-peer-3");
  auto* two = req.add_container_requests();
  two->add_devices_ids("podlink-peer-1");
  two->add_devices_ids("podlink-peer-2");
  v1beta1::AllocateResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Allocate(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 2);
  const auto& c = resp.container_responses(0);
  ASSERT_EQ(c.mounts_size(), 2);
  EXPECT_EQ(c.mounts(0).host_path(), "/run/podlink");
  EXPECT_EQ(c.mounts(0).container_path(), "/run/podlink");
  EXPECT_FALSE(c.mounts(0).read_only());
  EXPECT_EQ(c.mounts(1).host_path(), "/opt/podlink/lib");
  EXPECT_TRUE(c.mounts(1).read_only());
  EXPECT_EQ(c.envs().at("PODLINK_SOCKET_DIR"), "/run/podlink");
  EXPECT_EQ(c.envs().at("NCCL_NET_PLUGIN"), "/usr/local/podlink/lib/libnccl-net-podlink.so");
  // NCCL reads this one before it loads the plugin: only the allocation can set it. Settings NCCL reads
  // later are the plugin's to choose (relay or native mode), so the allocation leaves them alone.
  EXPECT_EQ(c.envs().at("NCCL_NCHANNELS_PER_NET_PEER"), "16");
  EXPECT_EQ(c.envs().count("NCCL_PROTO"), 0u);
  EXPECT_EQ(c.envs().count("NCCL_MIN_NCHANNELS"), 0u);
  // Unknown ids and empty requests are refused.
  v1beta1::AllocateRequest bad;
  bad.add_container_requests()->add_devices_ids("gpu-0");
  grpc::ClientContext ctx2;
  grpc::Status s = stub->Allocate(&ctx2, bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("gpu-0"), std::string::npos);
  v1beta1::AllocateRequest empty;
  empty.add_container_requests();
  grpc::ClientContext ctx3;
  EXPECT_EQ(stub->Allocate(&ctx3, empty, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(DevicePluginTest, PreferredAllocationHonoursMustInclude) {
  ASSERT_TRUE(kubelet_->WaitFor(1));
  v1beta1::PreferredAllocationRequest req;
  auto* c = req.add_container_requests();
  for (int i = 0; i < 5; ++i) c->add_available_deviceids("podlink-peer-" + std::to_string(i));
  c->add_must_include_deviceids("podlink-peer-4");
  c->set_allocation_size(2);
  v1beta1::PreferredAllocationResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(Stub()->GetPreferredAllocation(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  ASSERT_EQ(resp.container_responses(0).deviceids_size(), 2);
  EXPECT_EQ(resp.container_responses(0).deviceids(0), "podlink-peer-4");
  EXPECT_EQ(resp.container_responses(0).deviceids(1), "podlink-peer-0");
}

TEST_F(DevicePluginTest, ReRegistersWhenItsSocketVanishes) {
  ASSERT_TRUE(kubelet_->WaitFor(1));
  ::unlink((dir_ + "/podlink.sock").c_str());  // what a restarting kubelet does
  ASSERT_TRUE(kubelet_->WaitFor(2));
  struct stat st {};
  EXPECT_EQ(::stat((dir_ + "/podlink.sock").c_str(), &st), 0);
  grpc::ClientContext ctx;
  v1beta1::DevicePluginOptions opts;
  EXPECT_TRUE(Stub()->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &opts).ok());
}

TEST_F(DevicePluginTest, ReRegistersWhenKubeletRestarts) {
  ASSERT_TRUE(kubelet_->WaitFor(1));
  kubelet_->Stop();
  std::this_thread::sleep_for(100ms);
  kubelet_->Start();  // kubelet.sock recreated
  ASSERT_TRUE(kubelet_->WaitFor(2));
  // The plugin counts a registration once the kubelet's answer is back.
  for (int i = 0; i < 500 && plugin_->registrations() < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(plugin_->registrations(), 2);
}

// A kubelet that refuses the registration is asked again with backoff, not
// every check interval (20 ms here), and the plugin says it is unregistered
// and why; once the kubelet accepts, it says registered.
TEST(DevicePluginRegistration, RefusalsBackOffAndAreReported) {
  char tmpl[] = "/tmp/podlink-dp-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  TestKubelet kubelet(dir);
  kubelet.Refuse(true);
  DevicePluginConfig c;
  c.dir = dir;
  c.check_interval = absl::Milliseconds(20);
  c.register_backoff = absl::Milliseconds(200);
  c.register_backoff_max = absl::Seconds(1);
  auto p = DevicePlugin::Start(c, [](std::string*) { return true; });
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(kubelet.WaitFor(1));
  std::this_thread::sleep_for(2s);
  // Attempts at about 0, 0.2, 0.6, 1.4 s (doubling from 200 ms): far fewer than the 100 checks in 2 s.
  size_t attempts = kubelet.Requests().size();
  EXPECT_GE(attempts, 2u);
  EXPECT_LE(attempts, 8u) << "registration retried without backoff";
  DevicePlugin::RegistrationState st = (*p)->registration();
  EXPECT_FALSE(st.registered);
  EXPECT_EQ(st.failures, attempts);
  EXPECT_NE(st.last_error.find("taken"), std::string::npos) << st.last_error;
  kubelet.Refuse(false);
  for (int i = 0; i < 300 && !(*p)->registration().registered; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE((*p)->registration().registered);
  p->reset();
  std::string cmd = "rm -rf '" + dir + "'";
  (void)!system(cmd.c_str());
}

// Stopping the plugin tells the kubelet the devices are unhealthy before
// the ListAndWatch stream ends.
TEST_F(DevicePluginTest, StoppingMarksDevicesUnhealthyBeforeTheStreamEnds) {
  ASSERT_TRUE(kubelet_->WaitFor(1));
  auto stub = Stub();
  grpc::ClientContext ctx;
  auto reader = stub->ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse r;
  ASSERT_TRUE(reader->Read(&r));
  for (const auto& d : r.devices()) EXPECT_EQ(d.health(), "Healthy");
  std::thread stop([&] { plugin_.reset(); });
  v1beta1::ListAndWatchResponse last;
  while (reader->Read(&r)) last = r;
  stop.join();
  ASSERT_GT(last.devices_size(), 0) << "the stream ended without a last device list";
  for (const auto& d : last.devices()) EXPECT_EQ(d.health(), "Unhealthy");
}

TEST(DevicePluginDirect, AllocateAddsGpuDeviceNodes) {
  DevicePluginConfig c;
  c.dir = "/nonexistent-kubelet-dir";  // registration is retried in the background; Allocate works without it
  c.resource = "podlink.io/peer-direct";
  c.devices = 2;
  c.device_nodes = {"/dev/nvidia0", "/dev/nvidia1"};
  auto p = DevicePlugin::Start(c, [](std::string*) { return true; });
  ASSERT_TRUE(p.ok());
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("podlink-peer-1");
  auto resp = (*p)->Allocate(req);
  ASSERT_TRUE(resp.ok()) << resp.status();
  const auto& cr = resp->container_responses(0);
  ASSERT_EQ(cr.devices_size(), 2);
  EXPECT_EQ(cr.devices(1).host_path(), "/dev/nvidia1");
  EXPECT_EQ(cr.devices(1).container_path(), "/dev/nvidia1");
  EXPECT_EQ(cr.devices(1).permissions(), "rw");
  EXPECT_EQ(cr.envs().at("PODLINK_DIRECT"), "1");
}

TEST(DevicePluginConfigTest, BadConfigRefused) {
  DevicePluginConfig c;
  c.devices = 0;
  EXPECT_EQ(DevicePlugin::Start(c, [](std::string*) { return true; }).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.devices = 4;
  c.resource = "no-domain";
  EXPECT_EQ(DevicePlugin::Start(c, [](std::string*) { return true; }).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace podlink
