// The TCP transport (peers on other nodes, or any peer without podlinkd):
// clear-to-send and data frames on a control socket, payloads split over
// several data sockets, GPU memory staged through page-locked buffers.
#pragma once

#include <cstddef>

#include "client-lib/nccl/comm.h"

namespace podlink::ncclnet {

// Moves whatever the sockets take now: frames out and in, payload pieces.
Result TcpProgress(Comm& c);
void TcpQueueFrame(Comm& c, const Frame& f);
// Ends a TCP connection without a reset (see the .cc).
void ShutdownQuietly(int fd);

}  // namespace podlink::ncclnet
