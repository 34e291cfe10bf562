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

// One allocation the daemon imported, at its place in the export.
struct Chunk {
  CuMemHandle handle;
  UniqueFd fd;     // invalid for fabric handles
  uint64_t size;   // what the daemon maps of it: the whole allocation, or the export's size for a plain export
};

class CudaObject : public MemoryObject {
 public:
  // `chunks` are mapped back to back; the export is `size` bytes from
  // `offset` in the first (a plain export: one chunk, offset 0, not chunked).
  // `access` lists the daemon ordinals that get read-write access when the
  // relay maps the memory: the owning GPU and its P2P peers.
  CudaObject(HandleKind kind, std::vector<Chunk> chunks, bool chunked, uint64_t offset, std::string fabric,
             const cu::Driver* d, uint64_t size, int gpu, std::vector<int> access)
      : kind_(kind),
        chunks_(std::move(chunks)),
        chunked_(chunked),
        offset_(offset),
        fabric_(std::move(fabric)),
        d_(d),
        size_(size),
        gpu_(gpu),
        access_(std::move(access)) {
    for (const Chunk& c : chunks_) span_ += c.size;
  }
  ~CudaObject() override {
    absl::MutexLock l(&mu_);
    if (va_ != 0) {
      uint64_t at = va_;
      for (const Chunk& c : chunks_) {
        d_->MemUnmap(at, c.size);
        at += c.size;
      }
      d_->MemAddressFree(va_, span_);
    }
    if (ctx_ != nullptr) d_->DevicePrimaryCtxRelease(gpu_);
  }
  absl::StatusOr<RelayView> MapForRelay() override {
    absl::MutexLock l(&mu_);
    if (va_ == 0) {
      cu::DevicePtr va = 0;
      PODLINK_RETURN_IF_ERROR(cu::CuStatus(d_->MemAddressReserve(&va, span_, 0, 0, 0), "cuMemAddressReserve"));
      std::vector<cu::MemAccessDesc> desc;
      for (int dev : access_) desc.push_back({{cu::kLocationTypeDevice, dev}, cu::kAccessProtReadWrite});
      // Each allocation mapped whole at its place, and its access set on its own mapping.
      uint64_t at = va;
      size_t mapped = 0;
      absl::Status st;
      for (const Chunk& c : chunks_) {
        st = cu::CuStatus(d_->MemMap(at, c.size, 0, c.handle.get(), 0), "cuMemMap (relay)");
        if (!st.ok()) break;
        ++mapped;
        st = cu::CuStatus(d_->MemSetAccess(at, c.size, desc.data(), desc.size()), "cuMemSetAccess (relay)");
        if (!st.ok()) break;
        at += c.size;
      }
      if (!st.ok()) {
        at = va;
        for (size_t i = 0; i < mapped; ++i) {
          d_->MemUnmap(at, chunks_[i].size);
          at += chunks_[i].size;
        }
        d_->MemAddressFree(va, span_);
        return st;
      }
      va_ = va;
    }
    return RelayView{true, gpu_, va_ + offset_, size_};
  }
  HandleKind kind() const override { return kind_; }
  absl::StatusOr<UniqueFd> Duplicate() const override { return Dup(chunks_.front().fd); }
  ChunkLayout Layout() const override {
    if (!chunked_) return {};
    ChunkLayout out;
    out.offset = offset_;
    for (const Chunk& c : chunks_) out.sizes.push_back(c.size);
    return out;
  }
  absl::StatusOr<UniqueFd> DuplicateChunk(size_t i) const override {
    if (i >= chunks_.size()) return absl::OutOfRangeError(absl::StrCat("no allocation ", i, " in this export"));
    return Dup(chunks_[i].fd);
  }
  std::string FabricHandle() const override { return fabric_; }
  // On any thread (the mesh asks on its gRPC threads): the GPU's context is
  // made current for the call, as the copies below do.
  absl::StatusOr<UniqueFd> DmaBuf() override {
    if (chunked_) {
      // A NIC registers one dma-buf from offset 0: the mesh then moves this memory by copies instead.
      return absl::FailedPreconditionError("an export of several cuMem allocations (or from an offset) has no "
                                           "single dma-buf");
    }
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

  static absl::StatusOr<UniqueFd> Dup(const UniqueFd& fd) {
    if (!fd.valid()) return absl::FailedPreconditionError("fabric export has no descriptor");
    int d = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
    if (d < 0) return ErrnoStatus(errno, "dup cuMem descriptor");
    return UniqueFd(d);
  }

  HandleKind kind_;
  std::vector<Chunk> chunks_;
  const bool chunked_;
  const uint64_t offset_;
  uint64_t span_ = 0;  // the chunks' summed sizes: the daemon's reservation
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
  // Owns an imported handle once it is known to be an allocation on the claimed GPU.
  auto on_claimed_gpu = [&](cu::MemHandle h, const std::string& which) -> absl::StatusOr<CuMemHandle> {
    CuMemHandle handle(d, h);
    cu::MemAllocationProp prop{};
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(d->MemGetAllocationPropertiesFromHandle(&prop, h),
                                         "cuMemGetAllocationPropertiesFromHandle"));
    if (prop.location.type != cu::kLocationTypeDevice || prop.location.id != gpu->ordinal) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, "export claims GPU ", claim.gpu_uuid, " but the allocation lives on device ordinal ",
          prop.location.id));
    }
    return handle;
  };
  // Imports one POSIX-FD descriptor: an allocation on the claimed GPU.
  auto import_fd = [&](const UniqueFd& from, const std::string& which) -> absl::StatusOr<CuMemHandle> {
    if (!from.valid()) return absl::InvalidArgumentError("POSIX-FD export needs a descriptor");
    cu::MemHandle h = 0;
    cu::Result r = d->MemImportFromShareableHandle(
        &h, reinterpret_cast<void*>(static_cast<intptr_t>(from.get())), cu::kHandleTypePosixFd);
    if (r != cu::kSuccess) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, "descriptor is not an importable cuMem POSIX-FD handle: ",
          cu::CuStatus(r, "cuMemImportFromShareableHandle").message()));
    }
    return on_claimed_gpu(h, which);
  };
  std::vector<Chunk> chunks;
  const bool chunked = !claim.chunk_sizes.empty();
  if (chunked) {
    // Each allocation whole (CheckChunkLayout checked the layout): a real allocation of at least its size.
    if (claim.kind != HandleKind::kPosixFd || claim.chunk_fds == nullptr ||
        claim.chunk_fds->size() != claim.chunk_sizes.size()) {
      return absl::InvalidArgumentError("a chunked export is POSIX-FD descriptors, one per allocation");
    }
    for (size_t i = 0; i < claim.chunk_sizes.size(); ++i) {
      std::string which = absl::StrCat("allocation ", i, " of the export: ");
      PODLINK_ASSIGN_OR_RETURN(CuMemHandle handle, import_fd((*claim.chunk_fds)[i], which));
      absl::Status size_ok = CheckSize(*d, handle.get(), claim.chunk_sizes[i], gpu->granularity);
      if (!size_ok.ok()) return absl::Status(size_ok.code(), absl::StrCat(which, size_ok.message()));
      chunks.push_back(Chunk{std::move(handle), std::move((*claim.chunk_fds)[i]), claim.chunk_sizes[i]});
    }
  } else if (claim.kind == HandleKind::kPosixFd) {
    PODLINK_ASSIGN_OR_RETURN(CuMemHandle handle, import_fd(fd, ""));
    PODLINK_RETURN_IF_ERROR(CheckSize(*d, handle.get(), claim.size, gpu->granularity));
    chunks.push_back(Chunk{std::move(handle), std::move(fd), claim.size});
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
    cu::MemHandle h = 0;
    cu::Result r = d->MemImportFromShareableHandle(&h, &fh, cu::kHandleTypeFabric);
    if (r != cu::kSuccess) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fabric handle is not importable: ", cu::CuStatus(r, "cuMemImportFromShareableHandle").message()));
    }
    PODLINK_ASSIGN_OR_RETURN(CuMemHandle handle, on_claimed_gpu(h, ""));
    PODLINK_RETURN_IF_ERROR(CheckSize(*d, handle.get(), claim.size, gpu->granularity));
    chunks.push_back(Chunk{std::move(handle), UniqueFd(), claim.size});
  }
  std::vector<int> access = {gpu->ordinal};
  for (const GpuPeer& p : gpu->peers) {
    const GpuDevice* pd = inventory_->FindByUuid(p.uuid);
    if (p.p2p_supported && pd != nullptr) access.push_back(pd->ordinal);
  }
  return std::make_shared<CudaObject>(claim.kind, std::move(chunks), chunked, chunked ? claim.offset : 0,
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
