#include "daemon/identity/cri_source.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/metrics/metrics.h"
#include "grpcpp/grpcpp.h"

namespace podlink {
namespace {

const ComponentLog CriLog("identity");

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  return std::chrono::system_clock::now() + absl::ToChronoNanoseconds(t - absl::Now());
}

std::string Lower(const std::string& s) { return absl::AsciiStrToLower(s); }

}  // namespace

std::string CriPodSource::DefaultSocket() {
  if (::access("/run/containerd/containerd.sock", F_OK) == 0) return "/run/containerd/containerd.sock";
  return "/var/run/crio/crio.sock";
}

CriPodSource::CriPodSource(std::string socket, std::unique_ptr<PodSource> fallback, CriOptions options)
    : socket_(std::move(socket)), options_(options), fallback_(std::move(fallback)) {
  // gRPC's default reconnect backoff grows to two minutes: after a runtime
  // restart new pods would be refused that long. The runtime is local; try
  // again within a second.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  stub_ = runtime::v1::RuntimeService::NewStub(
      grpc::CreateCustomChannel("unix:" + socket_, grpc::InsecureChannelCredentials(), args));
  for (const char* r : {"ok", "error"}) calls_[r] = 0;
  for (const char* r : {"cached", "looked_up", "refused", "unknown", "runtime_error"}) resolves_[r] = 0;
  prober_ = std::thread([this] { Probe(); });
}

CriPodSource::~CriPodSource() {
  stop_.Notify();
  prober_.join();
}

template <typename Req, typename Resp, typename Method>
grpc::Status CriPodSource::Call(Method method, const Req& req, Resp* resp, absl::Time deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(ToChrono(deadline));
  ctx.set_wait_for_ready(true);  // a channel reconnecting after a runtime restart is waited for, not failed
  grpc::Status st = (stub_.get()->*method)(&ctx, req, resp);
  absl::MutexLock l(&mu_);
  ++calls_[st.ok() ? "ok" : "error"];
  return st;
}

// Readiness follows the prober's Version calls only: one slow lookup on a busy
// node does not make podlinkd unready, and a runtime that answers everything
// with UNIMPLEMENTED (no CRI v1) does not make it ready.
void CriPodSource::Probe() {
  do {
    runtime::v1::VersionRequest req;
    req.set_version("v1");
    runtime::v1::VersionResponse resp;
    grpc::Status st = Call(&runtime::v1::RuntimeService::Stub::Version, req, &resp, absl::Now() + options_.deadline);
    std::string error;
    if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      error = "it does not serve the CRI v1 RuntimeService (containerd >= 1.6, CRI-O >= 1.20 do): " +
              st.error_message();
    } else if (!st.ok()) {
      error = st.error_message();
    }
    bool changed;
    std::string name = absl::StrCat(resp.runtime_name(), " ", resp.runtime_version());
    {
      absl::MutexLock l(&mu_);
      changed = reached_ != error.empty() || runtime_error_ != error;
      reached_ = error.empty();
      if (reached_) {
        answered_once_ = true;
        runtime_name_ = name;
      }
      runtime_error_ = error;
    }
    if (changed && error.empty()) {  // logged without the lock: a slow log sink must not hold up lookups
      CriLog()->info("event=container_runtime_reached socket={} runtime={}", socket_, LogQuoted(name));
    } else if (changed) {
      CriLog()->warn("event=container_runtime_unreachable socket={} error={}", socket_, LogQuoted(error));
    }
  } while (!stop_.WaitForNotificationWithTimeout(options_.probe_interval));
}

absl::Status CriPodSource::Ready() const {
  absl::MutexLock l(&mu_);
  if (reached_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("container runtime at ", socket_,
                                             answered_once_ ? " stopped answering: " : " not reached: ",
                                             runtime_error_.empty() ? "no answer yet" : runtime_error_));
}

std::string CriPodSource::RenderMetrics() const {
  absl::MutexLock l(&mu_);
  std::string out;
  RenderFamily(&out, "podlink_container_runtime_up", "gauge",
               "1 while the container runtime answers (pod source cri)", {{"", reached_ ? 1.0 : 0.0}});
  RenderFamily(&out, "podlink_container_runtime_calls_total", "counter", "calls to the container runtime, by result",
               calls_, "result");
  RenderFamily(&out, "podlink_pod_resolutions_total", "counter",
               "clients in pods identified through the runtime, by outcome", resolves_, "outcome");
  RenderFamily(&out, "podlink_pod_cache_pods", "gauge", "pods cached from the container runtime",
               {{"", static_cast<double>(pods_.size())}});
  return out;
}

std::optional<absl::StatusOr<PodInfo>> CriPodSource::Decide(const PeerIdentity& peer, std::string* warn) {
  const std::string& uid = peer.cgroup.pod_uid;
  const std::string& container = peer.cgroup.container_id;  // lowercase, as the cache's ids
  auto o = owner_.find(container);
  if (o == owner_.end()) return RecentFailure(uid);
  if (o->second != uid) {
    // A container never changes pods: final. The other pod is named in the
    // log only (once per pod every 10 s); the client learns nothing about it.
    absl::Time& last = warned_[uid];
    if (absl::Now() - last >= absl::Seconds(10)) {
      last = absl::Now();
      *warn = absl::StrCat("event=cgroup_pod_mismatch pid=", peer.pid, " cgroup=", LogQuoted(peer.cgroup.path),
                           " cgroup_pod=", uid, " container=", container, " runtime_uid=", o->second);
    }
    if (warned_.size() > 4096) warned_.clear();
    ++resolves_["refused"];
    return absl::StatusOr<PodInfo>(absl::PermissionDeniedError(absl::StrCat(
        "the client's cgroup ", peer.cgroup.path, " names pod ", uid, ", but the container runtime at ", socket_,
        " lists its container ", container, " under another pod; podlinkd identifies a client only when its "
        "cgroup's pod and container agree: run the client in a container of its own pod, not in a cgroup made "
        "for, or moved into, another pod's")));
  }
  auto p = pods_.find(uid);
  if (p == pods_.end()) return RecentFailure(uid);
  p->second.used = ++clock_;
  return absl::StatusOr<PodInfo>(p->second.pod);  // the broker sets the identity key from the kernel's facts
}

std::optional<absl::StatusOr<PodInfo>> CriPodSource::RecentFailure(const std::string& uid) {
  auto f = failed_.find(uid);
  if (f == failed_.end()) return std::nullopt;
  if (absl::Now() < f->second.until) return absl::StatusOr<PodInfo>(f->second.status);
  failed_.erase(f);
  return std::nullopt;
}

absl::Status CriPodSource::LookUp(const std::string& uid, const std::string& container) {
  using Stub = runtime::v1::RuntimeService::Stub;
  auto failed = [&](const char* what, const grpc::Status& st) {
    return absl::UnavailableError(absl::StrCat("the container runtime at ", socket_, " did not list ", what,
                                               " of pod ", uid, ": ", st.error_message()));
  };
  // One deadline for the whole lookup (up to four calls): a stalled runtime holds a client that long at most.
  const absl::Time deadline = absl::Now() + options_.deadline;
  runtime::v1::ListPodSandboxRequest sreq;
  (*sreq.mutable_filter()->mutable_label_selector())[kPodUidLabel] = uid;
  runtime::v1::ListPodSandboxResponse sandboxes;
  if (grpc::Status st = Call(&Stub::ListPodSandbox, sreq, &sandboxes, deadline); !st.ok()) {
    return failed("the sandboxes", st);
  }
  runtime::v1::ListContainersRequest creq;
  (*creq.mutable_filter()->mutable_label_selector())[kPodUidLabel] = uid;
  runtime::v1::ListContainersResponse containers;
  if (grpc::Status st = Call(&Stub::ListContainers, creq, &containers, deadline); !st.ok()) {
    return failed("the containers", st);
  }

  CachedPod fresh;
  std::pair<bool, uint32_t> best{false, 0};
  bool found = false;
  for (const auto& sb : sandboxes.items()) {
    const auto& md = sb.metadata();
    // The label selected it; the metadata must agree (a runtime that ignores filters lists every pod).
    if (md.uid() != uid || md.name().empty() || md.namespace_().empty() || sb.id().empty()) continue;
    fresh.ids.insert(Lower(sb.id()));
    std::pair<bool, uint32_t> rank{sb.state() == runtime::v1::SANDBOX_READY, md.attempt()};
    if (found && rank <= best) continue;  // keep the ready, newest sandbox
    found = true;
    best = rank;
    fresh.pod = PodInfo{};
    fresh.pod.uid = uid;
    fresh.pod.namespace_ = md.namespace_();
    fresh.pod.name = md.name();
    for (const auto& [k, v] : sb.annotations()) fresh.pod.annotations[k] = v;
    fresh.pod.source = "cri";
  }
  // Containers in every state count, CONTAINER_EXITED included: the pod a
  // container belongs to never changes and ids are never reused, so a client
  // still exiting with its container is not refused for it.
  for (const auto& c : containers.containers()) {
    if (!c.id().empty() && fresh.ids.count(Lower(c.pod_sandbox_id())) != 0) fresh.ids.insert(Lower(c.id()));
  }

  // Not this pod's: whose, then? A container of another pod (its labels say
  // which), or another pod's sandbox.
  std::string other;
  if (!container.empty() && fresh.ids.count(container) == 0) {
    runtime::v1::ListContainersRequest q;
    q.mutable_filter()->set_id(container);
    runtime::v1::ListContainersResponse r;
    if (grpc::Status st = Call(&Stub::ListContainers, q, &r, deadline); !st.ok()) {
      return failed("the owner of a container", st);
    }
    std::string sandbox;
    for (const auto& c : r.containers()) {
      if (Lower(c.id()) != container) continue;
      auto label = c.labels().find(kPodUidLabel);
      if (label != c.labels().end()) other = label->second;
      sandbox = c.pod_sandbox_id();
    }
    // The sandbox: the container's, or the container id is a sandbox's own.
    const std::string sandbox_id = Lower(sandbox.empty() ? container : sandbox);
    runtime::v1::ListPodSandboxRequest sq;
    sq.mutable_filter()->set_id(sandbox_id);
    runtime::v1::ListPodSandboxResponse sr;
    if (grpc::Status st = Call(&Stub::ListPodSandbox, sq, &sr, deadline); !st.ok()) {
      return failed("the owner of a sandbox", st);
    }
    std::string other_ref;
    for (const auto& sb : sr.items()) {
      if (Lower(sb.id()) != sandbox_id) continue;
      if (other.empty()) other = sb.metadata().uid();
      other_ref = absl::StrCat(sb.metadata().namespace_(), "/", sb.metadata().name());
    }
    if (!other.empty() && other != uid) {
      CriLog()->warn("event=container_of_another_pod cgroup_pod={} container={} runtime_pod={} runtime_uid={}", uid,
                  container, LogQuoted(other_ref), other);
    }
  }

  absl::MutexLock l(&mu_);
  if (auto old = pods_.find(uid); old != pods_.end()) {
    for (const std::string& id : old->second.ids) {
      if (auto o = owner_.find(id); o != owner_.end() && o->second == uid) owner_.erase(o);
    }
    pods_.erase(old);
  }
  if (found) {
    for (const std::string& id : fresh.ids) owner_[id] = uid;
    fresh.used = ++clock_;
    pods_[uid] = std::move(fresh);
  }
  if (!other.empty() && other != uid) owner_[container] = other;
  Evict();
  return absl::OkStatus();
}

void CriPodSource::Evict() {
  while (pods_.size() > options_.max_cached_pods) {
    auto lru = std::min_element(pods_.begin(), pods_.end(),
                                [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
    for (const std::string& id : lru->second.ids) {
      if (auto o = owner_.find(id); o != owner_.end() && o->second == lru->first) owner_.erase(o);
    }
    pods_.erase(lru);
  }
  // Containers seen under pods that are not cached (refusals) are forgotten
  // in bulk once they outnumber what the cached pods could hold.
  if (owner_.size() > 16 * options_.max_cached_pods + 1024) {
    owner_.clear();
    for (const auto& [uid, p] : pods_) {
      for (const std::string& id : p.ids) owner_[id] = uid;
    }
  }
}

std::optional<absl::StatusOr<PodInfo>> CriPodSource::ResolveCached(const PeerIdentity& peer) {
  if (!peer.cgroup.in_pod()) return fallback_->ResolveCached(peer);
  if (peer.cgroup.container_id.empty()) return Resolve(peer);  // refused without asking anyone
  std::string warn;
  std::optional<absl::StatusOr<PodInfo>> d;
  {
    absl::MutexLock l(&mu_);
    d = Decide(peer, &warn);
    if (d && d->ok()) ++resolves_["cached"];
  }
  if (!warn.empty()) CriLog()->warn("{}", warn);
  return d;
}

absl::StatusOr<PodInfo> CriPodSource::Resolve(const PeerIdentity& peer) {
  if (!peer.cgroup.in_pod()) return fallback_->Resolve(peer);
  const std::string& uid = peer.cgroup.pod_uid;
  const std::string& container = peer.cgroup.container_id;
  std::string warn;
  absl::Cleanup log_warning = [&warn] {
    if (!warn.empty()) CriLog()->warn("{}", warn);  // after the lock is released
  };
  if (container.empty()) {
    absl::MutexLock l(&mu_);
    ++resolves_["refused"];
    return absl::PermissionDeniedError(absl::StrCat(
        "the client's cgroup ", peer.cgroup.path, " is pod ", uid, "'s own cgroup, in none of its containers; ",
        "the kubelet never runs processes there: run the client in one of the pod's containers"));
  }
  bool looked_up = false;
  for (int round = 0; round < 2 && !looked_up; ++round) {
    std::shared_ptr<absl::Notification> mine, theirs;
    {
      absl::MutexLock l(&mu_);
      if (std::optional<absl::StatusOr<PodInfo>> d = Decide(peer, &warn)) {
        if (d->ok()) ++resolves_[round == 0 ? "cached" : "looked_up"];
        return *std::move(d);
      }
      auto it = inflight_.find(uid);
      if (it != inflight_.end()) {
        theirs = it->second;
      } else {
        mine = std::make_shared<absl::Notification>();
        inflight_[uid] = mine;
      }
    }
    if (theirs) {  // another client of this pod is asking already: share its answer (or its failure)
      theirs->WaitForNotificationWithTimeout(options_.deadline + absl::Seconds(1));
      continue;
    }
    absl::Status st;
    {
      absl::Cleanup done = [&] {  // whatever happens, waiters are released
        absl::MutexLock l(&mu_);
        inflight_.erase(uid);
        if (!st.ok()) {
          ++resolves_["runtime_error"];
          // Clients of this pod queued behind this one get the same answer at once, not a lookup each.
          failed_[uid] = Failure{st, absl::Now() + kFailureMemory};
          if (failed_.size() > 4096) failed_.clear();
        } else {
          failed_.erase(uid);
        }
        mine->Notify();
      };
      st = LookUp(uid, container);
    }
    if (!st.ok()) return st;
    looked_up = true;
  }
  absl::MutexLock l(&mu_);
  if (std::optional<absl::StatusOr<PodInfo>> d = Decide(peer, &warn)) {
    if (d->ok()) ++resolves_["looked_up"];
    return *std::move(d);
  }
  ++resolves_["unknown"];
  auto pod = pods_.find(uid);
  if (pod == pods_.end()) {
    return absl::UnavailableError(absl::StrCat("pod ", uid, " (from the client's cgroup) is not known to the ",
                                               "container runtime at ", socket_, "; retry once the pod is running"));
  }
  return absl::UnavailableError(absl::StrCat("container ", container, " (from the client's cgroup) of pod ",
                                             pod->second.pod.Ref(), " is not listed by the container runtime at ",
                                             socket_, "; retry once it is running"));
}

}  // namespace podlink
