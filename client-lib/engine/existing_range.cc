#include "client-lib/engine/existing_range.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace podlink {
namespace {

// What every refusal of memory podlink cannot share says: how to get memory it can.
constexpr char kWayOut[] =
    "podlink shares GPU memory made by cuMemCreate with a POSIX-FD handle type: with PyTorch set "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA allocation, or allocate with "
    "podlink (Endpoint.alloc_gpu, Client::AllocateGpu)";

}  // namespace

ExistingRange::~ExistingRange() {
  for (const ExistingChunk& c : chunks) {
    if (c.handle != 0) d_->MemRelease(c.handle);
  }
}

ExistingRange::ExistingRange(ExistingRange&& o) noexcept
    : chunks(std::move(o.chunks)), offset(o.offset), device(o.device), d_(o.d_) {
  o.chunks.clear();
}

absl::StatusOr<ExistingRange> FindExistingRange(const cu::Driver& d, uint64_t ptr, uint64_t size,
                                                size_t max_chunks) {
  if (size == 0) return absl::InvalidArgumentError("cannot register an empty range of GPU memory");
  if (ptr == 0 || ptr + size < ptr) {
    return absl::InvalidArgumentError(absl::StrCat("0x", absl::Hex(ptr), " + ", size, " is not a range of memory"));
  }
  const uint64_t end = ptr + size;
  ExistingRange range(&d);
  uint64_t at = ptr;
  while (at < end) {
    if (range.chunks.size() == max_chunks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the range 0x", absl::Hex(ptr), " + ", size, " spans more than ", max_chunks,
          " cuMem allocations (podlinkd's bound per export, max_export_chunks; the first ", max_chunks, " end ",
          at - ptr, " bytes in): register it in parts"));
    }
    cu::DevicePtr base = 0;
    size_t extent = 0;
    cu::Result r = d.MemGetAddressRange(&base, &extent, at);
    if (r != cu::kSuccess || extent == 0 || base > at || at - base >= extent) {
      return absl::InvalidArgumentError(absl::StrCat(
          "0x", absl::Hex(at), " (byte ", at - ptr, " of the range) is not GPU memory mapped in this process (",
          r != cu::kSuccess ? cu::CuStatus(r, "cuMemGetAddressRange").message() : "no mapping there", ")"));
    }
    if (!range.chunks.empty() && base != at) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the range 0x", absl::Hex(ptr), " + ", size, " is not one run of allocations: byte ", at - ptr,
          " lies inside an allocation that starts before the previous one ends"));
    }
    ExistingChunk chunk{base, extent, 0};
    r = d.MemRetainAllocationHandle(&chunk.handle, reinterpret_cast<void*>(base));
    if (r != cu::kSuccess) {
      return absl::FailedPreconditionError(absl::StrCat(
          "0x", absl::Hex(at), " (byte ", at - ptr,
          " of the range) is not cuMem memory: cudaMalloc made it (torch's default caching allocator does; ",
          cu::CuStatus(r, "cuMemRetainAllocationHandle").message(), "). ", kWayOut));
    }
    range.chunks.push_back(chunk);
    cu::MemAllocationProp prop{};
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.MemGetAllocationPropertiesFromHandle(&prop, chunk.handle),
                                         "cuMemGetAllocationPropertiesFromHandle"));
    if ((prop.requestedHandleTypes & cu::kHandleTypePosixFd) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the cuMem allocation at 0x", absl::Hex(base), " (byte ", at - ptr,
          " of the range) was created without a shareable handle type (requestedHandleTypes ",
          prop.requestedHandleTypes,
          ", no CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; vLLM's CuMemAllocator for sleep mode makes such "
          "memory): no other process can import it. ", kWayOut));
    }
    if (prop.location.type != cu::kLocationTypeDevice) {
      return absl::FailedPreconditionError(absl::StrCat("the cuMem allocation at 0x", absl::Hex(base),
                                                        " is not GPU memory (location type ",
                                                        prop.location.type, ")"));
    }
    if (range.device < 0) {
      range.device = prop.location.id;
      range.offset = ptr - base;
    } else if (prop.location.id != range.device) {
      return absl::InvalidArgumentError(absl::StrCat("the range 0x", absl::Hex(ptr), " + ", size,
                                                     " spans two GPUs (ordinals ", range.device, " and ",
                                                     prop.location.id, "): register each GPU's part"));
    }
    at = base + extent;
  }
  return range;
}

}  // namespace podlink
