// The broker's part of NCCL native mode: joining a group, syncing its IPC
// sockets, leaving.
#include "daemon/broker/broker.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>
#include <openssl/sha.h>

#include <cerrno>
#include <fstream>

#include "absl/strings/string_view.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/fd_channel.h"
#include "common/pci.h"
#include "common/status_util.h"
#include "daemon/gpu/host_backend.h"
#include "daemon/identity/standalone_source.h"
#include "daemon/ncclipc/shm_mount.h"
#include "daemon/policy/policy.h"
#include "common/log.h"
#include "daemon/metrics/process_metrics.h"

namespace podlink {
namespace {
const ComponentLog NativeLog("broker");
}  // namespace

namespace {

constexpr char kNcclNativeAnnotation[] = "podlink.io/nccl-native";

std::string ShortHash(const std::string& s) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d);
  std::string out;
  for (int i = 0; i < 8; ++i) absl::StrAppendFormat(&out, "%02x", d[i]);
  return out;
}

}  // namespace

absl::StatusOr<v1::JoinNcclNativeResponse> Broker::JoinNcclNative(Session& s) {
  v1::JoinNcclNativeResponse r;
  const PodInfo& pod = s.pod;
  auto want = pod.annotations.find(kNcclNativeAnnotation);
  if (want == pod.annotations.end() || want->second != "true") {
    // Not asked for: the plugin stays on the relay without a warning.
    return r;
  }
  if (!options_.nccl_native.enabled) {
    return absl::FailedPreconditionError(absl::StrCat("pod ", pod.Ref(), " asks for NCCL native mode (", kNcclNativeAnnotation,
                                                      "), but podlinkd on this node has nccl_native.enabled=false"));
  }
  if (pod.PeerGroup().empty()) {
    return absl::PermissionDeniedError(absl::StrCat("pod ", pod.Ref(), " asks for NCCL native mode but has no ",
                                                    kPeerGroupAnnotation, " annotation: native mode joins only the ",
                                                    "pods of one peer group"));
  }
  // Direct mode: the pod can open every GPU's device node (the
  // podlink.io/peer-direct resource); NCCL's P2P maps the peers' memory itself.
  for (const auto& g : inventory_.gpus) {
    if (g.device_node.empty()) continue;
    struct stat host {}, seen {};
    if (::stat(g.device_node.c_str(), &host) != 0) continue;
    std::string in_pod = absl::StrCat("/proc/", s.peer.pid, "/root", g.device_node);
    if (::stat(in_pod.c_str(), &seen) != 0 || !S_ISCHR(seen.st_mode) || seen.st_rdev != host.st_rdev) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pod ", pod.Ref(), " asks for NCCL native mode but cannot open ", g.device_node,
          ": native mode needs direct mode (request the podlink.io/peer-direct resource instead of podlink.io/peer)"));
    }
  }
  const std::string group = absl::StrCat(pod.namespace_, "/", pod.PeerGroup());
  UniqueFd netns(::open(absl::StrCat("/proc/", s.peer.pid, "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
  if (!netns) return ErrnoStatus(errno, "open the pod's network namespace");
  // The pid still names the session's process (not a reused pid).
  if (s.peer.pidfd.valid() && !PidfdAlive(s.peer.pidfd.get())) {
    return absl::FailedPreconditionError("the calling process exited");
  }
  absl::MutexLock l(&nccl_mu_);
  if (nccl_bridge_ == nullptr) {
    PODLINK_ASSIGN_OR_RETURN(nccl_bridge_, ncclipc::Bridge::Start(options_.nccl_native.bridge));
  }
  // The group's /dev/shm: NCCL picks P2P only between ranks whose /dev/shm
  // is one filesystem.
  const std::string shm = absl::StrCat(options_.nccl_native.shm_dir, "/", ShortHash(group));
  if (::mkdir(options_.nccl_native.shm_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", options_.nccl_native.shm_dir));
  }
  PODLINK_ASSIGN_OR_RETURN(dev_t group_dev, ncclipc::EnsureTmpfs(shm, options_.nccl_native.shm_size_bytes));
  auto seen = ncclipc::DeviceSeenBy(s.peer.pid, "/dev/shm");
  if (!seen.ok() || *seen != group_dev) {
    PODLINK_RETURN_IF_ERROR(ncclipc::MountInto(s.peer.pid, shm, "/dev/shm"));
    r.set_shm_mounted(true);
  }
  ncclipc::Bridge::Member m;
  m.session = s.id;
  m.group = group;
  m.pod = pod.Ref();
  m.netns = std::move(netns);
  absl::Status joined = nccl_bridge_->Join(std::move(m));
  if (!joined.ok()) {
    if (nccl_groups_[group].empty()) {
      nccl_groups_.erase(group);
      ncclipc::RemoveTmpfs(shm);
    }
    return joined;
  }
  nccl_groups_[group].insert(s.id);
  r.set_host_id(absl::StrCat("podlink-", node_id_, "-", ShortHash(group)));
  r.set_members(static_cast<uint32_t>(nccl_bridge_->members()));
  NativeLog()->info("event=nccl_native_join session={} pod={} group={} shm_mounted={}", s.id, pod.Ref(), LogQuoted(group),
              r.shm_mounted());
  return r;
}

absl::StatusOr<v1::SyncNcclIpcResponse> Broker::SyncNcclIpc(Session& s) {
  ncclipc::Bridge* b = nullptr;
  {
    absl::MutexLock l(&nccl_mu_);
    b = nccl_bridge_.get();
  }
  if (b == nullptr) return absl::FailedPreconditionError("this session has not joined NCCL native mode");
  PODLINK_RETURN_IF_ERROR(b->Sync(s.id));
  v1::SyncNcclIpcResponse r;
  r.set_mirrors(static_cast<uint32_t>(b->mirrors()));
  return r;
}

void Broker::LeaveNcclNative(uint64_t session_id) {
  absl::MutexLock l(&nccl_mu_);
  if (nccl_bridge_ == nullptr) return;
  for (auto it = nccl_groups_.begin(); it != nccl_groups_.end(); ++it) {
    if (it->second.erase(session_id) == 0) continue;
    // Only sessions that joined wait for the bridge's thread.
    nccl_bridge_->Leave(session_id);
    if (it->second.empty()) {
      // Members that still run keep their mount; the next joiner gets a new tmpfs.
      ncclipc::RemoveTmpfs(absl::StrCat(options_.nccl_native.shm_dir, "/", ShortHash(it->first)));
      nccl_groups_.erase(it);
    }
    break;
  }
}

}  // namespace podlink
