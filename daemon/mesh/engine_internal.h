// Everything the mesh engine's files share (internal to the engine): the
// helpers, the control service and the peer.
#pragma once

#include "daemon/mesh/control/peer.h"
#include "daemon/mesh/engine_util.h"
