// What every room of the mesh answers once the mesh stops.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace podlink::mesh {

inline absl::Status StoppingStatus() { return absl::UnavailableError("podlinkd is stopping"); }

// Why a task for `node` could not be queued on its peer's worker (Peer::Post
// false): the mesh stopping, or the peer's queue full.
inline absl::Status NotQueuedStatus(bool stopping, const std::string& node) {
  if (stopping) return StoppingStatus();
  return absl::ResourceExhaustedError(absl::StrCat("too many requests to node ", node, " wait already"));
}

}  // namespace podlink::mesh
