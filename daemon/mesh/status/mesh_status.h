// The mesh's status and metrics (the status room): what an operator sees of
// this node's mesh (GetMeshStatus, kubectl-podlink) and the Prometheus text of
// its counters, read from each room through its own const accessors. No lock
// of its own and no state: each room's lock is taken by that room's accessor,
// one at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/mesh/control/connector.h"
#include "daemon/mesh/control/liveness.h"
#include "daemon/mesh/control/peer_table.h"
#include "daemon/mesh/control/repairs.h"
#include "daemon/mesh/importer/handle_table.h"
#include "daemon/mesh/importer/opener.h"
#include "daemon/mesh/importer/transfer.h"
#include "daemon/mesh/links/late_copies.h"
#include "daemon/mesh/owner/region_owner.h"
#include "daemon/mesh/routing/advert_book.h"
#include "daemon/mesh/routing/known_nodes.h"
#include "daemon/mesh/tcp/admission.h"
#include "daemon/mesh/tcp/data_server.h"
#include "daemon/mesh/verbs/verbs_node.h"
#include "podlink/mesh/v1/mesh.pb.h"
#include "podlink/v1/podlink.pb.h"

namespace podlink::mesh {

// The rooms as the status reads them (the engine's; each outlives the call).
struct MeshView {
  std::string node_name;
  std::vector<std::string> addresses;  // this node's advertised ones
  uint32_t control_port = 0, data_port = 0;
  std::vector<podlink::mesh::v1::LinkInfo> local_links;  // this node's NICs as last read
  const PeerTable* peers = nullptr;
  const HandleTable* handles = nullptr;
  const RegionOwner* owner = nullptr;
  const KnownNodes* known = nullptr;
  const AdvertBook* adverts = nullptr;
  const DataAdmission* admission = nullptr;
  const TcpDataServer* data_server = nullptr;
  const Repairs* repairs = nullptr;
  const LateCopies* late_copies = nullptr;
  const Liveness* liveness = nullptr;
  const RemoteTransfers* transfers = nullptr;
  const Opener* opener = nullptr;
  const Connector* connector = nullptr;
  const verbs::VerbsNode* verbs = nullptr;
};

// This node's mesh as GetMeshStatus answers it: addresses, ports, known
// nodes with their adverts' age, routes, grants, each peer's links and NICs.
podlink::v1::MeshStatus MeshStatusOf(const MeshView& v);
// The podlink_mesh_* metric families (Prometheus text).
std::string RenderMeshMetrics(const MeshView& v);

}  // namespace podlink::mesh
