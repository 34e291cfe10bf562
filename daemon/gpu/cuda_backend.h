// GPU backend: cuMem allocations exported as POSIX file descriptors or fabric
// handles. The daemon imports every export itself, which proves the handle is
// a real cuMem allocation on the claimed GPU and at least the claimed size,
// and keeps the allocation alive for as long as the export lives.
#pragma once

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_driver.h"
#include "daemon/gpu/gpu_inventory.h"
#include "daemon/gpu/memory_object.h"

namespace podlink {

class CudaBackend : public MemoryBackend {
 public:
  explicit CudaBackend(const GpuInventory* inventory) : inventory_(inventory) {}
  bool Handles(HandleKind kind) const override {
    return kind == HandleKind::kPosixFd || kind == HandleKind::kFabric;
  }
  absl::StatusOr<std::shared_ptr<MemoryObject>> Adopt(const ExportClaim& claim, UniqueFd fd,
                                                      const std::string& fabric_handle) override;

 private:
  // Makes the GPU's primary context current on the calling thread, retaining
  // it on first use (released when the backend is destroyed).
  absl::Status MakeCurrent(const cu::Driver& d, int ordinal) ABSL_LOCKS_EXCLUDED(mu_);

  const GpuInventory* inventory_;
  absl::Mutex mu_;
  std::map<int, cu::Context> contexts_ ABSL_GUARDED_BY(mu_);  // ordinal -> primary context

 public:
  ~CudaBackend() override;
};

// Page-locks host memory with cuMemHostRegister (portable: every GPU's
// context treats it as pinned), from the first GPU's primary context.
class CudaHostPinner : public HostPinner {
 public:
  static absl::StatusOr<std::shared_ptr<CudaHostPinner>> Create(int ordinal);
  ~CudaHostPinner() override;
  absl::Status Pin(void* p, uint64_t size) override;
  void Unpin(void* p) override;

 private:
  CudaHostPinner(const cu::Driver* d, int ordinal, cu::Context ctx) : d_(d), ordinal_(ordinal), ctx_(ctx) {}
  const cu::Driver* d_;
  const int ordinal_;
  const cu::Context ctx_;
};

}  // namespace podlink
