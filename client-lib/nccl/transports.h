// The one place that knows every transport of the NCCL net plugin: which one
// a connection uses, what it needs from the handshake, and making its comm.
// Adding a transport: a Comm subclass in its own file, a TransportId value
// (wire.h), and a case in each function here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client-lib/nccl/comm.h"
#include "common/unique_fd.h"

namespace podlink::ncclnet {

class State;

// The transport for a peer whose podlinkd node identity is `peer_node`
// (empty: none) and whose podlinkd runs the mesh when `peer_mesh`: podlink on
// the same node when podlinkd is usable here; mesh to another node when both
// podlinkd run it (PODLINK_NCCL_MESH=0: never); TCP otherwise. s.mu held.
TransportId ChooseTransportLocked(const State& s, const std::string& peer_node, bool peer_mesh);

// Data sockets the connector opens besides the control socket. s.mu held.
int DataSocketsLocked(const State& s, TransportId t);

// Whether a hello's transport byte names a transport, and whether this
// process can serve it (s.mu held).
bool IsTransportId(uint8_t wire);
bool UsableLocked(const State& s, TransportId t);

std::unique_ptr<Comm> MakeComm(TransportId t, bool send, int dev, std::string peer, UniqueFd ctrl,
                               std::vector<UniqueFd> data);

}  // namespace podlink::ncclnet
