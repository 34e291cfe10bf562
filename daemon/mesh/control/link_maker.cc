// A transport's repair run with its peer's stub (link_maker.h).
#include "daemon/mesh/control/link_maker.h"

namespace podlink::mesh {

std::function<void(const std::string&)> RepairWithStub(Repairs& repairs, const std::shared_ptr<Peer>& peer,
                                                       const std::shared_ptr<DataLinks>& links, RedoPath redo,
                                                       const std::vector<Path>& paths) {
  std::weak_ptr<Peer> weak_peer = peer;
  Repairs::Redo with_stub = [weak_peer, redo = std::move(redo)](const Path& path,
                                                                const std::string& name) -> absl::Status {
    std::shared_ptr<Peer> p = weak_peer.lock();
    if (p == nullptr) return absl::OkStatus();  // nothing left to repair
    std::shared_ptr<pb::Mesh::Stub> stub = p->stub();
    if (stub == nullptr) return absl::OkStatus();
    return redo(path, name, *p, *stub);
  };
  return repairs.OnDown(links, std::move(with_stub), paths);
}

}  // namespace podlink::mesh
