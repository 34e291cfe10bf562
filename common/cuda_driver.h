// The slice of the CUDA driver API podlink uses, declared here and loaded
// from libcuda.so.1 with dlopen, so every binary builds and starts on a
// machine without a GPU or CUDA headers. cuda_abi_check.cc verifies these
// declarations against cuda.h whenever that header is available.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace podlink::cu {

using Result = int;
using Device = int;
using Context = struct CtxSt*;
using Stream = struct StreamSt*;
using Event = struct EventSt*;
using DevicePtr = unsigned long long;
using MemHandle = unsigned long long;

inline constexpr Result kSuccess = 0;
inline constexpr Result kErrorInvalidValue = 1;
inline constexpr Result kErrorNotInitialized = 3;
inline constexpr Result kErrorNoDevice = 100;
inline constexpr Result kErrorInvalidDevice = 101;
inline constexpr Result kErrorNotSupported = 801;
inline constexpr Result kErrorNotPermitted = 800;
inline constexpr Result kErrorNotReady = 600;
inline constexpr unsigned kStreamNonBlocking = 0x1;
inline constexpr unsigned kEventDisableTiming = 0x2;
inline constexpr unsigned kHostRegisterPortable = 0x1;

inline constexpr int kHandleTypePosixFd = 0x1;
inline constexpr int kRangeHandleTypeDmaBufFd = 0x1;
inline constexpr int kHandleTypeFabric = 0x8;
inline constexpr int kLocationTypeDevice = 0x1;
inline constexpr int kPointerAttributeDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
inline constexpr int kAllocationTypePinned = 0x1;
inline constexpr int kAccessProtReadWrite = 0x3;
inline constexpr int kGranularityRecommended = 0x1;

inline constexpr int kAttrPciBusId = 33;
inline constexpr int kAttrVmmSupported = 102;
inline constexpr int kAttrPosixFdSupported = 103;
inline constexpr int kAttrFabricSupported = 128;
inline constexpr int kAttrGpuDirectRdmaWithVmm = 110;
inline constexpr int kAttrDmaBufSupported = 124;

inline constexpr size_t kFabricHandleSize = 64;

struct MemLocation {
  int type;
  int id;
};

struct MemAllocationProp {
  int type;
  int requestedHandleTypes;
  MemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

struct MemAccessDesc {
  MemLocation location;
  int flags;
};

struct FabricHandle {
  unsigned char data[kFabricHandleSize];
};

struct Uuid {
  char bytes[16];
};

// Function table. Every pointer is non-null once Load() succeeded.
struct Driver {
  Result (*Init)(unsigned int);
  Result (*DriverGetVersion)(int*);
  Result (*GetErrorName)(Result, const char**);
  Result (*GetErrorString)(Result, const char**);
  Result (*DeviceGetCount)(int*);
  Result (*DeviceGet)(Device*, int);
  Result (*DeviceGetName)(char*, int, Device);
  Result (*DeviceGetUuid)(Uuid*, Device);
  Result (*DeviceGetPCIBusId)(char*, int, Device);
  Result (*DeviceGetAttribute)(int*, int, Device);
  Result (*DeviceTotalMem)(size_t*, Device);
  Result (*DeviceCanAccessPeer)(int*, Device, Device);
  Result (*DevicePrimaryCtxRetain)(Context*, Device);
  Result (*DevicePrimaryCtxRelease)(Device);
  Result (*CtxSetCurrent)(Context);
  Result (*CtxGetCurrent)(Context*);
  Result (*CtxSynchronize)();
  Result (*CtxCreate)(Context*, unsigned, Device);  // cuCtxCreate_v2: pushes the new context
  Result (*CtxDestroy)(Context);
  Result (*CtxPopCurrent)(Context*);
  Result (*MemGetAllocationGranularity)(size_t*, const MemAllocationProp*, int);
  Result (*MemCreate)(MemHandle*, size_t, const MemAllocationProp*, unsigned long long);
  Result (*MemRelease)(MemHandle);
  Result (*MemExportToShareableHandle)(void*, MemHandle, int, unsigned long long);
  Result (*MemImportFromShareableHandle)(MemHandle*, void*, int);
  Result (*MemGetAllocationPropertiesFromHandle)(MemAllocationProp*, MemHandle);
  Result (*MemRetainAllocationHandle)(MemHandle*, void*);
  Result (*MemAddressReserve)(DevicePtr*, size_t, size_t, DevicePtr, unsigned long long);
  Result (*MemAddressFree)(DevicePtr, size_t);
  Result (*MemMap)(DevicePtr, size_t, size_t, MemHandle, unsigned long long);
  Result (*MemUnmap)(DevicePtr, size_t);
  Result (*MemSetAccess)(DevicePtr, size_t, const MemAccessDesc*, size_t);
  Result (*MemGetAddressRange)(DevicePtr*, size_t*, DevicePtr);
  // Optional (null on drivers without it): a dma-buf of mapped device memory.
  Result (*MemGetHandleForAddressRange)(void*, DevicePtr, size_t, int, unsigned long long);
  // Optional: null when the driver lacks it.
  Result (*PointerGetAttribute)(void*, int, DevicePtr);
  Result (*MemHostAlloc)(void**, size_t, unsigned);
  Result (*MemHostRegister)(void*, size_t, unsigned);
  Result (*MemHostUnregister)(void*);
  Result (*MemFreeHost)(void*);
  Result (*MemcpyHtoD)(DevicePtr, const void*, size_t);
  Result (*MemcpyDtoH)(void*, DevicePtr, size_t);
  // Optional: the same on the calling thread's own default stream, so that
  // copies of several threads of one context run at once instead of in turn
  // on the context's legacy stream.
  Result (*MemcpyHtoDPerThread)(DevicePtr, const void*, size_t);
  Result (*MemcpyDtoHPerThread)(void*, DevicePtr, size_t);
  Result (*MemsetD8)(DevicePtr, unsigned char, size_t);
  Result (*StreamCreate)(Stream*, unsigned);
  Result (*StreamDestroy)(Stream);
  Result (*StreamSynchronize)(Stream);
  Result (*MemcpyAsync)(DevicePtr, DevicePtr, size_t, Stream);
  Result (*EventCreate)(Event*, unsigned);
  Result (*EventRecord)(Event, Stream);
  Result (*EventQuery)(Event);
  Result (*EventSynchronize)(Event);
  Result (*EventDestroy)(Event);
  Result (*EventElapsedTime)(float*, Event, Event);
};

// Loads libcuda.so.1 once and calls cuInit(0). Thread-safe. Fails with
// UNAVAILABLE (library missing, no device) or INTERNAL (missing symbol).
absl::StatusOr<const Driver*> LoadDriver();

// "cuMemCreate: CUDA_ERROR_NOT_PERMITTED (operation not permitted)".
absl::Status CuStatus(Result r, const char* what);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string FormatUuid(const Uuid& u);

// Makes `ctx` current on the calling thread for its lifetime, then puts back
// the context that was current before (a caller's own, e.g. NCCL's in its
// proxy thread).
class ScopedContext {
 public:
  ScopedContext(const Driver& d, Context ctx) : d_(d) {
    if (d_.CtxGetCurrent(&prev_) != kSuccess) prev_ = nullptr;
    status_ = CuStatus(d_.CtxSetCurrent(ctx), "cuCtxSetCurrent");
  }
  ~ScopedContext() { (void)d_.CtxSetCurrent(prev_); }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  const Driver& d_;
  Context prev_ = nullptr;
  absl::Status status_;
};

}  // namespace podlink::cu
