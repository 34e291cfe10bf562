#include "daemon/gpu/memory_object.h"

#include <cstring>

#include "common/status_util.h"

namespace podlink {

absl::Status MemoryObject::CopyIn(uint64_t offset, const void* src, uint64_t n) {
  PODLINK_ASSIGN_OR_RETURN(RelayView v, MapForRelay());
  if (v.on_gpu) return absl::UnimplementedError("this GPU memory cannot be copied by the daemon");
  std::memcpy(reinterpret_cast<char*>(v.address) + offset, src, n);
  return absl::OkStatus();
}

absl::Status MemoryObject::CopyOut(uint64_t offset, void* dst, uint64_t n) {
  PODLINK_ASSIGN_OR_RETURN(RelayView v, MapForRelay());
  if (v.on_gpu) return absl::UnimplementedError("this GPU memory cannot be copied by the daemon");
  std::memcpy(dst, reinterpret_cast<const char*>(v.address) + offset, n);
  return absl::OkStatus();
}

const char* HandleKindName(HandleKind k) {
  switch (k) {
    case HandleKind::kPosixFd:
      return "posix-fd";
    case HandleKind::kFabric:
      return "fabric";
    case HandleKind::kHostMemfd:
      return "host-memfd";
    case HandleKind::kProcessMemory:
      return "process-memory";
  }
  return "unknown";
}

}  // namespace podlink
