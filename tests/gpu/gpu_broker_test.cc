// GPU broker tests: run only on a machine with GPUs (ctest -L gpu, through
// tests/gpu/run.sh on the device machine). podlinkd imports every cuMem
// export itself, so lies about size, GPU or handle type are caught.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/cuda_driver.h"
#include "common/fd_channel.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "podlink/client.h"
#include "podlink/transfer.h"
#include "podlink/v1/podlink.grpc.pb.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

class GpuBroker : public ::testing::Test {
 protected:
  GpuBroker() : daemon_("{}", {}, /*gpu=*/true) {}
  void SetUp() override {
    auto d = cu::LoadDriver();
    ASSERT_TRUE(d.ok()) << "GPU tests need a GPU: " << d.status();
    client_ = *Client::Connect({.socket_dir = daemon_.dir()});
    auto n = client_->GetNodeInfo();
    ASSERT_TRUE(n.ok());
    node_ = *n;
    ASSERT_TRUE(node_.cuda_available) << node_.cuda_status;
    ASSERT_FALSE(node_.gpus.empty());
  }

  // Raw export of `fd` with whatever claims the test wants to make.
  grpc::Status RawExport(int fd, uint64_t size, const std::string& uuid) {
    UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s/podlink.fd.sock", daemon_.dir().c_str());
    EXPECT_EQ(::connect(sock.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    auto hello = RecvFdMessage(sock.get(), false);
    std::string cred = absl::StrFormat("%d.%016x%016x", (*hello)->msg.seq, (*hello)->msg.a, (*hello)->msg.b);
    FdMessage m;
    m.type = static_cast<uint16_t>(FdMsgType::kOffer);
    m.seq = 1;
    EXPECT_TRUE(SendFdMessage(sock.get(), m, fd, false).ok());
    auto ack = RecvFdMessage(sock.get(), false);
    EXPECT_EQ((*ack)->msg.a, 0u);
    auto stub = v1::Broker::NewStub(
        grpc::CreateChannel("unix:" + daemon_.dir() + "/podlink.sock", grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-podlink-session", cred);
    v1::ExportRequest req;
    req.set_size(size);
    req.set_gpu_uuid(uuid);
    req.set_handle_type(v1::HANDLE_TYPE_POSIX_FD);
    req.set_fd_slot(1);
    v1::ExportResponse resp;
    return stub->Export(&ctx, req, &resp);
  }

  Daemon daemon_;
  std::unique_ptr<Client> client_;
  NodeInfo node_;
};

TEST_F(GpuBroker, NodeInfoReportsGpusAndWorkingHandleTypes) {
  bool posix = false;
  for (auto t : node_.handle_types) posix |= t == HandleType::kPosixFd;
  EXPECT_TRUE(posix);
  for (const auto& g : node_.gpus) {
    std::cout << "gpu " << g.index << " " << g.uuid << " " << g.pci_bus_id << " " << g.device_node
              << " fabric=" << g.fabric_supported << " peers:";
    for (const auto& p : g.peers) std::cout << " " << p.uuid << "(nvlinks=" << p.link_count << ",p2p=" << p.p2p_supported << ")";
    std::cout << "\n";
    EXPECT_TRUE(g.posix_fd_supported);
    EXPECT_GT(g.granularity, 0u);
    EXPECT_EQ(g.device_node.rfind("/dev/nvidia", 0), 0u) << g.device_node;
    EXPECT_EQ(g.peers.size(), node_.gpus.size() - 1);
  }
}

TEST_F(GpuBroker, ExportImportMapRoundTrip) {
  auto buf = client_->AllocateGpu(64 << 20, 0);
  ASSERT_TRUE(buf.ok()) << buf.status();
  const cu::Driver* d = *cu::LoadDriver();
  std::vector<uint8_t> host((*buf)->size());
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_EQ(d->MemcpyHtoD((*buf)->device_ptr(), host.data(), host.size()), 0);
  auto id = client_->Export(**buf, {.name = "gpu-rt", .allowed_importers = {}, .mesh_affinity = ""});
  ASSERT_TRUE(id.ok()) << id.status();
  auto other = Client::Connect({.socket_dir = daemon_.dir()});
  auto imp = (*other)->Import("gpu-rt");
  ASSERT_TRUE(imp.ok()) << imp.status();
  EXPECT_EQ(imp->info().handle_type, HandleType::kPosixFd);
  EXPECT_EQ(imp->gpu_device_node(), node_.gpus[0].device_node);
  auto m = (*other)->Map(*imp);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<uint8_t> back(host.size());
  ASSERT_EQ(d->MemcpyDtoH(back.data(), (*m)->device_ptr(), back.size()), 0);
  EXPECT_EQ(back, host);
}

TEST_F(GpuBroker, ExportExistingAllocation) {
  auto buf = client_->AllocateGpu(2 << 20, 0);
  ASSERT_TRUE(buf.ok());
  auto id = client_->ExportExisting((*buf)->device_ptr(), (*buf)->size());
  EXPECT_TRUE(id.ok()) << id.status();
  // From inside the allocation (as torch hands out tensors): the importer's byte 0 is the range's first byte.
  const cu::Driver* d = *cu::LoadDriver();
  std::vector<uint8_t> host((*buf)->size());
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 13 + 5);
  ASSERT_EQ(d->MemcpyHtoD((*buf)->device_ptr(), host.data(), host.size()), 0);
  auto inner = client_->ExportExisting((*buf)->device_ptr() + 4096, 8192);
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto other = Client::Connect({.socket_dir = daemon_.dir()});
  auto imp = (*other)->Import(*inner);
  ASSERT_TRUE(imp.ok()) << imp.status();
  EXPECT_EQ(imp->info().offset, 4096u);
  EXPECT_EQ(imp->info().chunk_sizes, std::vector<uint64_t>{(*buf)->size()});
  auto m = (*other)->Map(*imp);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<uint8_t> back(8192);
  ASSERT_EQ(d->MemcpyDtoH(back.data(), (*m)->device_ptr(), back.size()), 0);
  EXPECT_EQ(back, std::vector<uint8_t>(host.begin() + 4096, host.begin() + 4096 + 8192));
  // Where no GPU memory is mapped: refused.
  auto bad = client_->ExportExisting(4096, 8192);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

TEST_F(GpuBroker, LiesAboutGpuMemoryAreCaught) {
  auto buf = client_->AllocateGpu(2 << 20, 0);
  ASSERT_TRUE(buf.ok());
  const cu::Driver* d = *cu::LoadDriver();
  cu::MemHandle h = 0;
  ASSERT_EQ(d->MemRetainAllocationHandle(&h, reinterpret_cast<void*>((*buf)->device_ptr())), 0);
  int raw = -1;
  ASSERT_EQ(d->MemExportToShareableHandle(&raw, h, cu::kHandleTypePosixFd, 0), 0);
  d->MemRelease(h);
  UniqueFd fd(raw);
  const std::string uuid = (*buf)->gpu_uuid();
  // Bigger than the allocation.
  grpc::Status s = RawExport(fd.get(), 64 << 20, uuid);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("smaller"), std::string::npos) << s.error_message();
  // Not a multiple of the granularity.
  s = RawExport(fd.get(), 4096, uuid);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // Unknown GPU.
  s = RawExport(fd.get(), 2 << 20, "GPU-00000000-0000-0000-0000-000000000000");
  EXPECT_NE(s.error_message().find("unknown GPU"), std::string::npos) << s.error_message();
  // Another real GPU than the one holding the memory.
  if (node_.gpus.size() > 1) {
    std::string other = node_.gpus[0].uuid == uuid ? node_.gpus[1].uuid : node_.gpus[0].uuid;
    s = RawExport(fd.get(), 2 << 20, other);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("lives on device ordinal"), std::string::npos) << s.error_message();
  }
  // A memfd passed off as a cuMem handle.
  UniqueFd memfd(::memfd_create("fake", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(memfd.get(), 2 << 20), 0);
  s = RawExport(memfd.get(), 2 << 20, uuid);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not an importable cuMem"), std::string::npos) << s.error_message();
  // The truthful claim works.
  EXPECT_TRUE(RawExport(fd.get(), 2 << 20, uuid).ok());
  EXPECT_TRUE(daemon_.Alive());
}

TEST_F(GpuBroker, GpuCyclesLeaveTheDaemonFlat) {
  // Per-step wall time, reported (never asserted).
  double t_connect = 0, t_alloc = 0, t_export = 0, t_import = 0, t_map = 0, t_close = 0;
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  auto cycle = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      auto exporter = Client::Connect({.socket_dir = daemon_.dir()});
      auto t1 = Clock::now();
      auto buf = (*exporter)->AllocateGpu(2 << 20, 0);
      ASSERT_TRUE(buf.ok());
      auto t2 = Clock::now();
      auto id = (*exporter)->Export(**buf);
      ASSERT_TRUE(id.ok()) << id.status();
      auto t3 = Clock::now();
      auto imp = client_->Import(*id);
      ASSERT_TRUE(imp.ok());
      auto t4 = Clock::now();
      auto m = client_->Map(*imp);
      ASSERT_TRUE(m.ok());
      auto t5 = Clock::now();
      buf->reset();
      exporter->reset();  // exporter leaves without releasing
      m->reset();
      auto t6 = Clock::now();
      // The export died with its owner; the importer's release finds nothing.
      absl::Status rel = client_->Release(*id);
      ASSERT_TRUE(rel.ok() || absl::IsNotFound(rel)) << rel;
      t_connect += ms(t0, t1);
      t_alloc += ms(t1, t2);
      t_export += ms(t2, t3);
      t_import += ms(t3, t4);
      t_map += ms(t4, t5);
      t_close += ms(t5, t6);
    }
  };
  cycle(50);
  int fds0 = daemon_.OpenFds();
  long rss0 = daemon_.RssKb();
  t_connect = t_alloc = t_export = t_import = t_map = t_close = 0;
  cycle(300);
  std::printf("GPU cycle mean ms (300 cycles, 2 MiB): connect %.2f alloc %.2f export %.2f import %.2f map %.2f "
              "unmap+free+close %.2f\n",
              t_connect / 300, t_alloc / 300, t_export / 300, t_import / 300, t_map / 300, t_close / 300);
  int fds1 = daemon_.OpenFds();
  for (int i = 0; i < 100 && fds1 != fds0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fds1 = daemon_.OpenFds();
  }
  long rss1 = daemon_.RssKb();
  std::cout << "GPU cycles: podlinkd fds " << fds0 << " -> " << fds1 << ", rss " << rss0 << " -> " << rss1 << " KiB\n";
  EXPECT_EQ(fds1, fds0);
  EXPECT_LT(rss1 - rss0, 8192);
}

// Both GPUs' copies through one relay worker, in both directions at once:
// every byte lands, and the worker never falls back to synchronous copies
// (an event from one GPU's context cannot be recorded on another's stream).
class GpuRelayOneWorker : public ::testing::Test {
 protected:
  GpuRelayOneWorker() : daemon_("{}", {"--relay-workers", "1"}, /*gpu=*/true) {}
  Daemon daemon_;
};

TEST_F(GpuRelayOneWorker, BothDirectionsByteForByte) {
  auto drv = cu::LoadDriver();
  ASSERT_TRUE(drv.ok()) << drv.status();
  const cu::Driver* d = *drv;
  int ngpu = 0;
  d->DeviceGetCount(&ngpu);
  if (ngpu < 2) GTEST_SKIP() << "needs two GPUs";
  constexpr size_t kSize = 64 << 20;
  struct Side {
    std::unique_ptr<Client> client;
    std::unique_ptr<GpuBuffer> buf;
    std::unique_ptr<TransferEngine> engine;
    LocalRegion region;
    RemoteRegion peer;
  } side[2];
  for (int g = 0; g < 2; ++g) {
    side[g].client = *Client::Connect({.socket_dir = daemon_.dir()});
    auto b = side[g].client->AllocateGpu(kSize, g);
    ASSERT_TRUE(b.ok()) << b.status();
    side[g].buf = *std::move(b);
    cu::Context ctx = nullptr;
    ASSERT_EQ(d->DevicePrimaryCtxRetain(&ctx, g), 0);
    ASSERT_EQ(d->CtxSetCurrent(ctx), 0);
    std::vector<uint8_t> fill(kSize / 2, static_cast<uint8_t>(0x10 + g));
    ASSERT_EQ(d->MemcpyHtoD(side[g].buf->device_ptr(), fill.data(), fill.size()), 0);
    d->DevicePrimaryCtxRelease(g);
    TransferEngine::Options o;
    o.device = g;
    o.force_relay = true;
    o.log_transport = false;
    side[g].engine = *TransferEngine::Create(*side[g].client, o);
    side[g].region = *side[g].engine->Register(*side[g].buf);
  }
  for (int g = 0; g < 2; ++g) {
    auto desc = side[1 - g].engine->Describe(side[1 - g].region);
    ASSERT_TRUE(desc.ok());
    auto r = side[g].engine->Open(*desc);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->transport, Transport::kRelay);
    side[g].peer = *r;
  }
  // Each side writes its lower half into the other's upper half, 4 MiB at a time.
  absl::Status st[2];
  std::vector<std::thread> threads;
  for (int g = 0; g < 2; ++g) {
    threads.emplace_back([&, g] {
      std::vector<TransferOp> ops;
      for (uint64_t off = 0; off < kSize / 2; off += 4 << 20) {
        ops.push_back({&side[g].region, off, &side[g].peer, kSize / 2 + off, 4 << 20});
      }
      for (int rep = 0; rep < 8 && st[g].ok(); ++rep) st[g] = side[g].engine->Writev(ops);
    });
  }
  for (auto& t : threads) t.join();
  for (int g = 0; g < 2; ++g) {
    EXPECT_TRUE(st[g].ok()) << st[g];
    // The buffer is mapped for its own GPU only: copy in that GPU's context.
    cu::Context ctx = nullptr;
    ASSERT_EQ(d->DevicePrimaryCtxRetain(&ctx, g), 0);
    ASSERT_EQ(d->CtxSetCurrent(ctx), 0);
    std::vector<uint8_t> back(kSize / 2);
    ASSERT_EQ(d->MemcpyDtoH(back.data(), side[g].buf->device_ptr() + kSize / 2, back.size()), 0);
    d->DevicePrimaryCtxRelease(g);
    size_t bad = 0;
    for (uint8_t b : back) bad += b != 0x10 + (1 - g);
    EXPECT_EQ(bad, 0u) << "GPU" << g << " upper half";
  }
  EXPECT_EQ(daemon_.Log().find("relay_sync_fallback"), std::string::npos) << daemon_.Log();
}

}  // namespace
}  // namespace podlink::testing
