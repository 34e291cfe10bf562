// The cuMem allocations under a device range that an application already
// has: torch's expandable segments map one allocation per 2 MiB (small pool)
// or 20 MiB (large pool) chunk, back to back, and a tensor starts anywhere in
// a chunk and may span many. FindExistingRange walks the range chunk by chunk
// (cuMemGetAddressRange gives each mapped allocation's own extent) and keeps a
// reference to each allocation, so Client::ExportExisting exports every one of
// them with the range's offset in the first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda_driver.h"

namespace podlink {

// podlinkd's default bound on the allocations of one export (its
// max_export_chunks): 20 GiB of torch's 20 MiB chunks.
inline constexpr size_t kMaxExportChunks = 1024;

struct ExistingChunk {
  uint64_t base = 0;  // the allocation's first byte in this process
  uint64_t size = 0;  // the whole allocation
  cu::MemHandle handle = 0;  // retained (cuMemRetainAllocationHandle); released with the range
};

// Owns a reference to each allocation under the range.
class ExistingRange {
 public:
  explicit ExistingRange(const cu::Driver* d) : d_(d) {}
  ~ExistingRange();
  ExistingRange(ExistingRange&& o) noexcept;
  ExistingRange& operator=(ExistingRange&&) = delete;
  ExistingRange(const ExistingRange&) = delete;

  std::vector<ExistingChunk> chunks;  // in address order, each starting where the one before ends
  uint64_t offset = 0;                // the range's first byte in chunks[0]
  int device = -1;                    // the CUDA ordinal holding every chunk

  // One allocation, from its start, exactly the range: exportable as one plain handle.
  bool Whole(uint64_t size) const { return chunks.size() == 1 && offset == 0 && chunks[0].size == size; }

 private:
  const cu::Driver* d_;
};

// [ptr, ptr + size) as the cuMem allocations that hold it, each one shareable
// with a POSIX-FD handle and on one GPU. Refused whole otherwise, naming the
// way out: memory from cudaMalloc (torch's default caching allocator) or from
// cuMemCreate without a shareable handle type (vLLM's CuMemAllocator for
// sleep mode), a range over two GPUs, a hole, or more than max_chunks
// allocations.
absl::StatusOr<ExistingRange> FindExistingRange(const cu::Driver& d, uint64_t ptr, uint64_t size,
                                                size_t max_chunks = kMaxExportChunks);

}  // namespace podlink
