// Where pod metadata (namespace, name, annotations) comes from. The
// standalone source reads a config file; the container-runtime (CRI) source
// arrives with Kubernetes support. Sources only ever see kernel-derived input.
#pragma once

#include <map>
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

  std::string Ref() const { return namespace_ + "/" + name; }
  std::string PeerGroup() const {
    auto it = annotations.find(kPeerGroupAnnotation);
    return it == annotations.end() ? "" : it->second;
  }
};

class PodSource {
 public:
  virtual ~PodSource() = default;
  virtual absl::StatusOr<PodInfo> Resolve(const PeerIdentity& peer) = 0;
};

}  // namespace podlink
