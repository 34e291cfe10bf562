// What the relay needs from the inter-node mesh (daemon/mesh/): a ring
// request whose remote export is a remote handle (bit 63 set; such handles
// come from Broker::OpenRemote and never collide with registry ids) is handed
// over here instead of to the copy executor. Completions come back on the
// mesh's threads through `Done`; the relay posts them from its worker.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "daemon/registry/registry.h"

namespace podlink {

inline constexpr uint64_t kRemoteHandleBit = uint64_t{1} << 63;
inline bool IsRemoteHandle(uint64_t id) { return (id & kRemoteHandleBit) != 0; }

struct MeshTransfer {
  bool write = true;        // local -> remote; false: remote -> local
  uint64_t session = 0;     // whose handle it must be
  uint64_t handle = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
  char* local = nullptr;    // the daemon's host mapping of the local export, at the local offset
                            // (GPU exports: a host staging buffer the relay copies through)
  std::shared_ptr<const ExportRecord> keep;  // the local export stays alive until Done
  std::shared_ptr<char[]> staging;           // and the staging buffer, if any
};

class MeshPort {
 public:
  using Done = std::function<void(const absl::Status&)>;
  virtual ~MeshPort() = default;
  // Checks the handle (the session's, live, bounds) and starts the transfer;
  // an error means it was not started and `done` is never called.
  virtual absl::Status Start(MeshTransfer t, Done done) = 0;
  // Tells the remote export's owner `value`; the relay calls it only after
  // every earlier transfer of the ring completed.
  virtual absl::Status Notify(uint64_t session, uint64_t handle, uint64_t value, Done done) = 0;
};

}  // namespace podlink
