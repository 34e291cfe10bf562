// Pod source backed by the container runtime (CRI RuntimeService over its
// Unix socket: containerd /run/containerd/containerd.sock, CRI-O
// /var/run/crio/crio.sock). The pod UID comes from the kernel (cgroup);
// namespace, name and annotations from the runtime's pod sandbox with that
// UID. Sandboxes are cached and re-listed on a miss (at most every 500 ms).
// Processes outside pods go to the fallback source.
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

  const std::string socket_;
  std::unique_ptr<PodSource> fallback_;
  std::unique_ptr<runtime::v1::RuntimeService::Stub> stub_;
  absl::Mutex mu_;  // the cache
  std::map<std::string, PodInfo> by_uid_ ABSL_GUARDED_BY(mu_);
  absl::Time last_refresh_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace podlink
