// Helpers the mesh engine's files share (engine_internal.h).
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

// A relay's refusal to stage a region over verbs for its caller (no bounce
// pool for it; or, from a relay of a version before staging, "relayed
// regions ride TCP links"): the hop to it can still go over TCP.
bool RelayCannotStage(const absl::Status& st) {
  return st.code() == absl::StatusCode::kFailedPrecondition &&
         (absl::StrContains(st.message(), kRelayCannotStage) ||
          absl::StrContains(st.message(), "relayed regions ride TCP links"));
}

}  // namespace podlink::mesh
