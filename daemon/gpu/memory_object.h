// What the broker keeps for one export: the daemon's own reference to the
// memory (descriptor, imported cuMem handle), kept until the export dies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace podlink {

// Values equal podlink.v1.HandleType.
enum class HandleKind : int { kPosixFd = 1, kFabric = 2, kHostMemfd = 3, kProcessMemory = 4 };

const char* HandleKindName(HandleKind k);

// Where podlinkd itself reaches an export's bytes, for the relay.
struct RelayView {
  bool on_gpu = false;
  int gpu = -1;           // the daemon's CUDA ordinal of the GPU holding the memory
  uint64_t address = 0;   // host pointer, or device address in the daemon's address space; with mem_fd, an
                          // address in the exporting process (never a pointer of the daemon's)
  uint64_t size = 0;
  int mem_fd = -1;        // process memory: the exporter's /proc/<pid>/mem, read and written at `address`
};

// A GPU export of several cuMem allocations mapped back to back (torch's
// expandable segments), or of one from an offset: each allocation's size, in
// order, and where the export's byte 0 lies in the first. Empty sizes: one
// allocation (or a memfd, ...) from its start.
struct ChunkLayout {
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
};

// OK when `sizes` (each > 0) hold [offset, offset + size) with offset inside
// the first and no allocation wholly past the end: what a chunked export must be
// before any backend looks at its descriptors.
absl::Status CheckChunkLayout(const std::vector<uint64_t>& sizes, uint64_t offset, uint64_t size);

class MemoryObject {
 public:
  virtual ~MemoryObject() = default;
  // Maps the memory into the daemon once (later calls return the same view);
  // the mapping lives as long as the object.
  // Process memory has no such mapping and fails here, so every path that
  // takes the view's address as the daemon's own pointer (the mesh, rings,
  // RDMA registration) refuses it.
  virtual absl::StatusOr<RelayView> MapForRelay() = 0;
  // The view the relay's copy executor uses: MapForRelay's, or for process
  // memory one with mem_fd set, which only the executor understands.
  virtual absl::StatusOr<RelayView> CopyView() { return MapForRelay(); }
  virtual HandleKind kind() const = 0;
  // A fresh duplicate of the descriptor for an importer (descriptor kinds).
  virtual absl::StatusOr<UniqueFd> Duplicate() const = 0;
  // A chunked export's layout; empty for every other object.
  virtual ChunkLayout Layout() const { return {}; }
  // A chunked export: a fresh duplicate of allocation `i`'s descriptor (one at a time: an import of 1024
  // allocations then holds one more of podlinkd's descriptors while it delivers, not 1024).
  virtual absl::StatusOr<UniqueFd> DuplicateChunk(size_t i) const {
    return absl::FailedPreconditionError("this export is one descriptor");
  }
  // The 64-byte fabric handle (kFabric), empty otherwise.
  virtual std::string FabricHandle() const { return {}; }
  // OK when every page of [offset, offset + length) is populated (host
  // memfds: the whole file must be, as tmpfs cannot tell which pages of a
  // partly punched file remain), so a copy by podlinkd allocates nothing (pages it faulted in would be charged to
  // podlinkd's memory cgroup, not the pod's). Memory that cannot have holes
  // (GPU allocations) is always OK.
  virtual absl::Status CheckPopulated(uint64_t offset, uint64_t length) const { return absl::OkStatus(); }
  // A dma-buf of the whole memory, for an RDMA NIC to register
  // (ibv_reg_dmabuf_mr): GPU memory through the daemon's relay mapping.
  virtual absl::StatusOr<UniqueFd> DmaBuf() { return absl::UnimplementedError("this memory has no dma-buf"); }
  // Copies n bytes into / out of [offset, offset + n) through the daemon's
  // own mapping, synchronously (the mesh links serving another node's pods;
  // the caller checked the range): memcpy for host memory, the GPU's copy
  // engine in its primary context for GPU memory.
  virtual absl::Status CopyIn(uint64_t offset, const void* src, uint64_t n);
  virtual absl::Status CopyOut(uint64_t offset, void* dst, uint64_t n);
};

// What an exporter claims; a backend checks it against the memory itself.
struct ExportClaim {
  uint64_t size = 0;
  std::string gpu_uuid;  // empty for host memory
  HandleKind kind = HandleKind::kHostMemfd;
  // Process memory: the range's start in the exporter's address space, and
  // the exporter as the kernel named it (the session's peer, pinned by pidfd).
  uint64_t address = 0;
  int pid = 0;
  int pidfd = -1;
  uint64_t session = 0;  // the exports of one session share one descriptor of its process's memory
  // A chunked POSIX-FD export (checked by CheckChunkLayout): each allocation's
  // size and descriptor (the backend takes them), and the export's offset in
  // the first; Adopt's own descriptor is then invalid.
  std::vector<uint64_t> chunk_sizes{};
  std::vector<UniqueFd>* chunk_fds = nullptr;
  uint64_t offset = 0;
};

// Page-locks host memory for the GPUs' copy engines. A relay copy from or to
// pageable memory goes through the CUDA driver's own staging buffers and
// blocks the relay thread; from page-locked memory it is one DMA, queued like
// any other copy.
class HostPinner {
 public:
  virtual ~HostPinner() = default;
  virtual absl::Status Pin(void* p, uint64_t size) = 0;
  virtual void Unpin(void* p) = 0;
};

// Validates and adopts memory handed over by a client. Implementations never
// trust the claim: they inspect the descriptor or handle.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual bool Handles(HandleKind kind) const = 0;
  virtual absl::StatusOr<std::shared_ptr<MemoryObject>> Adopt(const ExportClaim& claim, UniqueFd fd,
                                                              const std::string& fabric_handle) = 0;
};

}  // namespace podlink
