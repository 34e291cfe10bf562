#include "daemon/daemon_config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_util.h"
#include "nlohmann/json.hpp"

namespace podlink {

namespace {

// Errors and bounded integers of one config section ("mesh", "nccl_native"),
// each error naming the key as section.key.
struct Section {
  const char* name;
  absl::Status Bad(const std::string& key, absl::string_view want) const {
    return absl::InvalidArgumentError(absl::StrCat("config: ", name, ".", key, " must be ", want));
  }
  absl::Status Number(const nlohmann::json& v, const std::string& key, uint64_t lo, uint64_t hi,
                      uint64_t* out) const {
    if (!v.is_number_unsigned() || v.get<uint64_t>() < lo || v.get<uint64_t>() > hi) {
      return Bad(key, absl::StrCat("an integer from ", lo, " to ", hi));
    }
    *out = v.get<uint64_t>();
    return absl::OkStatus();
  }
};

absl::Status ParseMeshConfig(const nlohmann::json& m, mesh::MeshOptions* o) {
  if (!m.is_object()) return absl::InvalidArgumentError("config: \"mesh\" must be an object");
  const Section sec{"mesh"};
  auto bad = [&](const std::string& key, absl::string_view want) { return sec.Bad(key, want); };
  auto strings = [&](const nlohmann::json& v, const std::string& key,
                     std::vector<std::string>* out) -> absl::Status {
    if (!v.is_array() || v.size() > 64) return bad(key, "an array of at most 64 strings");
    for (const auto& x : v) {
      if (!x.is_string() || x.get<std::string>().empty()) return bad(key, "an array of non-empty strings");
      out->push_back(x.get<std::string>());
    }
    return absl::OkStatus();
  };
  auto number = [&](const nlohmann::json& v, const std::string& key, uint64_t lo, uint64_t hi, uint64_t* out) {
    return sec.Number(v, key, lo, hi, out);
  };
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    uint64_t n = 0;
    if (k == "enabled" || k == "fallback" || k == "verbs_tcp_fallback" || k == "verbs_staged_only" ||
        k == "tcp_zero_copy" || k == "two_hop_stripe") {
      if (!v.is_boolean()) return bad(k, "true or false");
      (k == "enabled"              ? o->enabled
       : k == "fallback"           ? o->fallback
       : k == "verbs_tcp_fallback" ? o->verbs_tcp_fallback
       : k == "verbs_staged_only"  ? o->verbs_staged_only
       : k == "tcp_zero_copy"      ? o->tcp_zero_copy
                                   : o->two_hop_stripe) = v.get<bool>();
    } else if (k == "listen" || k == "cert_dir") {
      if (!v.is_string() || v.get<std::string>().empty()) return bad(k, "a non-empty string");
      (k == "listen" ? o->listen : o->cert_dir) = v.get<std::string>();
    } else if (k == "sysfs") {
      // Where the host's /sys is mounted (its NICs, GPUs and RDMA devices).
      if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>()[0] != '/') {
        return bad(k, "an absolute path");
      }
      o->sysfs = v.get<std::string>();
      o->verbs.sysfs = o->sysfs + "/class/infiniband";
    } else if (k == "interfaces" || k == "addresses") {
      PODLINK_RETURN_IF_ERROR(strings(v, k, k == "interfaces" ? &o->interfaces : &o->addresses));
    } else if (k == "data_port") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 0, 65535, &n));
      o->data_port = static_cast<uint32_t>(n);
    } else if (k == "connections_per_path") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 16, &n));
      o->connections_per_path = static_cast<uint32_t>(n);
    } else if (k == "slice_kib") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 4, 16384, &n));
      o->slice_bytes = n << 10;
    } else if (k == "slices_in_flight") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 64, &n));
      o->slices_in_flight = static_cast<uint32_t>(n);
    } else if (k == "transport") {
      if (!v.is_string() || (v != "tcp" && v != "verbs")) return bad(k, "\"tcp\" or \"verbs\"");
      o->transport = v.get<std::string>();
    } else if (k == "verbs_gid_index") {
      if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > 255) {
        return bad(k, "an integer from -1 (chosen by address) to 255");
      }
      o->verbs.gid_index = static_cast<int>(v.get<int64_t>());
    } else if (k == "verbs_timeout") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 31, &n));
      o->verbs.timeout = static_cast<uint8_t>(n);
    } else if (k == "verbs_retry_count") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 0, 7, &n));
      o->verbs.retry_count = static_cast<uint8_t>(n);
    } else if (k == "peers") {
      // [{"node": "node-c", "addresses": ["10.0.3.2/30"], "port": 7446}]
      if (!v.is_array() || v.size() > 1024) return bad(k, "an array of at most 1024 {node, addresses, port} objects");
      for (const auto& e : v) {
        mesh::PeerEntry p;
        if (!e.is_object() || !e.contains("node") || !e["node"].is_string() || e["node"].get<std::string>().empty() ||
            !e.contains("addresses")) {
          return bad(k, "objects with \"node\" and \"addresses\"");
        }
        for (auto f = e.begin(); f != e.end(); ++f) {
          if (f.key() != "node" && f.key() != "addresses" && f.key() != "port") {
            return absl::InvalidArgumentError(absl::StrCat("config: unknown key mesh.peers[].", f.key()));
          }
        }
        p.node = e["node"].get<std::string>();
        PODLINK_RETURN_IF_ERROR(strings(e["addresses"], "peers[].addresses", &p.addresses));
        for (const std::string& a : p.addresses) {
          if (absl::StatusOr<mesh::IpPrefix> ip = mesh::IpPrefix::Parse(a); !ip.ok()) {
            return absl::InvalidArgumentError(absl::StrCat("config: mesh.peers[] of ", p.node, ": ", ip.status().message()));
          }
        }
        if (e.contains("port")) {
          PODLINK_RETURN_IF_ERROR(number(e["port"], "peers[].port", 1, 65535, &n));
          p.port = static_cast<uint32_t>(n);
        }
        o->peers.push_back(std::move(p));
      }
    } else if (k == "relay_staging_mib") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 16, 65536, &n));
      o->relay_staging_bytes = n << 20;
    } else if (k == "sealed_window_mib") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 16, 65536, &n));
      o->sealed_window_bytes = n << 20;
    } else if (k == "grant_idle_seconds") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 7 * 86400, &n));
      o->grant_idle_timeout = absl::Seconds(static_cast<int64_t>(n));
    } else if (k == "cert_refresh_seconds") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 3600, &n));
      o->cert_refresh = absl::Seconds(static_cast<int64_t>(n));
    } else if (k == "advert_seconds") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 3600, &n));
      o->advert_interval = absl::Seconds(static_cast<int64_t>(n));
    } else if (k == "keepalive_seconds") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 3600, &n));
      o->keepalive = absl::Seconds(static_cast<int64_t>(n));
    } else if (k == "io_timeout_seconds") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 600, &n));
      o->io_timeout = absl::Seconds(static_cast<int64_t>(n));
    } else if (k == "open_timeout_seconds") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 600, &n));
      o->open_per_hop = absl::Seconds(static_cast<int64_t>(n));
    } else if (k == "max_grants_per_peer" || k == "max_grants_per_tenant" || k == "max_grants_per_pod") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 1u << 20, &n));
      (k == "max_grants_per_peer"     ? o->max_grants_per_peer
       : k == "max_grants_per_tenant" ? o->max_grants_per_tenant
                                      : o->max_grants_per_pod) = static_cast<uint32_t>(n);
    } else if (k == "data_idle_seconds") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 7 * 86400, &n));
      o->data_idle_timeout = absl::Seconds(static_cast<int64_t>(n));
    } else if (k == "max_data_connections") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 16, 65536, &n));
      o->max_data_connections = static_cast<uint32_t>(n);
    } else if (k == "max_data_connections_per_peer") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 4, 65536, &n));
      o->max_data_connections_per_peer = static_cast<uint32_t>(n);
    } else if (k == "answer_timeout_seconds") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 600, &n));
      o->answer_timeout = absl::Seconds(static_cast<int64_t>(n));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("config: unknown key mesh.", k));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseNcclNativeConfig(const nlohmann::json& m, NcclNativeOptions* o) {
  if (!m.is_object()) return absl::InvalidArgumentError("config: \"nccl_native\" must be an object");
  const Section sec{"nccl_native"};
  auto bad = [&](const std::string& key, absl::string_view want) { return sec.Bad(key, want); };
  auto number = [&](const nlohmann::json& v, const std::string& key, uint64_t lo, uint64_t hi, uint64_t* out) {
    return sec.Number(v, key, lo, hi, out);
  };
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    uint64_t n = 0;
    if (k == "enabled") {
      if (!v.is_boolean()) return bad(k, "true or false");
      o->enabled = v.get<bool>();
    } else if (k == "shm_dir") {
      if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>()[0] != '/') {
        return bad(k, "an absolute path");
      }
      o->shm_dir = v.get<std::string>();
    } else if (k == "shm_size_mib") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 16, 1 << 20, &n));
      o->shm_size_bytes = n << 20;
    } else if (k == "max_names_per_pod") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 65536, &n));
      o->bridge.max_names_per_pod = n;
    } else if (k == "max_answers_per_pod") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 65536, &n));
      o->bridge.max_answers_per_pod = n;
    } else if (k == "rescan_interval_ms") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 10, 3600000, &n));
      o->bridge.rescan_interval = absl::Milliseconds(static_cast<int64_t>(n));
    } else if (k == "datagrams_per_second") {
      PODLINK_RETURN_IF_ERROR(number(v, k, 1, 1000000, &n));
      o->bridge.datagrams_per_second = static_cast<uint32_t>(n);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("config: unknown key \"nccl_native.", k, "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DaemonConfig> ParseDaemonConfig(const std::string& json_text) {
  DaemonConfig cfg;
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("config is not a JSON object");
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() != "limits" && it.key() != "pods" && it.key() != "identity" && it.key() != "mesh" &&
        it.key() != "node" && it.key() != "nccl_native") {
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
      } else if (it.key() == "max_pending_offers_per_pod") {
        cfg.broker.max_pending_offers_per_pod = v;
      } else if (it.key() == "max_pending_offers_total") {
        cfg.broker.max_pending_offers_total = v;
      } else if (it.key() == "max_export_chunks") {
        cfg.broker.max_export_chunks = v;
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
  if (doc.contains("node")) {
    // {"node": {"name": "node-a", "id": "node-a"}}: who this daemon is, for
    // emulated nodes sharing one kernel (both default from the host).
    const auto& n = doc["node"];
    if (!n.is_object()) return absl::InvalidArgumentError("config: \"node\" must be an object");
    for (auto it = n.begin(); it != n.end(); ++it) {
      if ((it.key() != "name" && it.key() != "id") || !it.value().is_string() ||
          it.value().get<std::string>().empty() || it.value().get<std::string>().size() > 253) {
        return absl::InvalidArgumentError(
            absl::StrCat("config: node.", it.key(), " is not \"name\" or \"id\" with a non-empty string"));
      }
    }
    if (n.contains("name")) cfg.node_name = n["name"].get<std::string>();
    if (n.contains("id")) cfg.broker.node_id = n["id"].get<std::string>();
  }
  if (doc.contains("mesh")) {
    PODLINK_RETURN_IF_ERROR(ParseMeshConfig(doc["mesh"], &cfg.broker.mesh));
  }
  if (doc.contains("nccl_native")) {
    PODLINK_RETURN_IF_ERROR(ParseNcclNativeConfig(doc["nccl_native"], &cfg.broker.nccl_native));
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
