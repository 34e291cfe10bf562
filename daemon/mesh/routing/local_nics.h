// What this node says of its own links (mesh.proto LinkInfo): for each
// advertised address, the netdev and NIC under it (speed, PCI path, NUMA
// node) and the RDMA device and GID a verbs peer would use, as read from
// sysfs. Hello answers and the daemon's status show it. Reading a GID table
// can take a thousand files per port, so it is read once at start and then
// again at most every `period`, on the housekeeping thread, never on a call's.
// Its own lock (a leaf).
#pragma once

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/mesh/routing/addresses.h"
#include "podlink/mesh/v1/mesh.pb.h"

namespace podlink::mesh {

class LocalNics {
 public:
  // `sysfs`: the host's /sys (NICs); `verbs_sysfs`: where RDMA devices are
  // (mesh.verbs.sysfs: /sys/class/infiniband).
  LocalNics(std::string sysfs, std::string verbs_sysfs, absl::Duration period = absl::Seconds(60))
      : sysfs_(std::move(sysfs)), verbs_sysfs_(std::move(verbs_sysfs)), period_(period) {}

  // Reads them now.
  void Read(const std::vector<IpPrefix>& advertised) ABSL_LOCKS_EXCLUDED(mu_);
  // Reads them where `period` has passed since the last read.
  void RefreshIfDue(const std::vector<IpPrefix>& advertised) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<v1::LinkInfo> Current() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::vector<v1::LinkInfo> ReadSysfs(const std::vector<IpPrefix>& advertised) const;

  const std::string sysfs_, verbs_sysfs_;
  const absl::Duration period_;
  mutable absl::Mutex mu_;
  std::vector<v1::LinkInfo> links_ ABSL_GUARDED_BY(mu_);
  absl::Time read_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace podlink::mesh
