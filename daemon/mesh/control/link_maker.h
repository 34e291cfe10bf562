// How a transport makes a peer's own links (the control room's interface to
// tcp/ and verbs/): after the peer's Hello, its links over the chosen paths,
// and what each does when a path fails. The connector (control/connector.h)
// calls it and never looks behind it; MeshEngine::Start, the one place that
// reads mesh.transport, picks which one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/mesh/control/peer.h"
#include "daemon/mesh/control/repairs.h"
#include "daemon/mesh/routing/addresses.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"

namespace podlink::mesh {

class LinkMaker {
 public:
  virtual ~LinkMaker() = default;
  // After `target` said Hello (`hello`, over `stub`): `peer`'s links over
  // `paths`, each path's repair set (RepairWithStub). On success the peer's
  // stub, instance and links are set; on failure none of them.
  // `verbs_failed` (may be null): set when no RDMA path came up, though the
  // node answered (its TCP links may still work).
  virtual absl::Status Connect(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                               const std::vector<Path>& paths, std::shared_ptr<pb::Mesh::Stub> stub,
                               const pb::HelloResponse& hello, bool* verbs_failed) = 0;
  // Its links carry any grant, a relay's too (which has no memory of the
  // relay's own for RDMA to land in): a peer that must be reached over TCP
  // links is then the node's own peer.
  virtual bool carries_relayed_grants() const = 0;
  // Two-hop striping (mesh.two_hop_stripe) may add a relay's route to its
  // transfers.
  virtual bool stripes_two_hop() const = 0;
};

// A transport's repair of one path of `peer`'s links, with the peer's
// control stub as it is when the repair runs.
using RedoPath =
    std::function<absl::Status(const Path& path, const std::string& name, Peer& peer, pb::Mesh::Stub& stub)>;
// What a link set calls when a path fails: `redo` is queued on `repairs`
// (control/repairs.h), and runs while `peer` is there and has a stub.
std::function<void(const std::string&)> RepairWithStub(Repairs& repairs, const std::shared_ptr<Peer>& peer,
                                                       const std::shared_ptr<DataLinks>& links, RedoPath redo,
                                                       const std::vector<Path>& paths);

}  // namespace podlink::mesh
