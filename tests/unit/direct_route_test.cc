// Which GPU runs an in-process (direct) copy: the one holding the local
// memory, by its CUDA ordinal, whatever the order of the process's devices.
// Before 2026-11-24 the engine always copied on its Options::device (0); in a
// pod that could open both GPUs and whose own GPU was ordinal 1, every NCCL
// send failed with cuMemcpyAsync: CUDA_ERROR_INVALID_VALUE (issue 13).
#include <gtest/gtest.h>

#include "client-lib/transports/select.h"

namespace podlink {
namespace {

constexpr uint64_t Bit(int d) { return uint64_t{1} << d; }

TEST(DirectCopyDevice, OwnGpuSecondInTheDeviceListCopiesOnIt) {
  // The pod's memory is on ordinal 1; the peer's, mapped on 0 (where it lives), is open to both.
  EXPECT_EQ(DirectCopyDevice(/*local_device=*/1, false, /*mapping_device=*/0, Bit(0) | Bit(1)), 1);
  // The usual order: own GPU 0, the peer's memory mapped on 0 and reachable from 0.
  EXPECT_EQ(DirectCopyDevice(0, false, 0, Bit(0)), 0);
  EXPECT_EQ(DirectCopyDevice(0, false, 1, Bit(0) | Bit(1)), 0);
}

TEST(DirectCopyDevice, AMappingTheLocalGpuCannotReachGoesToTheRelay) {
  // Peer access from 1 was refused when mapping: this process cannot copy; podlinkd relays.
  EXPECT_EQ(DirectCopyDevice(1, false, 0, Bit(0)), -1);
  // The local memory's GPU is unknown (not a cuMem allocation this process can query).
  EXPECT_EQ(DirectCopyDevice(-1, false, 0, Bit(0) | Bit(1)), -1);
  EXPECT_EQ(DirectCopyDevice(64, false, 0, ~uint64_t{0}), -1);
  EXPECT_EQ(DirectCopyDevice(0, false, 0, 0), -1);
}

TEST(DirectCopyDevice, LocalHostMemoryCopiesOnTheMappingsGpu) {
  EXPECT_EQ(DirectCopyDevice(-1, true, 1, Bit(1)), 1);
  EXPECT_EQ(DirectCopyDevice(-1, true, 0, Bit(0)), 0);
}

TEST(HostMappingCopyDevice, LocalGpuMemoryCopiesOnItsGpu) {
  EXPECT_EQ(HostMappingCopyDevice(1, false, 0), 1);
  EXPECT_EQ(HostMappingCopyDevice(-1, false, 0), 0);
  EXPECT_EQ(HostMappingCopyDevice(-1, true, 2), 2);
  EXPECT_EQ(HostMappingCopyDevice(3, true, 2), 2);
}

}  // namespace
}  // namespace podlink
