#include "daemon/gpu/memory_object.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace podlink {

absl::Status CheckChunkLayout(const std::vector<uint64_t>& sizes, uint64_t offset, uint64_t size) {
  if (sizes.empty()) return absl::InvalidArgumentError("a chunked export needs at least one allocation");
  uint64_t span = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return absl::InvalidArgumentError(absl::StrCat("allocation ", i, " of the export has size 0"));
    if (span + sizes[i] < span) return absl::InvalidArgumentError("the export's allocation sizes overflow");
    span += sizes[i];
  }
  if (offset >= sizes[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset ", offset, " lies past the first allocation (", sizes[0], " bytes)"));
  }
  if (size == 0 || size > span - offset) {
    return absl::InvalidArgumentError(absl::StrCat("size ", size, " from offset ", offset,
                                                   " does not fit the export's allocations (", span, " bytes)"));
  }
  if (offset + size <= span - sizes.back()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the export's last allocation lies wholly past its end (", offset + size, " of ", span,
        " bytes used): name only the allocations the range touches"));
  }
  return absl::OkStatus();
}

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
