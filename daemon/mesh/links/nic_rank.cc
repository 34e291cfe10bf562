#include "daemon/mesh/links/nic_rank.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/pci.h"

namespace podlink::mesh {
namespace {

std::string FirstLine(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

int ReadInt(const std::string& file, int dflt) {
  int v = 0;
  return absl::SimpleAtoi(FirstLine(file), &v) ? v : dflt;
}

std::string RealPath(const std::string& p) {
  char* r = ::realpath(p.c_str(), nullptr);
  if (r == nullptr) return {};
  std::string out = r;
  std::free(r);
  return out;
}

// The PCI functions from the root complex down to the device itself
// ("pci0000:00", then "0000:00:01.0", ...); empty when `path` is not under a
// root complex. Trailing non-PCI components (a virtio device under its PCI
// function) are dropped.
std::vector<std::string> PciChain(const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  auto root = std::find_if(parts.begin(), parts.end(), [](const std::string& c) {
    return absl::StartsWith(c, "pci") && c.size() > 3 && std::isxdigit(static_cast<unsigned char>(c[3]));
  });
  if (root == parts.end()) return {};
  std::vector<std::string> chain(root, parts.end());
  while (chain.size() > 1 && !IsPciBusId(chain.back())) chain.pop_back();
  if (chain.size() < 2) return {};
  return chain;
}

}  // namespace

NicInfo ReadNic(const std::string& sysfs_root, const std::string& netdev) {
  NicInfo n;
  n.netdev = netdev;
  if (netdev.empty() || netdev.find('/') != std::string::npos || netdev == "." || netdev == "..") return n;
  const std::string dir = absl::StrCat(sysfs_root, "/class/net/", netdev);
  int speed = ReadInt(dir + "/speed", -1);
  n.speed_mbps = speed > 0 ? static_cast<uint32_t>(speed) : 0;
  std::string dev = RealPath(dir + "/device");
  if (!dev.empty() && !PciChain(dev).empty()) {
    n.pci_path = dev;
    n.numa_node = std::max(-1, ReadInt(dev + "/numa_node", -1));
  }
  return n;
}

MemoryPlace GpuPlace(const std::string& sysfs_root, const std::string& bus_id) {
  MemoryPlace m;
  if (!IsPciBusId(bus_id)) return m;
  std::string dev = RealPath(absl::StrCat(sysfs_root, "/bus/pci/devices/", bus_id));
  if (dev.empty() || PciChain(dev).empty()) return m;
  m.pci_path = dev;
  m.numa_node = std::max(-1, ReadInt(dev + "/numa_node", -1));
  return m;
}

const char* AffinityName(Affinity a) {
  switch (a) {
    case Affinity::kPix: return "PIX";
    case Affinity::kPxb: return "PXB";
    case Affinity::kPhb: return "PHB";
    case Affinity::kNode: return "NODE";
    case Affinity::kSys: return "SYS";
    case Affinity::kUnknown: break;
  }
  return "unknown";
}

Affinity AffinityOf(const NicInfo& nic, const MemoryPlace& mem) {
  const bool numa_known = nic.numa_node >= 0 && mem.numa_node >= 0;
  // Memory placed at the NIC itself (a pod's bounce buffer for one NCCL rail
  // device): nearest, wherever the NIC sits.
  if (!nic.pci_path.empty() && nic.pci_path == mem.pci_path) return Affinity::kPix;
  std::vector<std::string> a = PciChain(nic.pci_path), b = PciChain(mem.pci_path);
  if (a.empty() || b.empty()) {
    return numa_known && nic.numa_node != mem.numa_node ? Affinity::kSys : Affinity::kUnknown;
  }
  if (a.front() != b.front()) {
    return numa_known && nic.numa_node != mem.numa_node ? Affinity::kSys : Affinity::kNode;
  }
  // Common ancestors below the root complex (the devices themselves excluded).
  size_t d = 0;
  while (d + 2 < a.size() && d + 2 < b.size() && a[d + 1] == b[d + 1]) ++d;
  if (d == 0) return Affinity::kPhb;
  // Under one switch: each device a downstream port below the common one.
  size_t below = (a.size() - 1 - d) + (b.size() - 1 - d);
  return below <= 4 ? Affinity::kPix : Affinity::kPxb;
}

PathPreference RankPaths(const std::vector<RankedPath>& paths, const MemoryPlace& mem) {
  PathPreference p;
  if (paths.empty()) return p;
  std::vector<Affinity> aff;
  Affinity best = Affinity::kUnknown;
  for (const RankedPath& r : paths) {
    aff.push_back(AffinityOf(r.nic, mem));
    best = std::min(best, aff.back());
  }
  std::vector<const RankedPath*> tier;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (aff[i] == best) tier.push_back(&paths[i]);
  }
  std::stable_sort(tier.begin(), tier.end(),
                   [](const RankedPath* x, const RankedPath* y) { return x->nic.speed_mbps > y->nic.speed_mbps; });
  const uint32_t top = tier.front()->nic.speed_mbps;
  for (const RankedPath* r : tier) {
    p.tier.push_back(r->name);
    if (r->nic.speed_mbps == top) p.fastest.push_back(r->name);
  }
  return p;
}

bool MayUse(const PathPreference* pref, bool single_slice, const std::string& path,
            const std::set<std::string>& up) {
  if (pref == nullptr || pref->tier.empty()) return true;
  auto any_up = [&](const std::vector<std::string>& v) {
    return std::any_of(v.begin(), v.end(), [&](const std::string& x) { return up.contains(x); });
  };
  auto has = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), path) != v.end(); };
  if (single_slice && any_up(pref->fastest)) return has(pref->fastest);
  if (any_up(pref->tier)) return has(pref->tier);
  return true;
}

}  // namespace podlink::mesh
