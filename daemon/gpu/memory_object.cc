#include "daemon/gpu/memory_object.h"

namespace podlink {

const char* HandleKindName(HandleKind k) {
  switch (k) {
    case HandleKind::kPosixFd:
      return "posix-fd";
    case HandleKind::kFabric:
      return "fabric";
    case HandleKind::kHostMemfd:
      return "host-memfd";
  }
  return "unknown";
}

}  // namespace podlink
