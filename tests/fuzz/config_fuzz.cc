// Fuzzes podlinkd's configuration parser (daemon/daemon_config.h,
// ParseDaemonConfig, with StandalonePodSource::ParseRules for "pods"): the
// input is the config file's text.
//
// The parser must not crash or throw, must refuse with INVALID_ARGUMENT, and
// anything it accepts must say exactly what the document says (read here
// independently with nlohmann::json): every limit a positive integer equal
// to the document's, defaults elsewhere; kubelet roots as written, absolute
// and without ".."; every pod rule's namespace, name, match keys and
// annotations as written. Violations abort.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "daemon/daemon_config.h"
#include "nlohmann/json.hpp"

#include "tests/fuzz/fuzz_check.h"

namespace podlink {
namespace {

using nlohmann::json;

// The value a limit key sets in `cfg`; nullptr for an unknown key.
const size_t* LimitField(const DaemonConfig& cfg, const std::string& key) {
  if (key == "max_sessions") return &cfg.broker.max_sessions;
  if (key == "max_sessions_per_pod") return &cfg.broker.max_sessions_per_pod;
  if (key == "max_pending_offers") return &cfg.broker.max_pending_offers;
  if (key == "max_pending_offers_per_pod") return &cfg.broker.max_pending_offers_per_pod;
  if (key == "max_pending_offers_total") return &cfg.broker.max_pending_offers_total;
  if (key == "max_export_chunks") return &cfg.broker.max_export_chunks;
  if (key == "max_exports_per_session") return &cfg.broker.registry.max_exports_per_session;
  if (key == "max_exports_total") return &cfg.broker.registry.max_exports_total;
  if (key == "max_exports_per_pod") return &cfg.broker.registry.max_exports_per_pod;
  if (key == "max_grpc_connections") return &cfg.grpc.max_connections;
  if (key == "max_grpc_connections_per_pod") return &cfg.grpc.max_connections_per_pod;
  return nullptr;
}

void CheckLimits(const DaemonConfig& cfg, const json& doc) {
  const DaemonConfig defaults;
  const json limits = doc.contains("limits") ? doc.at("limits") : json::object();
  for (const char* key : {"max_sessions", "max_sessions_per_pod", "max_pending_offers", "max_pending_offers_per_pod",
                          "max_pending_offers_total", "max_export_chunks",
                          "max_exports_per_session",
                          "max_exports_total", "max_exports_per_pod", "max_grpc_connections",
                          "max_grpc_connections_per_pod"}) {
    const size_t got = *LimitField(cfg, key);
    if (!limits.contains(key)) {
      FUZZ_CHECK(got == *LimitField(defaults, key), "limits.%s absent but changed to %zu", key, got);
      continue;
    }
    const json& v = limits.at(key);
    FUZZ_CHECK(v.is_number_unsigned() && v.get<uint64_t>() > 0, "limits.%s = %s accepted", key, v.dump().c_str());
    FUZZ_CHECK(got == v.get<uint64_t>(), "limits.%s = %s parsed as %zu", key, v.dump().c_str(), got);
  }
  if (limits.contains("offer_ttl_seconds")) {
    const json& v = limits.at("offer_ttl_seconds");
    FUZZ_CHECK(v.is_number_unsigned() && v.get<uint64_t>() > 0, "limits.offer_ttl_seconds = %s accepted",
               v.dump().c_str());
    FUZZ_CHECK(cfg.broker.offer_ttl == absl::Seconds(static_cast<int64_t>(v.get<uint64_t>())),
               "limits.offer_ttl_seconds = %s parsed wrong", v.dump().c_str());
  } else {
    FUZZ_CHECK(cfg.broker.offer_ttl == defaults.broker.offer_ttl, "limits.offer_ttl_seconds absent but changed");
  }
  for (auto it = limits.begin(); it != limits.end(); ++it) {
    FUZZ_CHECK(LimitField(cfg, it.key()) != nullptr || it.key() == "offer_ttl_seconds", "unknown limit '%s' accepted",
               it.key().c_str());
  }
}

void CheckRoots(const DaemonConfig& cfg, const json& doc) {
  const std::vector<std::string>& roots = cfg.broker.cgroup_layout.kubelet_roots;
  if (!doc.contains("identity")) {
    FUZZ_CHECK(roots == CgroupLayout{}.kubelet_roots, "no identity section but kubelet roots changed");
    return;
  }
  const json& id = doc.at("identity");
  FUZZ_CHECK(id.is_object() && id.size() == 1 && id.contains("kubelet_cgroup_roots"), "identity %s accepted",
             id.dump().c_str());
  const json& want = id.at("kubelet_cgroup_roots");
  FUZZ_CHECK(want.is_array() && want.size() == roots.size(), "kubelet_cgroup_roots %s parsed as %zu roots",
             want.dump().c_str(), roots.size());
  for (size_t i = 0; i < roots.size(); ++i) {
    FUZZ_CHECK(want[i].is_string() && want[i].get<std::string>() == roots[i], "root %zu: %s parsed as '%s'", i,
               want[i].dump().c_str(), roots[i].c_str());
    FUZZ_CHECK(!roots[i].empty() && roots[i][0] == '/' && roots[i].find("..") == std::string::npos,
               "root '%s' accepted", roots[i].c_str());
  }
}

void CheckPods(const DaemonConfig& cfg, const json& doc) {
  if (!doc.contains("pods")) {
    FUZZ_CHECK(cfg.pods.empty(), "no pods section but %zu rules", cfg.pods.size());
    return;
  }
  const json& pods = doc.at("pods");
  FUZZ_CHECK(pods.is_array() && pods.size() == cfg.pods.size(), "pods %s parsed as %zu rules", pods.dump().c_str(),
             cfg.pods.size());
  for (size_t i = 0; i < cfg.pods.size(); ++i) {
    const StandalonePodRule& r = cfg.pods[i];
    const json& p = pods[i];
    FUZZ_CHECK(p.is_object(), "pods[%zu] is not an object", i);
    FUZZ_CHECK(!r.namespace_.empty() && !r.name.empty(), "pods[%zu]: empty namespace or name accepted", i);
    FUZZ_CHECK(p.value("namespace", json()) == r.namespace_ && p.value("name", json()) == r.name,
               "pods[%zu]: namespace/name parsed as %s/%s", i, r.namespace_.c_str(), r.name.c_str());
    const json& match = p.at("match");
    FUZZ_CHECK(match.is_object() && !match.empty(), "pods[%zu]: match %s accepted", i, match.dump().c_str());
    size_t keys = 0;
    if (match.contains("pod_uid")) {
      FUZZ_CHECK(r.pod_uid && match.at("pod_uid") == *r.pod_uid, "pods[%zu].match.pod_uid", i);
      ++keys;
    } else {
      FUZZ_CHECK(!r.pod_uid, "pods[%zu]: pod_uid not in the document", i);
    }
    if (match.contains("cgroup_prefix")) {
      FUZZ_CHECK(r.cgroup_prefix && match.at("cgroup_prefix") == *r.cgroup_prefix, "pods[%zu].match.cgroup_prefix",
                 i);
      ++keys;
    } else {
      FUZZ_CHECK(!r.cgroup_prefix, "pods[%zu]: cgroup_prefix not in the document", i);
    }
    if (match.contains("uid")) {
      const json& uid = match.at("uid");
      // A uid that does not fit uid_t must be refused, not wrapped onto
      // another user (4294967296 would become root).
      FUZZ_CHECK(r.uid && uid.is_number_unsigned() && uid.get<uint64_t>() == *r.uid,
                 "pods[%zu].match.uid %s parsed as %lld", i, uid.dump().c_str(),
                 r.uid ? static_cast<long long>(*r.uid) : -1LL);
      ++keys;
    } else {
      FUZZ_CHECK(!r.uid, "pods[%zu]: uid not in the document", i);
    }
    FUZZ_CHECK(keys == match.size(), "pods[%zu]: unknown match key accepted: %s", i, match.dump().c_str());
    std::map<std::string, std::string> annotations;
    if (p.contains("annotations")) {
      FUZZ_CHECK(p.at("annotations").is_object(), "pods[%zu]: annotations that are no object accepted", i);
      for (auto it = p.at("annotations").begin(); it != p.at("annotations").end(); ++it) {
        FUZZ_CHECK(it->is_string(), "pods[%zu].annotations[%s] is not a string", i, it.key().c_str());
        annotations[it.key()] = it->get<std::string>();
      }
    }
    FUZZ_CHECK(annotations == r.annotations, "pods[%zu]: annotations differ from the document", i);
  }
}

}  // namespace
}  // namespace podlink

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<podlink::DaemonConfig> cfg = podlink::ParseDaemonConfig(text);
  if (!cfg.ok()) {
    FUZZ_CHECK(cfg.status().code() == absl::StatusCode::kInvalidArgument && !cfg.status().message().empty(),
               "refused with %s", cfg.status().ToString().c_str());
    return 0;
  }
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(doc.is_object(), "a config that is not a JSON object was accepted");
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    FUZZ_CHECK(it.key() == "limits" || it.key() == "identity" || it.key() == "pods", "unknown key '%s' accepted",
               it.key().c_str());
  }
  podlink::CheckLimits(*cfg, doc);
  podlink::CheckRoots(*cfg, doc);
  podlink::CheckPods(*cfg, doc);
  return 0;
}
