// The daemon's side of GPU memory for RDMA NICs (issue 16, part 2), on a real
// GPU: what the node says about dma-buf and GPUDirect RDMA with VMM
// allocations, and podlinkd's CUDA backend obtaining a dma-buf for a pod's
// GPU export as the daemon adopts it (the descriptor an RDMA NIC would
// register with ibv_reg_dmabuf_mr). Skips without a GPU.
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "common/cuda_driver.h"
#include "daemon/gpu/cuda_backend.h"
#include "daemon/gpu/gpu_inventory.h"
#include "gtest/gtest.h"

namespace podlink {
namespace {

TEST(GpuDmaBuf, TheDaemonGetsADmaBufForAPodsGpuExport) {
  absl::StatusOr<const cu::Driver*> d = cu::LoadDriver();
  if (!d.ok()) GTEST_SKIP() << d.status();
  GpuInventory inv = DiscoverGpus();
  if (!inv.cuda_available || inv.gpus.empty()) GTEST_SKIP() << "no GPU";
  const GpuDevice& g = inv.gpus[0];
  std::printf("gpu0 %s dmabuf_supported=%d gpudirect_rdma_with_vmm=%d\n", g.name.c_str(), g.dmabuf_supported,
              g.gpudirect_rdma_vmm);
  if (!g.dmabuf_supported) GTEST_SKIP() << "this GPU does not support dma-buf";

  // The pod: a VMM allocation with a POSIX-FD handle, GPUDirect RDMA asked
  // for as libpodlink does, exported as a descriptor.
  cu::MemAllocationProp prop{};
  prop.type = cu::kAllocationTypePinned;
  prop.location = {cu::kLocationTypeDevice, 0};
  prop.requestedHandleTypes = cu::kHandleTypePosixFd;
  prop.allocFlags.gpuDirectRDMACapable = g.gpudirect_rdma_vmm ? 1 : 0;
  size_t gran = 0;
  ASSERT_EQ((*d)->MemGetAllocationGranularity(&gran, &prop, 0), cu::kSuccess);
  const size_t size = 16 * gran;
  cu::MemHandle h{};
  ASSERT_EQ((*d)->MemCreate(&h, size, &prop, 0), cu::kSuccess);
  int fd = -1;
  ASSERT_EQ((*d)->MemExportToShareableHandle(&fd, h, cu::kHandleTypePosixFd, 0), cu::kSuccess);
  (*d)->MemRelease(h);

  // The daemon adopts it as for an Export request, then asks for its dma-buf.
  CudaBackend backend(&inv);
  ExportClaim claim;
  claim.size = size;
  claim.gpu_uuid = g.uuid;
  claim.kind = HandleKind::kPosixFd;
  absl::StatusOr<std::shared_ptr<MemoryObject>> obj = backend.Adopt(claim, UniqueFd(fd), "");
  ASSERT_TRUE(obj.ok()) << obj.status();
  absl::StatusOr<UniqueFd> dmabuf = (*obj)->DmaBuf();
  ASSERT_TRUE(dmabuf.ok()) << dmabuf.status();
  off_t end = ::lseek(dmabuf->get(), 0, SEEK_END);
  std::printf("dma-buf fd %d covers %lld bytes of a %zu-byte export\n", dmabuf->get(), static_cast<long long>(end),
              size);
  EXPECT_EQ(static_cast<size_t>(end), size);
  // A second one (another NIC) works too, asked on a thread with no CUDA
  // context current, as the mesh's gRPC threads ask.
  absl::StatusOr<UniqueFd> again = absl::UnknownError("not asked");
  std::thread([&] { again = (*obj)->DmaBuf(); }).join();
  EXPECT_TRUE(again.ok()) << again.status();
}

}  // namespace
}  // namespace podlink
