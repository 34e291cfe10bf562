#include "client-lib/nccl/transports.h"

#include <utility>

#include "client-lib/nccl/plugin.h"
#include "client-lib/nccl/transport_podlink.h"
#include "client-lib/nccl/transport_tcp.h"

namespace podlink::ncclnet {

TransportId ChooseTransportLocked(const State& s, const std::string& peer_node) {
  bool same_node = !s.node_id.empty() && s.engine != nullptr && s.node_id == peer_node;
  return same_node ? TransportId::kPodlink : TransportId::kTcp;
}

int DataSocketsLocked(const State& s, TransportId t) { return t == TransportId::kTcp ? s.nsocks : 0; }

bool IsTransportId(uint8_t wire) {
  return wire == static_cast<uint8_t>(TransportId::kTcp) || wire == static_cast<uint8_t>(TransportId::kPodlink);
}

bool UsableLocked(const State& s, TransportId t) { return t != TransportId::kPodlink || s.engine != nullptr; }

std::unique_ptr<Comm> MakeComm(TransportId t, bool send, int dev, std::string peer, UniqueFd ctrl,
                               std::vector<UniqueFd> data) {
  switch (t) {
    case TransportId::kPodlink:
      return std::make_unique<PodlinkComm>(send, dev, std::move(peer), std::move(ctrl));
    case TransportId::kTcp:
      break;
  }
  return std::make_unique<TcpComm>(send, dev, std::move(peer), std::move(ctrl), std::move(data));
}

}  // namespace podlink::ncclnet
