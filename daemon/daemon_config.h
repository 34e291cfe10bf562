// podlinkd's configuration file (JSON). Every key is optional; defaults are
// the daemon's defaults. See docs/usage.md.
//
//   {"limits": {"max_sessions": 1024, "max_exports_per_session": 4096,
//               "max_exports_total": 65536, "max_pending_offers": 1024,
//               "max_pending_offers_per_pod": 2048, "max_pending_offers_total": 16384,
//               "max_export_chunks": 1024},
//    "pods": [ ...standalone pod rules... ],
//    "node": {"name": "node-a", "id": "node-a"},
//    "mesh": {"enabled": true, "listen": "0.0.0.0:7446", "data_port": 7447,
//             "cert_dir": "/etc/podlink/mesh", "interfaces": ["ens1f0"], ...},
//    "nccl_native": {"enabled": true, "shm_dir": "/run/podlink/nccl-shm", "shm_size_mib": 1024,
//                    "max_names_per_pod": 1024, "max_answers_per_pod": 256, "datagrams_per_second": 20000,
//                    "rescan_interval_ms": 200}}
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/broker/broker.h"
#include "daemon/broker/grpc_listener.h"
#include "daemon/identity/standalone_source.h"

namespace podlink {

struct DaemonConfig {
  BrokerOptions broker;
  GrpcListenerOptions grpc;  // its cgroup_layout is the broker's
  std::vector<StandalonePodRule> pods;
  std::string node_name;  // config's node.name; empty: $NODE_NAME, else the host name
};

absl::StatusOr<DaemonConfig> ParseDaemonConfig(const std::string& json_text);
absl::StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path);

}  // namespace podlink
