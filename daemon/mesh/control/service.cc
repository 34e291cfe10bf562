// The control plane's peer view: the links a peer announced.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

// ---------------------------------------------------------------------------
std::vector<pb::LinkInfo> MeshEngine::PeerLinkInfo(const pb::HelloResponse& hello) {
  std::vector<pb::LinkInfo> out;
  for (const pb::LinkInfo& l : hello.links()) {
    if (out.size() == 64) break;
    pb::LinkInfo c = l;
    for (std::string* f :
         {c.mutable_address(), c.mutable_netdev(), c.mutable_pci_path(), c.mutable_rdma_device(), c.mutable_gid_type()}) {
      if (f->size() > 256) f->resize(256);
      for (char& ch : *f) {
        if (ch < 0x20 || ch == 0x7f) ch = '?';
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace podlink::mesh
