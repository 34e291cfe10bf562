#include "common/cuda_driver.h"

#include <dlfcn.h>

#include <cstdio>
#include <mutex>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace podlink::cu {
namespace {

// The outcome of loading, kept without heap memory: libpodlink and the NCCL
// plugin are dlclosed and loaded again, and a heap singleton would leak with
// each load.
class StoredStatus {
 public:
  StoredStatus& operator=(const absl::Status& s) {
    code_ = s.code();
    std::snprintf(message_, sizeof(message_), "%.*s", static_cast<int>(s.message().size()), s.message().data());
    return *this;
  }
  bool ok() const { return code_ == absl::StatusCode::kOk; }
  absl::string_view message() const { return message_; }
  absl::Status Get() const { return absl::Status(code_, message_); }

 private:
  absl::StatusCode code_ = absl::StatusCode::kOk;
  char message_[512] = {};
};

struct Loaded {
  Driver driver{};
  StoredStatus status;
};

template <typename F>
bool Resolve(void* lib, const char* name, F*& out, std::string& missing) {
  out = reinterpret_cast<F*>(dlsym(lib, name));
  if (out == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  return out != nullptr;
}

Loaded* DoLoad() {
  alignas(Loaded) static unsigned char storage[sizeof(Loaded)];
  auto* l = new (storage) Loaded();
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    l->status = absl::UnavailableError(
        absl::StrCat("CUDA driver not available (dlopen libcuda.so.1: ", dlerror(), ")"));
    return l;
  }
  Driver& d = l->driver;
  std::string missing;
  Resolve(lib, "cuInit", d.Init, missing);
  Resolve(lib, "cuDriverGetVersion", d.DriverGetVersion, missing);
  Resolve(lib, "cuGetErrorName", d.GetErrorName, missing);
  Resolve(lib, "cuGetErrorString", d.GetErrorString, missing);
  Resolve(lib, "cuDeviceGetCount", d.DeviceGetCount, missing);
  Resolve(lib, "cuDeviceGet", d.DeviceGet, missing);
  Resolve(lib, "cuDeviceGetName", d.DeviceGetName, missing);
  Resolve(lib, "cuDeviceGetUuid_v2", d.DeviceGetUuid, missing);
  Resolve(lib, "cuDeviceGetPCIBusId", d.DeviceGetPCIBusId, missing);
  Resolve(lib, "cuDeviceGetAttribute", d.DeviceGetAttribute, missing);
  Resolve(lib, "cuDeviceTotalMem_v2", d.DeviceTotalMem, missing);
  Resolve(lib, "cuDeviceCanAccessPeer", d.DeviceCanAccessPeer, missing);
  Resolve(lib, "cuDevicePrimaryCtxRetain", d.DevicePrimaryCtxRetain, missing);
  Resolve(lib, "cuDevicePrimaryCtxRelease_v2", d.DevicePrimaryCtxRelease, missing);
  Resolve(lib, "cuCtxSetCurrent", d.CtxSetCurrent, missing);
  Resolve(lib, "cuCtxGetCurrent", d.CtxGetCurrent, missing);
  Resolve(lib, "cuCtxSynchronize", d.CtxSynchronize, missing);
  Resolve(lib, "cuCtxCreate_v2", d.CtxCreate, missing);
  Resolve(lib, "cuCtxDestroy_v2", d.CtxDestroy, missing);
  Resolve(lib, "cuCtxPopCurrent_v2", d.CtxPopCurrent, missing);
  Resolve(lib, "cuMemGetAllocationGranularity", d.MemGetAllocationGranularity, missing);
  Resolve(lib, "cuMemCreate", d.MemCreate, missing);
  Resolve(lib, "cuMemRelease", d.MemRelease, missing);
  Resolve(lib, "cuMemExportToShareableHandle", d.MemExportToShareableHandle, missing);
  Resolve(lib, "cuMemImportFromShareableHandle", d.MemImportFromShareableHandle, missing);
  Resolve(lib, "cuMemGetAllocationPropertiesFromHandle", d.MemGetAllocationPropertiesFromHandle,
          missing);
  Resolve(lib, "cuMemRetainAllocationHandle", d.MemRetainAllocationHandle, missing);
  Resolve(lib, "cuMemAddressReserve", d.MemAddressReserve, missing);
  Resolve(lib, "cuMemAddressFree", d.MemAddressFree, missing);
  Resolve(lib, "cuMemMap", d.MemMap, missing);
  Resolve(lib, "cuMemUnmap", d.MemUnmap, missing);
  Resolve(lib, "cuMemSetAccess", d.MemSetAccess, missing);
  Resolve(lib, "cuMemGetAddressRange_v2", d.MemGetAddressRange, missing);
  std::string optional;
  Resolve(lib, "cuMemGetHandleForAddressRange", d.MemGetHandleForAddressRange, optional);
  Resolve(lib, "cuPointerGetAttribute", d.PointerGetAttribute, optional);
  Resolve(lib, "cuMemcpyHtoD_v2_ptds", d.MemcpyHtoDPerThread, optional);
  Resolve(lib, "cuMemcpyDtoH_v2_ptds", d.MemcpyDtoHPerThread, optional);
  Resolve(lib, "cuMemHostAlloc", d.MemHostAlloc, missing);
  Resolve(lib, "cuMemFreeHost", d.MemFreeHost, missing);
  Resolve(lib, "cuMemHostRegister_v2", d.MemHostRegister, missing);
  Resolve(lib, "cuMemHostUnregister", d.MemHostUnregister, missing);
  Resolve(lib, "cuMemcpyHtoD_v2", d.MemcpyHtoD, missing);
  Resolve(lib, "cuMemcpyDtoH_v2", d.MemcpyDtoH, missing);
  Resolve(lib, "cuMemsetD8_v2", d.MemsetD8, missing);
  Resolve(lib, "cuStreamCreate", d.StreamCreate, missing);
  Resolve(lib, "cuStreamDestroy_v2", d.StreamDestroy, missing);
  Resolve(lib, "cuStreamSynchronize", d.StreamSynchronize, missing);
  Resolve(lib, "cuMemcpyAsync", d.MemcpyAsync, missing);
  Resolve(lib, "cuEventCreate", d.EventCreate, missing);
  Resolve(lib, "cuEventRecord", d.EventRecord, missing);
  Resolve(lib, "cuEventQuery", d.EventQuery, missing);
  Resolve(lib, "cuEventSynchronize", d.EventSynchronize, missing);
  Resolve(lib, "cuEventDestroy_v2", d.EventDestroy, missing);
  Resolve(lib, "cuEventElapsedTime_v2", d.EventElapsedTime, missing);
  if (!missing.empty()) {
    l->status = absl::InternalError(absl::StrCat("libcuda.so.1 lacks symbols: ", missing));
    return l;
  }
  Result r = d.Init(0);
  if (r != kSuccess) {
    l->status = CuStatus(r, "cuInit");
    if (r == kErrorNoDevice) l->status = absl::UnavailableError(l->status.message());
  }
  return l;
}

}  // namespace

absl::StatusOr<const Driver*> LoadDriver() {
  static Loaded* loaded = DoLoad();
  if (!loaded->status.ok()) return loaded->status.Get();
  return &loaded->driver;
}

absl::Status CuStatus(Result r, const char* what) {
  if (r == kSuccess) return absl::OkStatus();
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* desc = "unknown error";
  auto d = LoadDriver();
  if (d.ok()) {
    (*d)->GetErrorName(r, &name);
    (*d)->GetErrorString(r, &desc);
  }
  std::string msg = absl::StrCat(what, ": ", name, " (", desc, ")");
  switch (r) {
    case kErrorInvalidValue:
      return absl::InvalidArgumentError(msg);
    case kErrorNotPermitted:
      return absl::PermissionDeniedError(msg);
    case kErrorNotSupported:
      return absl::UnimplementedError(msg);
    case kErrorInvalidDevice:
    case kErrorNoDevice:
      return absl::FailedPreconditionError(msg);
    case 2:  // CUDA_ERROR_OUT_OF_MEMORY
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

std::string FormatUuid(const Uuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  return absl::StrFormat(
      "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
      b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

}  // namespace podlink::cu
