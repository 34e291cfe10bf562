// Parses /proc/<pid>/cgroup into the container and pod a process belongs to.
//
// Understands cgroup v2 ("0::/path") and v1 lines, the kubelet's systemd
// driver (kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
// cri-containerd-<id>.scope) and cgroupfs driver (kubepods/burstable/pod<uid>/<id>),
// containerd ("cri-containerd-"), CRI-O ("crio-") and Docker ("docker-") names,
// and the guaranteed / burstable / besteffort QoS classes. A prefix before
// "kubepods" (kind, nested cgroup namespaces, kubelet.slice) is allowed.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"

namespace podlink {

struct CgroupInfo {
  std::string path;          // the cgroup path the rest was read from
  std::string pod_uid;       // canonical form with dashes; empty outside Kubernetes
  std::string container_id;  // lowercase hex; empty if not in a container
  std::string runtime;       // "containerd", "cri-o", "docker" or ""
  std::string qos_class;     // "guaranteed", "burstable", "besteffort" or ""

  bool in_pod() const { return !pod_uid.empty(); }
};

// Parses one cgroup path.
CgroupInfo ParseCgroupPath(absl::string_view path);

// Parses the whole contents of /proc/<pid>/cgroup: prefers the v2 line, falls
// back to the first v1 line that names a pod. INVALID_ARGUMENT when the text
// has no parseable line.
absl::StatusOr<CgroupInfo> ParseProcCgroup(absl::string_view contents);

}  // namespace podlink
