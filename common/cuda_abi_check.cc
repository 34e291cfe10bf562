// Compile-time check of cuda_driver.h against the real cuda.h. Built only
// when the header is found; contains no code.
#include <cstddef>

#include <cuda.h>

#include "common/cuda_driver.h"

namespace c = podlink::cu;

static_assert(sizeof(c::MemAllocationProp) == sizeof(CUmemAllocationProp));
static_assert(offsetof(c::MemAllocationProp, location) == offsetof(CUmemAllocationProp, location));
static_assert(offsetof(c::MemAllocationProp, win32HandleMetaData) ==
              offsetof(CUmemAllocationProp, win32HandleMetaData));
static_assert(offsetof(c::MemAllocationProp, allocFlags) ==
              offsetof(CUmemAllocationProp, allocFlags));
static_assert(sizeof(c::MemAccessDesc) == sizeof(CUmemAccessDesc));
static_assert(offsetof(c::MemAccessDesc, flags) == offsetof(CUmemAccessDesc, flags));
static_assert(sizeof(c::FabricHandle) == sizeof(CUmemFabricHandle));
static_assert(sizeof(c::Uuid) == sizeof(CUuuid));
static_assert(sizeof(c::DevicePtr) == sizeof(CUdeviceptr));
static_assert(sizeof(c::MemHandle) == sizeof(CUmemGenericAllocationHandle));
static_assert(c::kSuccess == CUDA_SUCCESS);
static_assert(c::kErrorInvalidDevice == CUDA_ERROR_INVALID_DEVICE);
static_assert(c::kErrorNotPermitted == CUDA_ERROR_NOT_PERMITTED);
static_assert(c::kErrorNotSupported == CUDA_ERROR_NOT_SUPPORTED);
static_assert(c::kErrorNoDevice == CUDA_ERROR_NO_DEVICE);
static_assert(c::kErrorNotReady == CUDA_ERROR_NOT_READY);
static_assert(c::kStreamNonBlocking == CU_STREAM_NON_BLOCKING);
static_assert(c::kEventDisableTiming == CU_EVENT_DISABLE_TIMING);
static_assert(c::kHostRegisterPortable == CU_MEMHOSTREGISTER_PORTABLE);
static_assert(c::kHandleTypePosixFd == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
static_assert(c::kHandleTypeFabric == CU_MEM_HANDLE_TYPE_FABRIC);
static_assert(c::kLocationTypeDevice == CU_MEM_LOCATION_TYPE_DEVICE);
static_assert(c::kAllocationTypePinned == CU_MEM_ALLOCATION_TYPE_PINNED);
static_assert(c::kAccessProtReadWrite == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
static_assert(c::kGranularityRecommended == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
static_assert(c::kAttrPciBusId == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
static_assert(c::kAttrVmmSupported == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
static_assert(c::kAttrPosixFdSupported == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
static_assert(c::kAttrFabricSupported == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);
static_assert(c::kAttrGpuDirectRdmaWithVmm == CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
static_assert(c::kAttrDmaBufSupported == CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
static_assert(c::kRangeHandleTypeDmaBufFd == CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD);
