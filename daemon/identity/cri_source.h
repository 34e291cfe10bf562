// Pod source backed by the container runtime (CRI RuntimeService over its
// Unix socket: containerd /run/containerd/containerd.sock, CRI-O
// /var/run/crio/crio.sock). The pod UID comes from the kernel (cgroup);
// namespace, name and annotations from the runtime's pod sandbox with that
// UID. Processes outside pods go to the fallback source.
//
// The cgroup's two facts must agree with the runtime: its container id must
// be a container (or a sandbox, the pause container's own cgroup) that the
// runtime lists under the pod the cgroup names. A container of another pod
// is refused (PERMISSION_DENIED), as is a process in the pod's cgroup but in
// no container's (the kubelet never puts one there); a pod or container the
// runtime does not list is UNAVAILABLE (it may have just been created).
// Sandboxes and containers are cached and both re-listed on a miss (at most
// every 500 ms, 3 s deadline).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cri/runtime/v1/api.grpc.pb.h"
#include "daemon/identity/pod_source.h"

namespace podlink {

class CriPodSource : public PodSource {
 public:
  CriPodSource(std::string socket, std::unique_ptr<PodSource> fallback);
  absl::StatusOr<PodInfo> Resolve(const PeerIdentity& peer) override;

  // The runtime socket to use when none is configured: containerd's, else CRI-O's.
  static std::string DefaultSocket();

 private:
  absl::Status Refresh() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The uid of the pod the runtime lists `container_id` under; "" if none.
  std::string OwnerUid(const std::string& container_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string socket_;
  std::unique_ptr<PodSource> fallback_;
  std::unique_ptr<runtime::v1::RuntimeService::Stub> stub_;
  absl::Mutex mu_;  // the caches, filled together by Refresh()
  std::map<std::string, PodInfo> by_uid_ ABSL_GUARDED_BY(mu_);  // pod uid -> its ready, newest sandbox's pod
  std::map<std::string, std::string> sandbox_uid_ ABSL_GUARDED_BY(mu_);     // sandbox id -> pod uid, every attempt
  std::map<std::string, std::string> container_sandbox_ ABSL_GUARDED_BY(mu_);  // container id -> sandbox id
  absl::Time last_refresh_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace podlink
