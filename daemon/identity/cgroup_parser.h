// Parses /proc/<pid>/cgroup into the container and pod a process belongs to.
//
// A client can create cgroups of its own (systemd delegation, a nested
// runtime, a writable cgroupfs), so the parser believes only the kubelet's
// fixed layout, anchored at a configured kubelet cgroup root:
//
//   systemd driver   <root>/kubepods.slice/[kubepods-<qos>.slice/]kubepods[-<qos>]-pod<uid>.slice/<container>.scope
//   cgroupfs driver  <root>/kubepods/[<qos>/]pod<uid>/<container>
//
// with <qos> burstable or besteffort (none: guaranteed), <container> a
// containerd ("cri-containerd-"), CRI-O ("crio-"), Docker ("docker-") or bare
// container id, and nothing below the container. Under a systemd slice root
// (kind's /kubelet.slice) the names carry the slice's prefix
// (kubelet-kubepods.slice, ...). A path that names a pod or a kubepods cgroup
// anywhere else, or in any other shape, is refused: it is never guessed into
// a pod, and never silently treated as a plain process either.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace podlink {

struct CgroupInfo {
  std::string path;          // the cgroup path the rest was read from
  std::string pod_uid;       // canonical form (lowercase, dashes); empty outside Kubernetes
  std::string container_id;  // lowercase hex; empty if not in a container
  std::string runtime;       // "containerd", "cri-o", "docker" or ""
  std::string qos_class;     // "guaranteed", "burstable", "besteffort" or ""

  bool in_pod() const { return !pod_uid.empty(); }
};

// Where the kubelet's kubepods cgroups may live, as podlinkd sees cgroup
// paths. "/" is the kubelet's default --cgroup-root; "/kubelet.slice" is
// kind's. Only root can create cgroups at these places.
struct CgroupLayout {
  std::vector<std::string> kubelet_roots = {"/", "/kubelet.slice"};
};

// Parses one cgroup path. OK and !in_pod() for a process outside
// Kubernetes (a plain Docker/containerd container id is still recorded);
// PERMISSION_DENIED, with the reason, for a path that looks like a pod's but
// does not follow the layout above.
absl::StatusOr<CgroupInfo> ParseCgroupPath(absl::string_view path, const CgroupLayout& layout = {});

// Parses the whole contents of /proc/<pid>/cgroup (cgroup v2 "0::/path" and
// v1 lines). Every line is checked; lines that name a pod must all name the
// same pod and container. INVALID_ARGUMENT when the text has no parseable
// line; PERMISSION_DENIED when a line is refused or the lines disagree.
absl::StatusOr<CgroupInfo> ParseProcCgroup(absl::string_view contents, const CgroupLayout& layout = {});

// A pod UID as the kubelet writes it in a cgroup name (RFC 4122 UUID, '_'
// for '-' under systemd; or 32 hex digits for static pods), canonicalized;
// "" if `raw` is none.
std::string CanonicalPodUid(absl::string_view raw);

}  // namespace podlink
