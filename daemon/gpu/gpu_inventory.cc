#include "daemon/gpu/gpu_inventory.h"

#include <dlfcn.h>

#include <fstream>
#include <sstream>

#include "absl/strings/string_view.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/cuda_driver.h"
#include "common/log.h"

namespace podlink {

const GpuDevice* GpuInventory::FindByUuid(const std::string& uuid) const {
  for (const GpuDevice& g : gpus) {
    if (g.uuid == uuid) return &g;
  }
  return nullptr;
}

namespace {

const ComponentLog GpuLog("gpu");

// /proc/driver/nvidia/gpus/<bus id>/information has "Device Minor: N".
std::string DeviceNodeFor(const std::string& bus_id) {
  std::ifstream f(absl::StrCat("/proc/driver/nvidia/gpus/", bus_id, "/information"));
  std::string line;
  while (std::getline(f, line)) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, "Device Minor:")) {
      int minor;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &minor)) {
        return absl::StrCat("/dev/nvidia", minor);
      }
    }
  }
  return "";
}

// NVML, loaded like libcuda: only what the NVLink matrix needs.
struct NvmlPciInfo {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct Nvml {
  int (*Init)();
  int (*DeviceGetHandleByPciBusId)(const char*, void**);
  int (*DeviceGetNvLinkState)(void*, unsigned, int*);
  int (*DeviceGetNvLinkRemotePciInfo)(void*, unsigned, NvmlPciInfo*);
  int (*DeviceGetP2PStatus)(void*, void*, int, int*);
};
constexpr int kNvmlP2PCapsIndexNvLink = 2;  // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kNvmlP2PStatusOk = 0;         // NVML_P2P_STATUS_OK

bool LoadNvml(Nvml& n) {
  static void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return false;
  n.Init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
  n.DeviceGetHandleByPciBusId =
      reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  n.DeviceGetNvLinkState =
      reinterpret_cast<int (*)(void*, unsigned, int*)>(dlsym(lib, "nvmlDeviceGetNvLinkState"));
  n.DeviceGetNvLinkRemotePciInfo = reinterpret_cast<int (*)(void*, unsigned, NvmlPciInfo*)>(
      dlsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2"));
  n.DeviceGetP2PStatus =
      reinterpret_cast<int (*)(void*, void*, int, int*)>(dlsym(lib, "nvmlDeviceGetP2PStatus"));
  return n.Init && n.DeviceGetHandleByPciBusId && n.DeviceGetNvLinkState &&
         n.DeviceGetNvLinkRemotePciInfo && n.DeviceGetP2PStatus && n.Init() == 0;
}

// Normalizes "00000000:18:00.0" (NVML) and "0000:18:00.0" (CUDA) to the latter, lowercase.
std::string NormalizeBusId(absl::string_view id) {
  std::vector<std::string> parts = absl::StrSplit(id, ':');
  if (parts.size() == 3 && parts[0].size() > 4) parts[0] = parts[0].substr(parts[0].size() - 4);
  return absl::AsciiStrToLower(absl::StrJoin(parts, ":"));
}

bool TryFabric(const cu::Driver& d, int ordinal, uint64_t granularity) {
  cu::MemAllocationProp prop{};
  prop.type = cu::kAllocationTypePinned;
  prop.requestedHandleTypes = cu::kHandleTypeFabric;
  prop.location = {cu::kLocationTypeDevice, ordinal};
  cu::MemHandle h = 0;
  cu::Result r = d.MemCreate(&h, granularity, &prop, 0);
  if (r != cu::kSuccess) {
    GpuLog()->info("gpu={} fabric handles unavailable ({}); POSIX-FD only", ordinal,
                             cu::CuStatus(r, "cuMemCreate(FABRIC)").message());
    return false;
  }
  cu::FabricHandle fh{};
  r = d.MemExportToShareableHandle(&fh, h, cu::kHandleTypeFabric, 0);
  d.MemRelease(h);
  return r == cu::kSuccess;
}

}  // namespace

GpuInventory DiscoverGpus() {
  GpuInventory inv;
  auto loaded = cu::LoadDriver();
  if (!loaded.ok()) {
    inv.cuda_status = std::string(loaded.status().message());
    return inv;
  }
  const cu::Driver& d = **loaded;
  d.DriverGetVersion(&inv.driver_version);
  int count = 0;
  if (cu::Result r = d.DeviceGetCount(&count); r != cu::kSuccess) {
    inv.cuda_status = std::string(cu::CuStatus(r, "cuDeviceGetCount").message());
    return inv;
  }
  inv.cuda_available = count > 0;
  if (count == 0) inv.cuda_status = "no CUDA device";
  for (int i = 0; i < count; ++i) {
    GpuDevice g;
    g.ordinal = i;
    cu::Device dev;
    if (d.DeviceGet(&dev, i) != cu::kSuccess) continue;
    char buf[256] = {};
    d.DeviceGetName(buf, sizeof(buf), dev);
    g.name = buf;
    cu::Uuid uuid{};
    d.DeviceGetUuid(&uuid, dev);
    g.uuid = cu::FormatUuid(uuid);
    char bus[64] = {};
    d.DeviceGetPCIBusId(bus, sizeof(bus), dev);
    g.pci_bus_id = NormalizeBusId(bus);
    g.device_node = DeviceNodeFor(g.pci_bus_id);
    size_t mem = 0;
    d.DeviceTotalMem(&mem, dev);
    g.total_memory = mem;
    auto flag = [&](int attribute) {
      int v = 0;
      return d.DeviceGetAttribute(&v, attribute, dev) == cu::kSuccess && v != 0;
    };
    g.vmm_supported = flag(cu::kAttrVmmSupported);
    g.posix_fd_supported = flag(cu::kAttrPosixFdSupported);
    g.fabric_attribute = flag(cu::kAttrFabricSupported);
    g.dmabuf_supported = flag(cu::kAttrDmaBufSupported);
    g.gpudirect_rdma_vmm = flag(cu::kAttrGpuDirectRdmaWithVmm);
    cu::MemAllocationProp prop{};
    prop.type = cu::kAllocationTypePinned;
    prop.requestedHandleTypes = cu::kHandleTypePosixFd;
    prop.location = {cu::kLocationTypeDevice, i};
    size_t gran = 0;
    d.MemGetAllocationGranularity(&gran, &prop, 0 /* minimum */);
    g.granularity = gran;
    if (g.fabric_attribute && gran > 0) g.fabric_supported = TryFabric(d, i, gran);
    inv.gpus.push_back(std::move(g));
  }
  Nvml nvml{};
  bool have_nvml = LoadNvml(nvml);
  if (!have_nvml) GpuLog()->info("NVML unavailable: NVLink link counts not reported");
  std::vector<void*> handles(inv.gpus.size(), nullptr);
  for (size_t i = 0; have_nvml && i < inv.gpus.size(); ++i) {
    if (nvml.DeviceGetHandleByPciBusId(inv.gpus[i].pci_bus_id.c_str(), &handles[i]) != 0) handles[i] = nullptr;
  }
  for (size_t i = 0; i < inv.gpus.size(); ++i) {
    GpuDevice& g = inv.gpus[i];
    // Active links, and how many of them end directly at each peer GPU. On
    // NVSwitch systems links end at switches and count for every NVLink peer.
    unsigned active = 0;
    std::vector<unsigned> direct(inv.gpus.size(), 0);
    for (unsigned link = 0; handles[i] != nullptr && link < 18; ++link) {
      int on = 0;
      if (nvml.DeviceGetNvLinkState(handles[i], link, &on) != 0 || !on) continue;
      ++active;
      NvmlPciInfo pci{};
      if (nvml.DeviceGetNvLinkRemotePciInfo(handles[i], link, &pci) != 0) continue;
      std::string remote = NormalizeBusId(pci.busId);
      for (size_t j = 0; j < inv.gpus.size(); ++j) {
        if (inv.gpus[j].pci_bus_id == remote) ++direct[j];
      }
    }
    for (size_t j = 0; j < inv.gpus.size(); ++j) {
      if (j == i) continue;
      GpuPeer peer;
      peer.uuid = inv.gpus[j].uuid;
      int can = 0;
      d.DeviceCanAccessPeer(&can, g.ordinal, inv.gpus[j].ordinal);
      peer.p2p_supported = can != 0;
      int status = -1;
      if (handles[i] != nullptr && handles[j] != nullptr &&
          nvml.DeviceGetP2PStatus(handles[i], handles[j], kNvmlP2PCapsIndexNvLink, &status) == 0 &&
          status == kNvmlP2PStatusOk) {
        peer.link_count = direct[j] > 0 ? direct[j] : active;
      }
      g.peers.push_back(peer);
    }
  }
  return inv;
}

}  // namespace podlink
