// The podlink transport (peers on this node, through podlinkd): the
// receiver exports a control region (wire.h's CtrlRegion) in which it posts
// clear-to-send entries naming exported buffers; the sender has the relay
// (or the direct path) copy into them and posts completions.
#pragma once

#include <cstddef>

#include "client-lib/nccl/comm.h"

namespace podlink::ncclnet {

Result PodlinkIsend(Comm& c, void* data, size_t size, int tag, Mr* mr, void** request);
Result PodlinkIrecv(Comm& c, int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request);
Result PodlinkTest(Request& r, int* done, int* sizes);
// Connection set-up: the receiver exports its control region and names it in
// the welcome; the sender imports and maps it.
Result SetupPodlinkReceiver(Comm& c, Welcome& w);
Result SetupPodlinkSender(Comm& c, const Welcome& w);
// Closes the remote exports the comm opened (the last user closes each).
void CloseRemotes(Comm& c);

}  // namespace podlink::ncclnet
