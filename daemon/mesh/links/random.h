// Unguessable 64-bit numbers (grants, handles, instances, transfer ids).
#pragma once

#include <cstdint>

namespace podlink::mesh {

uint64_t RandomU64();
// Never 0 (a link set's instance: 0 says "none").
inline uint64_t RandomInstance() { return RandomU64() | 1; }

}  // namespace podlink::mesh
