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
// runtime does not list is UNAVAILABLE (it may be starting).
//
// Lookups: pods are cached with their sandboxes and containers. A miss asks
// the runtime about that pod only (ListPodSandbox and ListContainers with the
// kubelet's io.kubernetes.pod.uid label), without holding the cache lock, so
// a slow runtime delays only the clients of pods not yet cached; concurrent
// misses for one pod share one lookup. A new container of a cached pod (a
// restart, or a re-created sandbox with new annotations) is a miss too, and
// refreshes the pod. A lookup the runtime did not answer is the answer for
// that pod for a second. The gRPC channel reconnects within a second after a
// runtime restart, and a prober asks the runtime's Version every few seconds
// so that Ready() and the metrics say whether it answers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cri/runtime/v1/api.grpc.pb.h"
#include "daemon/identity/pod_source.h"

namespace podlink {

inline constexpr char kPodUidLabel[] = "io.kubernetes.pod.uid";

struct CriOptions {
  absl::Duration deadline = absl::Seconds(3);         // per lookup (and per probe)
  absl::Duration probe_interval = absl::Seconds(5);   // Version, for Ready() and the metrics
  size_t max_cached_pods = 4096;                       // least recently used pods leave first
};

class CriPodSource : public PodSource {
 public:
  CriPodSource(std::string socket, std::unique_ptr<PodSource> fallback, CriOptions options = {});
  ~CriPodSource() override;  // stops the prober

  absl::StatusOr<PodInfo> Resolve(const PeerIdentity& peer) override;
  std::optional<absl::StatusOr<PodInfo>> ResolveCached(const PeerIdentity& peer) override;
  absl::Status Ready() const override;
  std::string RenderMetrics() const override;

  // The runtime socket to use when none is configured: containerd's, else CRI-O's.
  static std::string DefaultSocket();

 private:
  struct CachedPod {
    PodInfo pod;                   // from the pod's ready, newest sandbox
    std::set<std::string> ids;     // its sandboxes and containers (lowercase)
    uint64_t used = 0;             // lookup clock, for eviction
  };
  // What the cache says of (uid, container): a pod, a final refusal, or nullopt (ask the runtime).
  // A warning to log (after unlocking) goes to *warn.
  std::optional<absl::StatusOr<PodInfo>> Decide(const PeerIdentity& peer, std::string* warn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A miss: nullopt, or the failure of this pod's lookup if it was moments ago.
  std::optional<absl::StatusOr<PodInfo>> RecentFailure(const std::string& uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the runtime about pod `uid` (and, if it does not list `container`, whom
  // the container belongs to) and updates the cache. Holds no lock while it waits.
  absl::Status LookUp(const std::string& uid, const std::string& container) ABSL_LOCKS_EXCLUDED(mu_);
  // One runtime call, counted, its outcome recorded as the runtime's reachability.
  template <typename Req, typename Resp, typename Method>
  grpc::Status Call(Method method, const Req& req, Resp* resp, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void Probe();
  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string socket_;
  const CriOptions options_;
  std::unique_ptr<PodSource> fallback_;
  std::unique_ptr<runtime::v1::RuntimeService::Stub> stub_;

  mutable absl::Mutex mu_;
  std::map<std::string, CachedPod> pods_ ABSL_GUARDED_BY(mu_);       // pod uid -> pod
  std::map<std::string, std::string> owner_ ABSL_GUARDED_BY(mu_);    // sandbox/container id -> pod uid
  std::map<std::string, std::shared_ptr<absl::Notification>> inflight_ ABSL_GUARDED_BY(mu_);  // uid -> its lookup
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  // A lookup that failed (the runtime did not answer) is the answer for that
  // pod's next clients for a moment, so a queue of them does not ask again each.
  struct Failure {
    absl::Status status;
    absl::Time until;
  };
  static constexpr absl::Duration kFailureMemory = absl::Seconds(1);
  std::map<std::string, Failure> failed_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> warned_ ABSL_GUARDED_BY(mu_);  // pod uid -> last mismatch warning

  // The runtime's reachability, from the prober's last Version call.
  bool reached_ ABSL_GUARDED_BY(mu_) = false;
  bool answered_once_ ABSL_GUARDED_BY(mu_) = false;
  std::string runtime_error_ ABSL_GUARDED_BY(mu_) = "not asked yet";
  std::string runtime_name_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> calls_ ABSL_GUARDED_BY(mu_);    // result -> count
  std::map<std::string, double> resolves_ ABSL_GUARDED_BY(mu_); // outcome -> count

  absl::Notification stop_;
  std::thread prober_;
};

}  // namespace podlink
