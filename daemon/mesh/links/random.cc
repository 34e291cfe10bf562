#include "daemon/mesh/links/random.h"

#include <random>

namespace podlink::mesh {

uint64_t RandomU64() {
  std::random_device rd;  // the kernel's getrandom: unguessable
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace podlink::mesh
