// Where pod metadata (namespace, name, annotations) comes from. The
// standalone source reads a config file; the container-runtime (CRI) source
// asks the node's runtime. Sources only ever see kernel-derived input.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/identity/peer_identity.h"

namespace podlink {

inline constexpr char kPeerGroupAnnotation[] = "podlink.io/peer-group";

struct PodInfo {
  std::string key;        // identity used for "same pod": pod UID, or uid+cgroup
  std::string uid;        // pod UID when known
  std::string namespace_;
  std::string name;
  std::map<std::string, std::string> annotations;
  std::string source;     // "standalone", "cri", ...
  std::string node;       // a pod of another node: the node whose daemon speaks for it

  std::string Ref() const { return namespace_ + "/" + name; }
  std::string PeerGroup() const {
    auto it = annotations.find(kPeerGroupAnnotation);
    return it == annotations.end() ? "" : it->second;
  }
};

// Error texts of Resolve reach the client they are about (the descriptor
// channel's goodbye): they may name that client's own cgroup and pod, never
// another pod. Details about others go to podlinkd's log.
class PodSource {
 public:
  virtual ~PodSource() = default;
  // May wait for an outside service (the container runtime), up to its deadline.
  virtual absl::StatusOr<PodInfo> Resolve(const PeerIdentity& peer) = 0;
  // The answer when it is known without waiting for anything (a cache hit, a
  // final refusal); nullopt when only Resolve can tell.
  virtual std::optional<absl::StatusOr<PodInfo>> ResolveCached(const PeerIdentity& peer) { return Resolve(peer); }
  // OK while the source can identify new pods; otherwise why not.
  virtual absl::Status Ready() const { return absl::OkStatus(); }
  // Prometheus text for the source's own metrics ("" for none).
  virtual std::string RenderMetrics() const { return ""; }
};

}  // namespace podlink
