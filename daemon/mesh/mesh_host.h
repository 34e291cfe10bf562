// What the mesh needs from the broker on the exporting node, so that policy
// and the registry stay in the broker (daemon/broker/).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/identity/pod_source.h"
#include "daemon/registry/registry.h"
#include "podlink/mesh/v1/mesh.pb.h"

namespace podlink::mesh {

class MeshHost {
 public:
  virtual ~MeshHost() = default;
  // The export `req` names, if `importer` (a pod of another node, identity
  // forwarded by its daemon) may import it under this node's policy. Counted
  // and logged like a local import; another namespace gets NOT_FOUND.
  virtual absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(
      const PodInfo& importer, const podlink::mesh::v1::OpenRegionRequest& req) = 0;
  // Whether `rec` is still exported (not withdrawn, owner alive).
  virtual bool ExportLive(const ExportRecord& rec) const = 0;
  // Queues a notification for the export's owner (its relay ring's NQ).
  virtual absl::Status NotifyOwner(const ExportRecord& rec, uint64_t value) = 0;
  // Whether this node learns what becomes of other nodes' pods (from the
  // API server), and whether the pod with UID `pod_uid`, which another
  // node's daemon imported for, is known to be gone (deleted or finished):
  // its grants are then dropped.
  virtual bool TracksRemotePods() const { return false; }
  virtual bool RemotePodGone(const std::string& pod_uid) const {
    (void)pod_uid;
    return false;
  }
  // The PCI bus id ("0000:18:00.0") of the GPU holding `rec`'s memory; empty
  // for host memory (which paths a transfer prefers: nic_rank.h).
  virtual std::string GpuBusId(const ExportRecord& rec) const {
    (void)rec;
    return {};
  }
};

}  // namespace podlink::mesh
