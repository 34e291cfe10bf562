#include "daemon/identity/cri_source.h"

#include <unistd.h>

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
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  runtime::v1::ListPodSandboxRequest req;
  runtime::v1::ListPodSandboxResponse resp;
  grpc::Status st = stub_->ListPodSandbox(&ctx, req, &resp);
  last_refresh_ = absl::Now();
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("container runtime at ", socket_,
                                               " did not list pod sandboxes: ", st.error_message()));
  }
  std::map<std::string, std::pair<PodInfo, std::pair<bool, uint32_t>>> best;  // uid -> (pod, (ready, attempt))
  for (const auto& sb : resp.items()) {
    const auto& md = sb.metadata();
    if (md.uid().empty() || md.name().empty() || md.namespace_().empty()) continue;
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
  by_uid_.clear();
  for (auto& [uid, v] : best) by_uid_[uid] = std::move(v.first);
  return absl::OkStatus();
}

absl::StatusOr<PodInfo> CriPodSource::Resolve(const PeerIdentity& peer) {
  if (!peer.cgroup.in_pod()) return fallback_->Resolve(peer);
  const std::string& uid = peer.cgroup.pod_uid;
  absl::MutexLock l(&mu_);
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end() && absl::Now() - last_refresh_ >= absl::Milliseconds(500)) {
    PODLINK_RETURN_IF_ERROR(Refresh());
    it = by_uid_.find(uid);
  }
  if (it == by_uid_.end()) {
    return absl::UnavailableError(absl::StrCat("pod ", uid, " (from the client's cgroup) is not known to the ",
                                               "container runtime at ", socket_));
  }
  return it->second;  // the broker sets the identity key from the kernel's facts
}

}  // namespace podlink
