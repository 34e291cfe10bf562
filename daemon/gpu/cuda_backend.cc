#include "daemon/gpu/cuda_backend.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <vector>

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
  // `access` lists the daemon ordinals that get read-write access when the
  // relay maps the memory: the owning GPU and its P2P peers.
  CudaObject(HandleKind kind, CuMemHandle handle, UniqueFd fd, std::string fabric, const cu::Driver* d,
             uint64_t size, int gpu, std::vector<int> access)
      : kind_(kind),
        handle_(std::move(handle)),
        fd_(std::move(fd)),
        fabric_(std::move(fabric)),
        d_(d),
        size_(size),
        gpu_(gpu),
        access_(std::move(access)) {}
  ~CudaObject() override {
    absl::MutexLock l(&mu_);
    if (va_ != 0) {
      d_->MemUnmap(va_, size_);
      d_->MemAddressFree(va_, size_);
    }
    if (ctx_ != nullptr) d_->DevicePrimaryCtxRelease(gpu_);
  }
  absl::StatusOr<RelayView> MapForRelay() override {
    absl::MutexLock l(&mu_);
    if (va_ == 0) {
      cu::DevicePtr va = 0;
      PODLINK_RETURN_IF_ERROR(cu::CuStatus(d_->MemAddressReserve(&va, size_, 0, 0, 0), "cuMemAddressReserve"));
      if (cu::Result r = d_->MemMap(va, size_, 0, handle_.get(), 0); r != cu::kSuccess) {
        d_->MemAddressFree(va, size_);
        return cu::CuStatus(r, "cuMemMap (relay)");
      }
      std::vector<cu::MemAccessDesc> desc;
      for (int dev : access_) desc.push_back({{cu::kLocationTypeDevice, dev}, cu::kAccessProtReadWrite});
      if (cu::Result r = d_->MemSetAccess(va, size_, desc.data(), desc.size()); r != cu::kSuccess) {
        d_->MemUnmap(va, size_);
        d_->MemAddressFree(va, size_);
        return cu::CuStatus(r, "cuMemSetAccess (relay)");
      }
      va_ = va;
    }
    return RelayView{true, gpu_, va_, size_};
  }
  HandleKind kind() const override { return kind_; }
  absl::StatusOr<UniqueFd> Duplicate() const override {
    if (!fd_.valid()) return absl::FailedPreconditionError("fabric export has no descriptor");
    int d = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
    if (d < 0) return ErrnoStatus(errno, "dup cuMem descriptor");
    return UniqueFd(d);
  }
  std::string FabricHandle() const override { return fabric_; }
  // On any thread (the mesh asks on its gRPC threads): the GPU's context is
  // made current for the call, as the copies below do.
  absl::StatusOr<UniqueFd> DmaBuf() override {
    if (d_->MemGetHandleForAddressRange == nullptr) {
      return absl::FailedPreconditionError("this CUDA driver has no cuMemGetHandleForAddressRange (dma-buf)");
    }
    PODLINK_ASSIGN_OR_RETURN(RelayView view, MapForRelay());
    PODLINK_ASSIGN_OR_RETURN(cu::Context ctx, Context());
    cu::ScopedContext in(*d_, ctx);
    PODLINK_RETURN_IF_ERROR(in.status());
    int fd = -1;
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(
        d_->MemGetHandleForAddressRange(&fd, view.address, size_, cu::kRangeHandleTypeDmaBufFd, 0),
        "cuMemGetHandleForAddressRange(dma-buf)"));
    return UniqueFd(fd);
  }

  absl::Status CopyIn(uint64_t offset, const void* src, uint64_t n) override {
    PODLINK_ASSIGN_OR_RETURN(RelayView view, MapForRelay());
    PODLINK_ASSIGN_OR_RETURN(cu::Context ctx, Context());
    cu::ScopedContext in(*d_, ctx);
    PODLINK_RETURN_IF_ERROR(in.status());
    auto copy = d_->MemcpyHtoDPerThread != nullptr ? d_->MemcpyHtoDPerThread : d_->MemcpyHtoD;
    return cu::CuStatus(copy(view.address + offset, src, n), "cuMemcpyHtoD (mesh)");
  }
  absl::Status CopyOut(uint64_t offset, void* dst, uint64_t n) override {
    PODLINK_ASSIGN_OR_RETURN(RelayView view, MapForRelay());
    PODLINK_ASSIGN_OR_RETURN(cu::Context ctx, Context());
    cu::ScopedContext in(*d_, ctx);
    PODLINK_RETURN_IF_ERROR(in.status());
    auto copy = d_->MemcpyDtoHPerThread != nullptr ? d_->MemcpyDtoHPerThread : d_->MemcpyDtoH;
    return cu::CuStatus(copy(dst, view.address + offset, n), "cuMemcpyDtoH (mesh)");
  }

 private:
  // The owning GPU's primary context, retained on first use (released with the object).
  absl::StatusOr<cu::Context> Context() {
    absl::MutexLock l(&mu_);
    if (ctx_ == nullptr) {
      PODLINK_RETURN_IF_ERROR(cu::CuStatus(d_->DevicePrimaryCtxRetain(&ctx_, gpu_), "cuDevicePrimaryCtxRetain"));
    }
    return ctx_;
  }

  HandleKind kind_;
  CuMemHandle handle_;
  UniqueFd fd_;
  std::string fabric_;
  const cu::Driver* d_;
  const uint64_t size_;
  const int gpu_;
  const std::vector<int> access_;
  absl::Mutex mu_;
  cu::DevicePtr va_ ABSL_GUARDED_BY(mu_) = 0;
  cu::Context ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
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
  std::vector<int> access = {gpu->ordinal};
  for (const GpuPeer& p : gpu->peers) {
    const GpuDevice* pd = inventory_->FindByUuid(p.uuid);
    if (p.p2p_supported && pd != nullptr) access.push_back(pd->ordinal);
  }
  return std::make_shared<CudaObject>(claim.kind, std::move(handle), std::move(fd),
                                      claim.kind == HandleKind::kFabric ? fabric : std::string(), d, claim.size,
                                      gpu->ordinal, std::move(access));
}

absl::StatusOr<std::shared_ptr<CudaHostPinner>> CudaHostPinner::Create(int ordinal) {
  PODLINK_ASSIGN_OR_RETURN(const cu::Driver* d, cu::LoadDriver());
  cu::Context ctx = nullptr;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(d->DevicePrimaryCtxRetain(&ctx, ordinal), "cuDevicePrimaryCtxRetain"));
  return std::shared_ptr<CudaHostPinner>(new CudaHostPinner(d, ordinal, ctx));
}

CudaHostPinner::~CudaHostPinner() { d_->DevicePrimaryCtxRelease(ordinal_); }

absl::Status CudaHostPinner::Pin(void* p, uint64_t size) {
  cu::ScopedContext use(*d_, ctx_);
  PODLINK_RETURN_IF_ERROR(use.status());
  return cu::CuStatus(d_->MemHostRegister(p, size, cu::kHostRegisterPortable), "cuMemHostRegister");
}

void CudaHostPinner::Unpin(void* p) {
  cu::ScopedContext use(*d_, ctx_);
  (void)d_->MemHostUnregister(p);
}

}  // namespace podlink
