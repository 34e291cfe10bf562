#include "client-lib/nccl/plugin.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/pci.h"

namespace podlink::ncclnet {

State& S() {
  // Never destroyed (NCCL may call in while the process exits), and not on
  // the heap either: NCCL 2.28 dlcloses the plugin after finalize, and a heap
  // singleton would then leak with each load. Finalize frees what it holds.
  alignas(State) static unsigned char storage[sizeof(State)];
  static State* s = new (storage) State();
  return *s;
}

Result Fail(Result r, const std::string& what) {
  WARN("%s", what.c_str());
  return r;
}

Result FailStatus(Result r, const char* what, const absl::Status& st) {
  WARN("%s: %s", what, st.ToString().c_str());
  return r;
}

uint64_t Random64() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != sizeof(v)) v = static_cast<uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ull;
  return v;
}

int EnvInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (end != v && *end == '\0' && x >= 0 && x <= INT_MAX) ? static_cast<int>(x) : dflt;
}

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// Net devices: one per rail group of the daemon's mesh NICs, or one per GPU
// this process sees, each reporting that GPU's PCI path so NCCL keeps its
// buffers in GPU memory (one host device without GPUs).
namespace {

// A NIC's sysfs path as NCCL would read it here: "/sys/devices/pci..." of the
// daemon's path (which may sit under another sysfs root), if this process
// sees that function; else "".
std::string LocalPciPath(const std::string& daemon_path) {
  size_t at = daemon_path.find("/devices/pci");
  if (at == std::string::npos) return "";
  std::string mine = "/sys" + daemon_path.substr(at);
  char* real = ::realpath(mine.c_str(), nullptr);
  if (real == nullptr) return "";
  std::string out = real;
  std::free(real);
  return out;
}

std::string Parent(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// `s` when it is a PCI bus id as sysfs and podlinkd name PCI functions; ""
// for anything else.
std::string BusId(const std::string& s) { return IsPciBusId(s) ? s : ""; }

}  // namespace

std::vector<State::Dev> RailDevices(const std::vector<NodeInfo::MeshNic>& nics,
                                    const std::function<std::string(const std::string&)>& pci_of,
                                    const std::string& fallback_pci) {
  struct Group {
    std::vector<std::string> netdevs;
    uint64_t speed = 0;
    std::string pci, bus_id;
  };
  std::map<std::string, Group> groups;  // by the bridge above the NIC
  std::vector<std::string> order;
  for (const NodeInfo::MeshNic& n : nics) {
    size_t at = n.pci_path.find("/devices/pci");
    if (at == std::string::npos) continue;  // virtual: no place on the PCIe tree
    const std::string key = Parent(n.pci_path.substr(at));
    auto [it, fresh] = groups.try_emplace(key);
    if (fresh) order.push_back(key);
    Group& g = it->second;
    if (std::find(g.netdevs.begin(), g.netdevs.end(), n.netdev) != g.netdevs.end()) continue;  // two addresses, one NIC
    g.netdevs.push_back(n.netdev);
    g.speed += n.speed_mbps;
    if (g.pci.empty()) g.pci = pci_of(n.pci_path);
    if (g.bus_id.empty()) g.bus_id = BusId(n.pci_path.substr(n.pci_path.rfind('/') + 1));
  }
  std::vector<State::Dev> out;
  for (const std::string& key : order) {
    const Group& g = groups[key];
    State::Dev d;
    d.name = "podlink-" + absl::StrJoin(g.netdevs, "+");
    if (d.name.size() > 60) d.name = absl::StrCat(d.name.substr(0, 52), "+", g.netdevs.size(), "nics");
    d.pci_path = g.pci.empty() ? fallback_pci : g.pci;
    d.speed_mbps = static_cast<uint32_t>(std::min<uint64_t>(g.speed, INT_MAX));
    d.affinity = g.bus_id;  // podlinkd then keeps this device's transfers on the group's links
    out.push_back(std::move(d));
  }
  std::stable_sort(out.begin(), out.end(), [](const State::Dev& a, const State::Dev& b) { return a.speed_mbps > b.speed_mbps; });
  return out;
}

int GpuOf(int dev) {
  const State& s = S();
  return dev >= 0 && static_cast<size_t>(dev) < s.devs.size() ? s.devs[dev].gpu : 0;
}

std::string AffinityOf(int dev) {
  const State& s = S();
  return dev >= 0 && static_cast<size_t>(dev) < s.devs.size() ? s.devs[dev].affinity : std::string();
}

void EnumerateDevices(State& s) {
  auto drv = cu::LoadDriver();
  s.cuda = drv.ok() ? *drv : nullptr;
  int ngpu = 0;
  if (s.cuda != nullptr && s.cuda->DeviceGetCount(&ngpu) != cu::kSuccess) ngpu = 0;
  std::vector<State::Dev> gpus;
  for (int i = 0; i < std::max(ngpu, 1); ++i) {
    State::Dev d;
    d.name = absl::StrCat("podlink", i);
    char bus[32] = {};
    cu::Device dev = 0;
    if (i < ngpu && s.cuda->DeviceGet(&dev, i) == cu::kSuccess &&
        s.cuda->DeviceGetPCIBusId(bus, sizeof(bus), dev) == cu::kSuccess) {
      std::string id = bus;
      for (char& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      d.affinity = BusId(id);  // bounce buffers of this GPU's data: links near the GPU
      char* real = ::realpath(absl::StrCat("/sys/bus/pci/devices/", id).c_str(), nullptr);
      if (real != nullptr) {
        // The GPU's parent (its PCIe switch port, or the root complex):
        // NCCL places the NIC beside the GPU. With the GPU's own PCI function
        // as the NIC's path, NCCL 2.28.9 died right after adding the NIC to
        // its topology on the test machine (docs/nccl.md).
        d.pci_path = real;
        std::free(real);
        if (!EnvIs("PODLINK_NCCL_PCI_PATH", "gpu")) d.pci_path = Parent(d.pci_path);
      }
    }
    gpus.push_back(d);
  }
  // Rail groups when the daemon's mesh has NICs with a PCI place: NCCL pairs
  // each GPU with the nearest group and models the links' real speed.
  const bool want_gpus = EnvIs("PODLINK_NCCL_DEVICES", "gpus");
  std::vector<State::Dev> rails;
  if (!want_gpus) rails = RailDevices(s.mesh_nics, LocalPciPath, gpus.front().pci_path);
  if (EnvIs("PODLINK_NCCL_DEVICES", "rails") && rails.empty()) {
    WARN("PODLINK_NCCL_DEVICES=rails, but podlinkd's mesh has no NIC with a PCI place: one device per GPU");
  }
  // A rail's copies run on the GPU nearest to it (the longest common PCI
  // path): the one NCCL pairs it with.
  for (State::Dev& r : rails) {
    size_t best = 0;
    for (int i = 0; i < ngpu; ++i) {
      const std::string& g = gpus[i].pci_path;
      size_t n = 0;
      while (n < g.size() && n < r.pci_path.size() && g[n] == r.pci_path[n]) ++n;
      if (n > best) best = n, r.gpu = i;
    }
  }
  for (size_t i = 0; i < gpus.size(); ++i) gpus[i].gpu = static_cast<int>(i);
  s.devs = rails.empty() ? std::move(gpus) : std::move(rails);
  for (const State::Dev& d : s.devs) {
    s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__, "NET/podlink device %s: %s, %s", d.name.c_str(),
          d.speed_mbps != 0 ? absl::StrCat(d.speed_mbps, " Mb/s").c_str() : "default speed",
          d.pci_path.empty() ? "no PCI path" : d.pci_path.c_str());
  }
}

void ConnectPodlinkd(State& s) {
  ConnectOptions opt;
  opt.timeout = absl::Seconds(10);
  auto client = Client::Connect(opt);
  absl::Status st = client.status();
  if (client.ok()) {
    TransferEngine::Options eo;
    eo.log_transport = false;
    eo.allow_direct = EnvIs("PODLINK_NCCL_DIRECT", "1");
    eo.force_relay = EnvIs("PODLINK_NCCL_FORCE_RELAY", "1");
    eo.direct_max_bytes = static_cast<uint64_t>(EnvInt("PODLINK_NCCL_DIRECT_MAX_BYTES", 0));
    auto engine = TransferEngine::Create(**client, eo);
    auto node = (*client)->GetNodeInfo();
    st = engine.ok() ? node.status() : engine.status();
    if (st.ok()) {
      s.client = *std::move(client);
      s.engine = *std::move(engine);
      s.node_id = node->node_id;
      s.mesh_nics = node->mesh_nics;
      if (!node->mesh_addresses.empty() && !node->node_name.empty() && node->mesh_port != 0) {
        RegionDescriptor d;
        d.node_id = node->node_id;
        d.node_name = node->node_name;
        d.mesh_port = node->mesh_port;
        d.mesh_addresses = node->mesh_addresses;
        d.handle_type = HandleType::kHostMemfd;
        s.mesh_node = d.Serialize();
      }
    }
  }
  if (!st.ok()) {
    // PODLINK_SOCKET_DIR comes from the device plugin's allocation: this pod
    // was meant to reach podlinkd, and TCP is far slower.
    const bool expected = std::getenv("PODLINK_SOCKET_DIR") != nullptr;
    s.Log(expected ? nccl_abi::kLogWarn : nccl_abi::kLogInfo, __FILE__, __LINE__,
          "podlinkd not usable (%s): peers on this node use TCP like other nodes", st.ToString().c_str());
  }
}

void JoinNative(State& s) {
  if (s.client == nullptr || EnvIs("PODLINK_NCCL_NATIVE", "0")) return;
  auto n = s.client->JoinNcclNative();
  if (!n.ok()) {
    WARN("NCCL native mode refused: %s; NCCL reaches this node's pods through the podlink relay",
         std::string(n.status().message()).c_str());
    return;
  }
  if (!n->joined) return;  // the pod did not ask (podlink.io/nccl-native)
  s.native = true;
  // The plugin's tuner serves the relay; NCCL consults a tuner on every
  // collective, so in native mode it would only add that call to each one.
  // NCCL loads the tuner after this init; a user's choice stays.
  if (std::getenv("NCCL_TUNER_PLUGIN") == nullptr) ::setenv("NCCL_TUNER_PLUGIN", "none", 0);
  if (EnvIs("NCCL_IPC_USE_ABSTRACT_SOCKET", "0")) {
    WARN("NCCL_IPC_USE_ABSTRACT_SOCKET=0: NCCL's IPC sockets are then files in each pod's own /tmp, which podlink "
         "does not carry; unset it for NCCL native mode");
  }
  const char* mine = std::getenv("NCCL_HOSTID");
  if (mine != nullptr && n->host_id != mine) {
    WARN("NCCL_HOSTID=%s is set: NCCL native mode needs %s in every pod of the group (keeping yours)", mine,
         n->host_id.c_str());
  } else {
    ::setenv("NCCL_HOSTID", n->host_id.c_str(), 1);
  }
  s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
        "NCCL native mode: %u pod(s) of this peer group on the node, NCCL_HOSTID=%s, /dev/shm %s; NCCL's P2P "
        "transport carries their traffic",
        n->members, n->host_id.c_str(), n->shm_mounted ? "mounted now" : "shared already");
}

// Defaults for the relay, set only when podlinkd is reachable and the user
// chose nothing (aws-ofi-nccl does the same on its platforms); NCCL reads
// them when it builds the communicator, after this init (docs/nccl.md):
//  - Simple only over the relay: NCCL's LL/LL128 mix is slower there at
//    every size measured. Not NCCL_PROTO, which would bind NCCL's own P2P
//    transport between the GPUs of one pod as well (0.46-0.59 of native for
//    small all_reduces, 2026-11-27): the tuner removes LL and LL128 from the
//    choices of communicators that span pods (tuner.cc), and
//    NCCL_P2P_LL_THRESHOLD=0 keeps send/recv, which no tuner sees, on Simple.
//  - NCCL_MIN_NCHANNELS=16, NCCL_BUFFSIZE=16 MiB: NCCL sizes channels from
//    the topology, where the plugin's NIC sits behind the GPU's PCIe link,
//    and opens 4; the relay needs more requests in flight.
//  - Point-to-point (send/recv, all-to-all): NCCL gives a network peer 2
//    channels of 128 KiB steps, so the relay saw 16 copies of 128 KiB in
//    flight per peer (23 GB/s between two H200 pods). More channels per peer
//    and the largest step NCCL_BUFFSIZE allows (NCCL caps a step at
//    BUFFSIZE / 8) give the copy engines fewer, larger copies and more of
//    them at once. 16 channels, not 32: with 32, NCCL 2.28.9 kept only about
//    two connections busy at a time (47 GB/s against 228 with 16; 2×H200,
//    2026-11-24, docs/performance.md). Only the net's own settings
//    (NCCL_NCHANNELS_PER_NET_PEER, NCCL_P2P_NET_CHUNKSIZE): NCCL_MIN/MAX_P2P_
//    NCHANNELS bound NCCL's own P2P transport between a pod's GPUs as well
//    (0.56-0.89 of native send/recv at 16 MiB-1 GiB, and the relay no faster
//    with them; docs/results/nccl-p2p-defaults-2026-11-27-1648-h200x2).
constexpr const char* kP2pChannels = "16";
constexpr const char* kP2pChunk = "2097152";  // NCCL_BUFFSIZE / 8

void SetRelayDefaults(State& s) {
  auto set_default = [&](const char* name, const char* value, const char* keep) {
    if (std::getenv(name) != nullptr || EnvIs(keep, "1")) return;
    ::setenv(name, value, 0);
    s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
          "%s was not set: setting %s=%s for the podlink relay (%s=1 keeps NCCL's)", name, name, value, keep);
  };
  // A user's NCCL_PROTO is a choice of protocols for send/recv too.
  if (std::getenv("NCCL_PROTO") == nullptr) set_default("NCCL_P2P_LL_THRESHOLD", "0", "PODLINK_NCCL_KEEP_PROTO");
  set_default("NCCL_MIN_NCHANNELS", "16", "PODLINK_NCCL_KEEP_CHANNELS");
  set_default("NCCL_BUFFSIZE", "16777216", "PODLINK_NCCL_KEEP_CHANNELS");
  set_default("NCCL_NCHANNELS_PER_NET_PEER", kP2pChannels, "PODLINK_NCCL_KEEP_P2P");
  set_default("NCCL_P2P_NET_CHUNKSIZE", kP2pChunk, "PODLINK_NCCL_KEEP_P2P");
}

}  // namespace podlink::ncclnet
