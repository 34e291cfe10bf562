// Host-memory backend: exports are sealed memfds. Serves host-memory users
// and lets every broker test run without a GPU.
#pragma once

#include "daemon/gpu/memory_object.h"

namespace podlink {

class HostMemfdBackend : public MemoryBackend {
 public:
  // With a pinner (podlinkd with CUDA), each export's relay mapping is
  // page-locked while it lives; without one, or when pinning fails, the
  // relay copies from pageable memory (slower, still correct).
  explicit HostMemfdBackend(std::shared_ptr<HostPinner> pinner = nullptr) : pinner_(std::move(pinner)) {}
  bool Handles(HandleKind kind) const override { return kind == HandleKind::kHostMemfd; }
  // Accepts only a memfd that is sealed against shrinking, growing and further
  // sealing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) and at least `size`
  // bytes long: an importer's mapping can then never be truncated under it.
  absl::StatusOr<std::shared_ptr<MemoryObject>> Adopt(const ExportClaim& claim, UniqueFd fd,
                                                      const std::string& fabric_handle) override;

 private:
  std::shared_ptr<HostPinner> pinner_;
};

}  // namespace podlink
