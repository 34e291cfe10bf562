// Host-memory backend: exports are sealed memfds. Serves host-memory users
// and lets every broker test run without a GPU.
#pragma once

#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/gpu/memory_object.h"

namespace podlink {

// Caps what another pinner may page-lock in total. Pinning populates and
// locks every page of an export, and an export's size is the client's choice
// (a sealed memfd may be sparse and huge): without a cap one client could make
// podlinkd allocate and lock all of the node's memory. Beyond the cap Pin
// fails and the relay copies that export from pageable memory.
class BudgetedPinner : public HostPinner {
 public:
  BudgetedPinner(std::shared_ptr<HostPinner> inner, uint64_t max_bytes)
      : inner_(std::move(inner)), max_bytes_(max_bytes) {}
  absl::Status Pin(void* p, uint64_t size) override ABSL_LOCKS_EXCLUDED(mu_);
  void Unpin(void* p) override ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t pinned_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::shared_ptr<HostPinner> inner_;
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  uint64_t pinned_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<void*, uint64_t> sizes_ ABSL_GUARDED_BY(mu_);
};

// Address space podlinkd spends on relay mappings of host exports, all
// exports together. Exports must be populated when exported, but a client
// may punch holes afterwards and export again; the cap keeps such mappings
// from filling the daemon's address space.
class MappingBudget {
 public:
  explicit MappingBudget(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  absl::Status Take(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void Give(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t used() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

// OK when every page of the file behind `fd` is allocated (counted by its
// block count; FAILED_PRECONDITION otherwise).
absl::Status CheckFullyAllocated(int fd);

class HostMemfdBackend : public MemoryBackend {
 public:
  // With a pinner (podlinkd with CUDA), each export's relay mapping is
  // page-locked while it lives; without one, or when pinning fails, the
  // relay copies from pageable memory (slower, still correct).
  explicit HostMemfdBackend(std::shared_ptr<HostPinner> pinner = nullptr,
                            std::shared_ptr<MappingBudget> mappings = nullptr)
      : pinner_(std::move(pinner)), mappings_(std::move(mappings)) {}
  bool Handles(HandleKind kind) const override { return kind == HandleKind::kHostMemfd; }
  // Accepts only a memfd that is sealed against shrinking, growing and further
  // sealing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) and at least `size`
  // bytes long: an importer's mapping can then never be truncated under it.
  // It must be writable (no F_SEAL_WRITE / F_SEAL_FUTURE_WRITE) and populated
  // over [0, size): the pod that sized it pays for its pages, podlinkd never.
  absl::StatusOr<std::shared_ptr<MemoryObject>> Adopt(const ExportClaim& claim, UniqueFd fd,
                                                      const std::string& fabric_handle) override;

 private:
  std::shared_ptr<HostPinner> pinner_;
  std::shared_ptr<MappingBudget> mappings_;
};

}  // namespace podlink
