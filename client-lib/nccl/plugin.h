// The NCCL net plugin's process-wide state (what init found, shared cuMem
// exports, the plugin's own CUDA copy contexts), its logging through NCCL's
// logger, and small environment helpers.
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client-lib/nccl/api.h"
#include "client-lib/nccl/handshake.h"
#include "client-lib/nccl/nccl_net_abi.h"
#include "client-lib/nccl/net_socket.h"
#include "common/cuda_driver.h"
#include "podlink/client.h"
#include "podlink/transfer.h"

namespace podlink::ncclnet {

// ---------------------------------------------------------------- plugin state

class State {
 public:
  std::mutex mu;
  int refs = 0;
  nccl_abi::Logger logger = nullptr;

  // What init found.
  std::string node_id;  // podlinkd's node identity; empty without a daemon
  // With podlinkd's mesh: this node as a region descriptor without an export
  // (what a mesh receiver tells its senders); empty without a mesh.
  std::string mesh_node;
  std::unique_ptr<Client> client;
  std::unique_ptr<TransferEngine> engine;
  const cu::Driver* cuda = nullptr;
  struct Dev {
    std::string name, pci_path;
    uint32_t speed_mbps = 0;  // 0: the default for the device's kind
    int gpu = 0;              // the CUDA ordinal its copies run on (a rail: the GPU nearest to it)
    // The PCI bus id its host bounce buffers are exported with (their mesh
    // affinity): a rail's first NIC, or the GPU; "" for none.
    std::string affinity;
  };
  std::vector<Dev> devs;
  // The daemon's mesh NICs (ConnectPodlinkd), for EnumerateDevices.
  std::vector<NodeInfo::MeshNic> mesh_nics;
  SockAddr listen_addr;
  std::string ifname;
  int ifname_speed_mbps = 0;  // ifname's link speed, as NET/Socket reads it
  int nsocks = 4;
  bool tcp_only = false;

  std::map<void*, std::unique_ptr<Connecting>> connecting;  // keyed by the handle buffer NCCL passes again
  struct SharedExport {
    LocalRegion region;
    int refs = 0;
  };
  std::map<uint64_t, SharedExport> exports;  // cuMem allocation base -> its export
  std::map<uint64_t, int> remote_refs;       // remote export -> comms using it
  int live_comms = 0;
  std::atomic<int> trace_left{0};  // PODLINK_NCCL_TRACE: operations still to log
  bool tcp_fallback_kept = false;
  // NCCL native mode (JoinNative): NCCL's own P2P transport reaches this
  // pod's group; its IPC sockets are synced into the group at GetProperties.
  bool native = false;  // finalize kept state without a podlinkd session
  std::map<int, cu::Context> copy_ctx;  // CUDA device -> the plugin's own context for staging copies

  void Log(int level, const char* file, int line, const char* fmt, ...) __attribute__((format(printf, 5, 6))) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    nccl_abi::Logger l = logger;
    if (l != nullptr) {
      l(level, nccl_abi::kLogSubsysNet, file, line, "%s", buf);
    } else if (level == nccl_abi::kLogWarn || std::getenv("PODLINK_NCCL_DEBUG") != nullptr) {
      std::fprintf(stderr, "NET/podlink: %s\n", buf);
    }
  }
};

// The one State of the process.
State& S();

#define PLOG(level, ...) S().Log(nccl_abi::level, __FILE__, __LINE__, __VA_ARGS__)
#define WARN(...) PLOG(kLogWarn, __VA_ARGS__)
#define INFO(...) PLOG(kLogInfo, __VA_ARGS__)
// One line per operation while PODLINK_NCCL_TRACE lines remain (debugging).
#define TRACE_OP(...)                                                                          \
  do {                                                                                         \
    if (S().trace_left.load(std::memory_order_relaxed) > 0 && S().trace_left.fetch_sub(1) > 0) \
      INFO(__VA_ARGS__);                                                                       \
  } while (0)


Result Fail(Result r, const std::string& what);
Result FailStatus(Result r, const char* what, const absl::Status& st);

uint64_t Random64();
int EnvInt(const char* name, int dflt);
bool EnvIs(const char* name, const char* value);

// Asks podlinkd for NCCL native mode (the pod's podlink.io/nccl-native
// annotation decides); on success sets NCCL_HOSTID for NCCL. After
// ConnectPodlinkd, before NCCL reads its host identity.
void JoinNative(State& s);

// Fills s.devs and s.cuda: one net device per rail group of the daemon's
// mesh NICs (PODLINK_NCCL_DEVICES=rails, or auto with NICs that have a PCI
// place), else one per GPU this process sees (gpus). After ConnectPodlinkd.
void EnumerateDevices(State& s);

// The mesh NICs grouped by the PCIe bridge above them (a switch or root
// port): one device per group, named after its netdevs, its speed the sum of
// theirs, the fastest first. `pci_of` maps the daemon's sysfs path of a NIC
// to the path NCCL reads in this process ("" where it cannot: the device then
// takes `fallback_pci`). NICs without a PCI function (virtual) make none.
// The CUDA ordinal for device `dev`'s copies (devs do not change while a comm
// lives, so no lock).
int GpuOf(int dev);
// The mesh affinity of device `dev`'s host bounce buffers ("" for none).
std::string AffinityOf(int dev);

std::vector<State::Dev> RailDevices(const std::vector<NodeInfo::MeshNic>& nics,
                                    const std::function<std::string(const std::string&)>& pci_of,
                                    const std::string& fallback_pci);

// Opens the podlinkd session and TransferEngine (s.client, s.engine,
// s.node_id); without podlinkd, logs why and leaves them empty. s.mu held.
void ConnectPodlinkd(State& s);

// With podlinkd: NCCL settings the relay needs, for those the user left
// unset (see the .cc). s.mu held.
void SetRelayDefaults(State& s);

}  // namespace podlink::ncclnet
