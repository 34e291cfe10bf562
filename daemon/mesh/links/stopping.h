// What every room of the mesh answers once the mesh stops.
#pragma once

#include "absl/status/status.h"

namespace podlink::mesh {

inline absl::Status StoppingStatus() { return absl::UnavailableError("podlinkd is stopping"); }

}  // namespace podlink::mesh
