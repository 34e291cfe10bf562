// The NICs under the mesh's addresses, and which of a peer's paths a
// transfer should use (issue 15, "ranked by PCIe distance to the GPU, NUMA
// node, and speed").
//
// What a netdev is comes from sysfs, as NCCL and rdma-core read it:
// class/net/<dev>/speed (Mb/s; -1 or unreadable for virtual devices and
// links that are down), class/net/<dev>/device (the PCI function: none for
// veth, bridges, loopback) and its numa_node. A GPU's place is its PCI
// function under bus/pci/devices/<bus id>. The sysfs root is a parameter so
// tests run on fake trees and a container can read the host's /sys where it
// is mounted.
//
// Ranking, per transfer: the memory's affinity to each path's local NIC in
// NCCL's classes (PIX: under one PCIe switch; PXB: through several switches;
// PHB: through the host bridge; NODE: another host bridge of the same NUMA
// node; SYS: across NUMA nodes; unknown: a virtual netdev, or host memory,
// whose NUMA node the daemon does not know). A transfer of several slices
// stripes over the paths of the best class that has a link up (unequal
// speeds balance themselves, the slices being pulled); a transfer of one
// slice goes on the fastest of them. Farther paths carry traffic only when
// no nearer one is up.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace podlink::mesh {

struct NicInfo {
  std::string netdev;
  uint32_t speed_mbps = 0;  // 0: unknown
  std::string pci_path;     // the PCI function's canonical sysfs path; empty for virtual devices
  int numa_node = -1;       // -1: unknown
};

// What sysfs under `sysfs_root` ("/sys") says of `netdev`. Never fails:
// what cannot be read stays unknown.
NicInfo ReadNic(const std::string& sysfs_root, const std::string& netdev);

// Where a transfer's memory sits: a GPU's PCI function, or nothing (host memory).
struct MemoryPlace {
  std::string pci_path;
  int numa_node = -1;
};
// The GPU with PCI bus id `bus_id` ("0000:18:00.0") under `sysfs_root`;
// empty when sysfs does not have it.
MemoryPlace GpuPlace(const std::string& sysfs_root, const std::string& bus_id);

enum class Affinity { kPix = 0, kPxb, kPhb, kNode, kSys, kUnknown };
const char* AffinityName(Affinity a);
Affinity AffinityOf(const NicInfo& nic, const MemoryPlace& mem);

struct RankedPath {
  std::string name;  // as the link set names the path ("local->remote")
  NicInfo nic;       // the local NIC it leaves from
};
// Which paths a transfer should use.
struct PathPreference {
  std::vector<std::string> tier;     // the paths of the best affinity class, fastest first
  std::vector<std::string> fastest;  // the fastest of `tier`: a one-slice transfer's
};
PathPreference RankPaths(const std::vector<RankedPath>& paths, const MemoryPlace& mem);

// Whether a slice of a transfer with preference `pref` (nullptr: none) may
// go over `path`, given the paths that have a connection or queue pair up
// now: the preferred ones when any of them is up, else the rest of its
// tier, else any.
bool MayUse(const PathPreference* pref, bool single_slice, const std::string& path,
            const std::set<std::string>& up);

}  // namespace podlink::mesh
