// Standalone pod source: identity = Unix uid + cgroup; names and annotations
// from a JSON config file (docs/usage.md):
//
//   {"pods": [
//     {"match": {"pod_uid": "...", "cgroup_prefix": "/x", "uid": 1000},
//      "namespace": "default", "name": "prefill-0",
//      "annotations": {"podlink.io/peer-group": "job-7"}}]}
//
// Every key of "match" that is present must match; the first entry wins.
// Unmatched clients get namespace "standalone", a name derived from their
// identity, and no annotations (so deny-by-default applies to them).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/identity/pod_source.h"

namespace podlink {

struct StandalonePodRule {
  std::optional<std::string> pod_uid;
  std::optional<std::string> cgroup_prefix;
  std::optional<uint32_t> uid;
  std::string namespace_;
  std::string name;
  std::map<std::string, std::string> annotations;
};

class StandalonePodSource : public PodSource {
 public:
  explicit StandalonePodSource(std::vector<StandalonePodRule> rules) : rules_(std::move(rules)) {}

  // Parses the "pods" array of a config document. INVALID_ARGUMENT names the
  // offending entry.
  static absl::StatusOr<std::vector<StandalonePodRule>> ParseRules(const std::string& json_text);

  absl::StatusOr<PodInfo> Resolve(const PeerIdentity& peer) override;

 private:
  std::vector<StandalonePodRule> rules_;
};

// The key the same-pod rule compares: pod UID (from the kubelet's cgroup)
// and Unix uid; uid and cgroup path outside Kubernetes.
std::string IdentityKey(const PeerIdentity& peer);

}  // namespace podlink
