// This node's links as sysfs says: read at start, then every minute.
#include "daemon/mesh/routing/local_nics.h"

#include "daemon/mesh/links/nic_rank.h"
#include "daemon/mesh/verbs/gid.h"

namespace podlink::mesh {

void LocalNics::Read(const std::vector<IpPrefix>& advertised) {
  std::vector<v1::LinkInfo> links = ReadSysfs(advertised);
  absl::MutexLock l(&mu_);
  links_ = std::move(links);
  read_ = absl::Now();
}

void LocalNics::RefreshIfDue(const std::vector<IpPrefix>& advertised) {
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() - read_ < period_) return;
    read_ = absl::Now();  // one reader at a time: the next is due a period later
  }
  std::vector<v1::LinkInfo> links = ReadSysfs(advertised);
  absl::MutexLock l(&mu_);
  links_ = std::move(links);
}

std::vector<v1::LinkInfo> LocalNics::Current() const {
  absl::MutexLock l(&mu_);
  return links_;
}

std::vector<v1::LinkInfo> LocalNics::ReadSysfs(const std::vector<IpPrefix>& advertised) const {
  std::vector<v1::LinkInfo> out;
  for (const IpPrefix& a : advertised) {
    NicInfo nic = ReadNic(sysfs_, a.netdev);
    v1::LinkInfo l;
    l.set_address(a.ToString());
    l.set_netdev(nic.netdev);
    l.set_speed_mbps(nic.speed_mbps);
    l.set_pci_path(nic.pci_path);
    l.set_numa_node(nic.numa_node);
    l.set_gid_index(-1);
    if (absl::StatusOr<verbs::GidChoice> gid = verbs::ChooseGid(verbs_sysfs_, a); gid.ok()) {
      l.set_rdma_device(gid->device);
      l.set_gid_index(gid->index);
      l.set_gid_type(gid->roce_v2 ? "RoCE v2" : "RoCE v1");
    }
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace podlink::mesh
