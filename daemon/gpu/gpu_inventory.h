// The node's GPUs as the daemon sees them (it sees every GPU): identity,
// device node, NVLink peers and which cuMem handle types really work.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace podlink {

struct GpuPeer {
  std::string uuid;
  unsigned link_count = 0;
  bool p2p_supported = false;
};

struct GpuDevice {
  int ordinal = 0;
  std::string uuid;
  std::string pci_bus_id;   // lowercase "0000:18:00.0"
  std::string device_node;  // "/dev/nvidia0" (from /proc/driver/nvidia), "" if unknown
  std::string name;
  uint64_t total_memory = 0;
  uint64_t granularity = 0;
  bool vmm_supported = false;
  bool posix_fd_supported = false;
  bool fabric_supported = false;  // decided by trying, not by the attribute
  // What an RDMA NIC could use (the mesh's verbs transport, by DMA-BUF):
  bool dmabuf_supported = false;      // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  bool gpudirect_rdma_vmm = false;    // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
  bool fabric_attribute = false;
  std::vector<GpuPeer> peers;
};

struct GpuInventory {
  bool cuda_available = false;
  std::string cuda_status;  // why CUDA is unavailable
  int driver_version = 0;
  std::vector<GpuDevice> gpus;

  const GpuDevice* FindByUuid(const std::string& uuid) const;
};

// Enumerates GPUs through the dlopen'd driver; never fails: a node without
// CUDA yields cuda_available = false and the reason.
GpuInventory DiscoverGpus();

}  // namespace podlink
