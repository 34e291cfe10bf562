#include "daemon/gpu/cuda_backend.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda_driver.h"
#include "common/status_util.h"

namespace podlink {
namespace {

// Owns one cuMem allocation handle (the daemon's import of an export).
class CuMemHandle {
 public:
  CuMemHandle(const cu::Driver* d, cu::MemHandle h) : d_(d), h_(h) {}
  CuMemHandle(CuMemHandle&& o) noexcept : d_(o.d_), h_(std::exchange(o.h_, 0)) {}
  CuMemHandle& operator=(CuMemHandle&&) = delete;
  ~CuMemHandle() {
    if (h_ != 0) d_->MemRelease(h_);
  }
  cu::MemHandle get() const { return h_; }

 private:
  const cu::Driver* d_;
  cu::MemHandle h_;
};

class CudaObject : public MemoryObject {
 public:
  CudaObject(HandleKind kind, CuMemHandle handle, UniqueFd fd, std::string fabric)
      : kind_(kind), handle_(std::move(handle)), fd_(std::move(fd)), fabric_(std::move(fabric)) {}
  HandleKind kind() const override { return kind_; }
  absl::StatusOr<UniqueFd> Duplicate() const override {
    if (!fd_.valid()) return absl::FailedPreconditionError("fabric export has no descriptor");
    int d = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
    if (d < 0) return ErrnoStatus(errno, "dup cuMem descriptor");
    return UniqueFd(d);
  }
  std::string FabricHandle() const override { return fabric_; }

 private:
  HandleKind kind_;
  CuMemHandle handle_;
  UniqueFd fd_;
  std::string fabric_;
};

// Maps [0, size) of the allocation into a scratch reservation and unmaps it:
// cuMemMap fails unless the allocation really holds `size` bytes.
absl::Status CheckSize(const cu::Driver& d, cu::MemHandle h, uint64_t size, uint64_t granularity) {
  if (granularity == 0 || size % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "export size ", size, " is not a multiple of the GPU's allocation granularity ",
        granularity));
  }
  cu::DevicePtr va = 0;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.MemAddressReserve(&va, size, 0, 0, 0), "cuMemAddressReserve"));
  cu::Result r = d.MemMap(va, size, 0, h, 0);
  if (r == cu::kSuccess) d.MemUnmap(va, size);
  d.MemAddressFree(va, size);
  if (r != cu::kSuccess) {
    return absl::InvalidArgumentError(absl::StrCat(
        "export claims ", size, " bytes but the allocation is smaller (",
        cu::CuStatus(r, "cuMemMap").message(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

CudaBackend::~CudaBackend() {
  auto d = cu::LoadDriver();
  if (!d.ok()) return;
  absl::MutexLock l(&mu_);
  for (auto& [ordinal, ctx] : contexts_) (*d)->DevicePrimaryCtxRelease(ordinal);
}

absl::Status CudaBackend::MakeCurrent(const cu::Driver& d, int ordinal) {
  cu::Context ctx = nullptr;
  {
    absl::MutexLock l(&mu_);
    auto it = contexts_.find(ordinal);
    if (it == contexts_.end()) {
      PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.DevicePrimaryCtxRetain(&ctx, ordinal), "cuDevicePrimaryCtxRetain"));
      contexts_[ordinal] = ctx;
    } else {
      ctx = it->second;
    }
  }
  return cu::CuStatus(d.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}

absl::StatusOr<std::shared_ptr<MemoryObject>> CudaBackend::Adopt(const ExportClaim& claim,
                                                                 UniqueFd fd,
                                                                 const std::string& fabric) {
  if (!inventory_->cuda_available) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU exports need CUDA in podlinkd, which has none: ", inventory_->cuda_status));
  }
  const GpuDevice* gpu = inventory_->FindByUuid(claim.gpu_uuid);
  if (gpu == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown GPU '", claim.gpu_uuid, "'; GetNodeInfo lists this node's GPUs"));
  }
  if (claim.size == 0) return absl::InvalidArgumentError("export size must be > 0");
  PODLINK_ASSIGN_OR_RETURN(const cu::Driver* d, cu::LoadDriver());
  PODLINK_RETURN_IF_ERROR(MakeCurrent(*d, gpu->ordinal));
  cu::MemHandle h = 0;
  if (claim.kind == HandleKind::kPosixFd) {
    if (!fd.valid()) return absl::InvalidArgumentError("POSIX-FD export needs a descriptor");
    cu::Result r = d->MemImportFromShareableHandle(
        &h, reinterpret_cast<void*>(static_cast<intptr_t>(fd.get())), cu::kHandleTypePosixFd);
    if (r != cu::kSuccess) {
      return absl::InvalidArgumentError(absl::StrCat(
          "descriptor is not an importable cuMem POSIX-FD handle: ",
          cu::CuStatus(r, "cuMemImportFromShareableHandle").message()));
    }
  } else {
    if (!gpu->fabric_supported) {
      return absl::FailedPreconditionError(
          "fabric handles do not work on this node (no IMEX channel); export with POSIX-FD");
    }
    if (fabric.size() != cu::kFabricHandleSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("fabric handle must be ", cu::kFabricHandleSize, " bytes, got ", fabric.size()));
    }
    cu::FabricHandle fh;
    std::memcpy(fh.data, fabric.data(), sizeof(fh.data));
    cu::Result r = d->MemImportFromShareableHandle(&h, &fh, cu::kHandleTypeFabric);
    if (r != cu::kSuccess) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fabric handle is not importable: ", cu::CuStatus(r, "cuMemImportFromShareableHandle").message()));
    }
  }
  CuMemHandle handle(d, h);
  cu::MemAllocationProp prop{};
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(d->MemGetAllocationPropertiesFromHandle(&prop, h),
                                       "cuMemGetAllocationPropertiesFromHandle"));
  if (prop.location.type != cu::kLocationTypeDevice || prop.location.id != gpu->ordinal) {
    return absl::InvalidArgumentError(absl::StrCat(
        "export claims GPU ", claim.gpu_uuid, " but the allocation lives on device ordinal ",
        prop.location.id));
  }
  PODLINK_RETURN_IF_ERROR(CheckSize(*d, h, claim.size, gpu->granularity));
  return std::make_shared<CudaObject>(claim.kind, std::move(handle), std::move(fd),
                                      claim.kind == HandleKind::kFabric ? fabric : std::string());
}

}  // namespace podlink
