// PCI bus ids as sysfs names PCI functions, the one form podlink accepts from
// anywhere (sysfs paths, the CUDA driver, a pod's ExportRequest.mesh_affinity).
#pragma once

#include <string_view>

namespace podlink {

// "dddd:bb:dd.f": domain, bus and device in lowercase hex, function 0-7.
inline bool IsPciBusId(std::string_view id) {
  if (id.size() != 12 || id[4] != ':' || id[7] != ':' || id[10] != '.' || id[11] < '0' || id[11] > '7') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9}) {
    const char c = id[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace podlink
