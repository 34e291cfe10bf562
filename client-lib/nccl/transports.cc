#include "client-lib/nccl/transports.h"

#include <utility>

#include "client-lib/nccl/plugin.h"
#include "client-lib/nccl/transport_mesh.h"
#include "client-lib/nccl/transport_podlink.h"
#include "client-lib/nccl/transport_tcp.h"

namespace podlink::ncclnet {

TransportId ChooseTransportLocked(const State& s, const std::string& peer_node, bool peer_mesh) {
  if (s.node_id.empty() || s.engine == nullptr) return TransportId::kTcp;
  if (s.node_id == peer_node) return TransportId::kPodlink;
  if (!s.mesh_node.empty() && peer_mesh && !peer_node.empty() && !EnvIs("PODLINK_NCCL_MESH", "0")) {
    return TransportId::kMesh;
  }
  return TransportId::kTcp;
}

int DataSocketsLocked(const State& s, TransportId t) { return t == TransportId::kTcp ? s.nsocks : 0; }

bool IsTransportId(uint8_t wire) {
  return wire == static_cast<uint8_t>(TransportId::kTcp) || wire == static_cast<uint8_t>(TransportId::kPodlink) ||
         wire == static_cast<uint8_t>(TransportId::kMesh);
}

bool UsableLocked(const State& s, TransportId t) {
  if (t == TransportId::kMesh) return s.engine != nullptr && !s.mesh_node.empty();
  return t != TransportId::kPodlink || s.engine != nullptr;
}

std::unique_ptr<Comm> MakeComm(TransportId t, bool send, int dev, std::string peer, UniqueFd ctrl,
                               std::vector<UniqueFd> data) {
  switch (t) {
    case TransportId::kPodlink:
      return std::make_unique<PodlinkComm>(send, dev, std::move(peer), std::move(ctrl));
    case TransportId::kMesh:
      return std::make_unique<MeshComm>(send, dev, std::move(peer), std::move(ctrl));
    case TransportId::kTcp:
      break;
  }
  return std::make_unique<TcpComm>(send, dev, std::move(peer), std::move(ctrl), std::move(data));
}

}  // namespace podlink::ncclnet
