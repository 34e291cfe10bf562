#include "daemon/daemon_config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace podlink {

absl::StatusOr<DaemonConfig> ParseDaemonConfig(const std::string& json_text) {
  DaemonConfig cfg;
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("config is not a JSON object");
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() != "limits" && it.key() != "pods" && it.key() != "identity") {
      return absl::InvalidArgumentError(absl::StrCat("config: unknown key \"", it.key(), "\""));
    }
  }
  if (doc.contains("limits")) {
    const auto& l = doc["limits"];
    if (!l.is_object()) return absl::InvalidArgumentError("config: \"limits\" must be an object");
    for (auto it = l.begin(); it != l.end(); ++it) {
      if (!it->is_number_unsigned() || it->get<uint64_t>() == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("config: limits.", it.key(), " must be a positive integer"));
      }
      size_t v = it->get<size_t>();
      if (it.key() == "max_sessions") {
        cfg.broker.max_sessions = v;
      } else if (it.key() == "max_exports_per_session") {
        cfg.broker.registry.max_exports_per_session = v;
      } else if (it.key() == "max_exports_total") {
        cfg.broker.registry.max_exports_total = v;
      } else if (it.key() == "max_pending_offers") {
        cfg.broker.max_pending_offers = v;
      } else if (it.key() == "offer_ttl_seconds") {
        cfg.broker.offer_ttl = absl::Seconds(static_cast<int64_t>(v));
      } else if (it.key() == "max_sessions_per_pod") {
        cfg.broker.max_sessions_per_pod = v;
      } else if (it.key() == "max_grpc_connections") {
        cfg.grpc.max_connections = v;
      } else if (it.key() == "max_grpc_connections_per_pod") {
        cfg.grpc.max_connections_per_pod = v;
      } else if (it.key() == "max_exports_per_pod") {
        cfg.broker.registry.max_exports_per_pod = v;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("config: unknown limit \"", it.key(), "\""));
      }
    }
  }
  if (doc.contains("identity")) {
    const auto& id = doc["identity"];
    if (!id.is_object() || id.empty()) {
      return absl::InvalidArgumentError("config: \"identity\" must be an object with kubelet_cgroup_roots");
    }
    for (auto it = id.begin(); it != id.end(); ++it) {
      if (it.key() != "kubelet_cgroup_roots") {
        return absl::InvalidArgumentError(absl::StrCat("config: unknown key identity.", it.key()));
      }
      if (!it->is_array() || it->empty()) {
        return absl::InvalidArgumentError("config: identity.kubelet_cgroup_roots must be a non-empty array");
      }
      cfg.broker.cgroup_layout.kubelet_roots.clear();
      for (const auto& r : *it) {
        if (!r.is_string() || r.get<std::string>().empty() || r.get<std::string>()[0] != '/' ||
            r.get<std::string>().find("..") != std::string::npos) {
          return absl::InvalidArgumentError(
              "config: identity.kubelet_cgroup_roots entries must be absolute cgroup paths without '..'");
        }
        cfg.broker.cgroup_layout.kubelet_roots.push_back(r.get<std::string>());
      }
    }
  }
  auto rules = StandalonePodSource::ParseRules(json_text);
  if (!rules.ok()) return rules.status();
  cfg.pods = *std::move(rules);
  cfg.grpc.cgroup_layout = cfg.broker.cgroup_layout;
  return cfg;
}

absl::StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  auto cfg = ParseDaemonConfig(ss.str());
  if (!cfg.ok()) return absl::Status(cfg.status().code(), absl::StrCat(path, ": ", cfg.status().message()));
  return cfg;
}

}  // namespace podlink
