#include "daemon/identity/cri_source.h"

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "grpcpp/grpcpp.h"

namespace podlink {

std::string CriPodSource::DefaultSocket() {
  if (::access("/run/containerd/containerd.sock", F_OK) == 0) return "/run/containerd/containerd.sock";
  return "/var/run/crio/crio.sock";
}

CriPodSource::CriPodSource(std::string socket, std::unique_ptr<PodSource> fallback)
    : socket_(std::move(socket)),
      fallback_(std::move(fallback)),
      stub_(runtime::v1::RuntimeService::NewStub(
          grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()))) {}

absl::Status CriPodSource::Refresh() {
  // One deadline for both lists: a slow runtime holds the cache lock at most 3 s.
  auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(3);
  grpc::ClientContext sandbox_ctx, container_ctx;
  sandbox_ctx.set_deadline(deadline);
  container_ctx.set_deadline(deadline);
  runtime::v1::ListPodSandboxResponse sandboxes;
  runtime::v1::ListContainersResponse containers;
  const char* listing = "pod sandboxes";
  grpc::Status st = stub_->ListPodSandbox(&sandbox_ctx, runtime::v1::ListPodSandboxRequest(), &sandboxes);
  if (st.ok()) {
    listing = "containers";
    st = stub_->ListContainers(&container_ctx, runtime::v1::ListContainersRequest(), &containers);
  }
  last_refresh_ = absl::Now();
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("container runtime at ", socket_, " did not list ", listing, ": ", st.error_message()));
  }
  std::map<std::string, std::pair<PodInfo, std::pair<bool, uint32_t>>> best;  // uid -> (pod, (ready, attempt))
  std::map<std::string, std::string> sandbox_uid;
  for (const auto& sb : sandboxes.items()) {
    const auto& md = sb.metadata();
    if (md.uid().empty() || md.name().empty() || md.namespace_().empty()) continue;
    sandbox_uid[absl::AsciiStrToLower(sb.id())] = md.uid();
    std::pair<bool, uint32_t> rank{sb.state() == runtime::v1::SANDBOX_READY, md.attempt()};
    auto it = best.find(md.uid());
    if (it != best.end() && it->second.second >= rank) continue;  // keep the ready, newest sandbox
    PodInfo p;
    p.uid = md.uid();
    p.namespace_ = md.namespace_();
    p.name = md.name();
    for (const auto& [k, v] : sb.annotations()) p.annotations[k] = v;
    p.source = "cri";
    best[md.uid()] = {std::move(p), rank};
  }
  // Containers in every state are kept, CONTAINER_EXITED included: the pod a
  // container belongs to never changes and ids are never reused, so the entry
  // stays true, and a client still exiting with its container is not refused
  // for it. Whether the process is alive is the pidfd's business, not this.
  std::map<std::string, std::string> container_sandbox;
  for (const auto& c : containers.containers()) {
    if (!c.id().empty()) container_sandbox[absl::AsciiStrToLower(c.id())] = absl::AsciiStrToLower(c.pod_sandbox_id());
  }
  by_uid_.clear();
  for (auto& [uid, v] : best) by_uid_[uid] = std::move(v.first);
  sandbox_uid_ = std::move(sandbox_uid);
  container_sandbox_ = std::move(container_sandbox);
  return absl::OkStatus();
}

std::string CriPodSource::OwnerUid(const std::string& container_id) const {
  auto c = container_sandbox_.find(container_id);
  // Not a container: perhaps a sandbox, in its own (pause container's) cgroup.
  const std::string& sandbox = c == container_sandbox_.end() ? container_id : c->second;
  auto s = sandbox_uid_.find(sandbox);
  return s == sandbox_uid_.end() ? "" : s->second;
}

absl::StatusOr<PodInfo> CriPodSource::Resolve(const PeerIdentity& peer) {
  if (!peer.cgroup.in_pod()) return fallback_->Resolve(peer);
  const std::string& uid = peer.cgroup.pod_uid;
  const std::string& container = peer.cgroup.container_id;  // lowercase, as the keys of container_sandbox_
  if (container.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the client's cgroup ", peer.cgroup.path, " is pod ", uid, "'s own cgroup, in none of its containers; ",
        "the kubelet never runs processes there: run the client in one of the pod's containers"));
  }
  absl::MutexLock l(&mu_);
  auto pod = by_uid_.find(uid);
  std::string owner = OwnerUid(container);
  if ((pod == by_uid_.end() || owner.empty()) && absl::Now() - last_refresh_ >= absl::Milliseconds(500)) {
    PODLINK_RETURN_IF_ERROR(Refresh());
    pod = by_uid_.find(uid);
    owner = OwnerUid(container);
  }
  auto describe = [&](const std::string& u) {
    auto it = by_uid_.find(u);
    return it == by_uid_.end() ? absl::StrCat("uid ", u) : absl::StrCat(it->second.Ref(), " (uid ", u, ")");
  };
  // A container never changes pods, so a disagreement found in the cache is final.
  if (!owner.empty() && owner != uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the client's cgroup ", peer.cgroup.path, " names pod ", describe(uid), ", but the container runtime at ",
        socket_, " lists its container ", container, " under pod ", describe(owner),
        "; podlinkd identifies a client only when its cgroup's pod and container agree: run the client in a "
        "container of its own pod, not in a cgroup made for, or moved into, another pod's"));
  }
  if (pod == by_uid_.end()) {
    return absl::UnavailableError(absl::StrCat("pod ", uid, " (from the client's cgroup) is not known to the ",
                                               "container runtime at ", socket_));
  }
  if (owner.empty()) {
    return absl::UnavailableError(absl::StrCat("container ", container, " (from the client's cgroup) of pod ",
                                               describe(uid), " is not known to the container runtime at ", socket_,
                                               "; retry once the runtime lists it"));
  }
  return pod->second;  // the broker sets the identity key from the kernel's facts
}

}  // namespace podlink
