#include "daemon/identity/standalone_source.h"

#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace podlink {

std::string IdentityKey(const PeerIdentity& peer) {
  // The Unix uid is part of every key: two processes of one pod that run as
  // different users are not "the same pod" for the same-pod rule.
  if (peer.cgroup.in_pod()) return absl::StrCat("pod:", peer.cgroup.pod_uid, "/uid:", peer.uid);
  return absl::StrCat("uid:", peer.uid, "@", peer.cgroup.path);
}

absl::StatusOr<std::vector<StandalonePodRule>> StandalonePodSource::ParseRules(
    const std::string& json_text) {
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("config is not valid JSON");
  std::vector<StandalonePodRule> rules;
  if (!doc.contains("pods")) return rules;
  if (!doc["pods"].is_array()) return absl::InvalidArgumentError("config: \"pods\" must be an array");
  size_t i = 0;
  for (const auto& p : doc["pods"]) {
    std::string where = absl::StrCat("config: pods[", i++, "]");
    if (!p.is_object()) return absl::InvalidArgumentError(where + " must be an object");
    for (auto it = p.begin(); it != p.end(); ++it) {
      if (it.key() != "match" && it.key() != "namespace" && it.key() != "name" && it.key() != "annotations") {
        return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key \"", it.key(),
                                                       "\" (match, namespace, name, annotations)"));
      }
    }
    StandalonePodRule r;
    if (!p.contains("namespace") || !p["namespace"].is_string() || !p.contains("name") ||
        !p["name"].is_string()) {
      return absl::InvalidArgumentError(where + " needs string \"namespace\" and \"name\"");
    }
    r.namespace_ = p["namespace"].get<std::string>();
    r.name = p["name"].get<std::string>();
    if (r.namespace_.empty() || r.name.empty()) {
      return absl::InvalidArgumentError(where + ": empty namespace or name");
    }
    if (!p.contains("match") || !p["match"].is_object() || p["match"].empty()) {
      return absl::InvalidArgumentError(where + " needs a non-empty \"match\" object");
    }
    for (auto it = p["match"].begin(); it != p["match"].end(); ++it) {
      if (it.key() == "pod_uid" && it->is_string()) {
        r.pod_uid = it->get<std::string>();
      } else if (it.key() == "cgroup_prefix" && it->is_string()) {
        r.cgroup_prefix = it->get<std::string>();
      } else if (it.key() == "uid" && it->is_number_unsigned() && it->get<uint64_t>() <= UINT32_MAX) {
        r.uid = static_cast<uint32_t>(it->get<uint64_t>());  // a larger value must not wrap to root's 0
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".match: unknown key or wrong type: \"", it.key(), "\""));
      }
    }
    if (p.contains("annotations")) {
      if (!p["annotations"].is_object()) {
        return absl::InvalidArgumentError(where + ".annotations must be an object");
      }
      for (auto it = p["annotations"].begin(); it != p["annotations"].end(); ++it) {
        if (!it->is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ".annotations[\"", it.key(), "\"] must be a string"));
        }
        r.annotations[it.key()] = it->get<std::string>();
      }
    }
    rules.push_back(std::move(r));
  }
  return rules;
}

namespace {
bool PathHasPrefix(const std::string& path, const std::string& prefix) {
  if (!absl::StartsWith(path, prefix)) return false;
  return path.size() == prefix.size() || prefix.back() == '/' || path[prefix.size()] == '/';
}
}  // namespace

absl::StatusOr<PodInfo> StandalonePodSource::Resolve(const PeerIdentity& peer) {
  PodInfo pod;
  pod.key = IdentityKey(peer);
  pod.uid = peer.cgroup.pod_uid;
  pod.source = "standalone";
  for (const StandalonePodRule& r : rules_) {
    if (r.pod_uid && *r.pod_uid != peer.cgroup.pod_uid) continue;
    if (r.uid && *r.uid != peer.uid) continue;
    if (r.cgroup_prefix && !PathHasPrefix(peer.cgroup.path, *r.cgroup_prefix)) continue;
    pod.namespace_ = r.namespace_;
    pod.name = r.name;
    pod.annotations = r.annotations;
    return pod;
  }
  pod.namespace_ = "standalone";
  if (peer.cgroup.in_pod()) {
    pod.name = absl::StrCat("pod-", peer.cgroup.pod_uid);
  } else {
    pod.name = absl::StrFormat("uid%u-%08x", peer.uid,
                               static_cast<uint32_t>(std::hash<std::string>{}(peer.cgroup.path)));
  }
  return pod;
}

}  // namespace podlink
