#include "client-lib/nccl/comm.h"

#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/plugin.h"
#include "client-lib/nccl/transport_podlink.h"
#include "client-lib/nccl/transport_tcp.h"

namespace podlink::ncclnet {

using nccl_abi::kInternalError;
using nccl_abi::kInvalidArgument;
using nccl_abi::kInvalidUsage;
using nccl_abi::kRemoteError;
using nccl_abi::kSuccess;
using nccl_abi::kSystemError;
using nccl_abi::kUnhandledCudaError;

Comm* AsComm(void* p, bool send) {
  auto* c = static_cast<Comm*>(p);
  if (c == nullptr || c->magic != kCommMagic || c->send != send) return nullptr;
  return c;
}

Request* TakeRequest(Comm& c, int slot) {
  if (slot >= 0) {
    Request& r = c.reqs[slot];
    if (r.in_use) return nullptr;
    r = Request();
    r.comm = &c;
    r.in_use = true;
    return &r;
  }
  for (Request& r : c.reqs) {
    if (!r.in_use) {
      r = Request();
      r.comm = &c;
      r.in_use = true;
      return &r;
    }
  }
  return nullptr;
}

// Returns the request's staging buffers and event to its comm's pools. A copy
// still running into or out of them stays ordered before any later use: the
// comm has one stream.
void DropRequest(Request& r) {
  for (HostStage& st : r.staging) {
    GiveStage(*r.comm, st);
    st = HostStage();
  }
  if (r.copied != nullptr) r.comm->event_pool.push_back(r.copied);
  r.copied = nullptr;
  r.in_use = false;
}

// The buffer of a clear-to-send entry a send with `tag` goes to: the first
// one not yet consumed with that tag (NCCL matches grouped receives by tag).
Result MatchTag(const int32_t* tags, uint32_t n, uint32_t consumed, int tag, const std::string& peer, int* index) {
  for (uint32_t i = 0; i < n; ++i) {
    if ((consumed & (1u << i)) == 0 && tags[i] == tag) {
      *index = static_cast<int>(i);
      return kSuccess;
    }
  }
  return Fail(kInvalidUsage, absl::StrCat("send with tag ", tag, " to ", peer, " does not match the posted receive"));
}

// [p, p + size) lies inside the registration.
bool Covers(const Mr& mr, const void* p, size_t size) {
  const char* q = static_cast<const char*>(p);
  return size == 0 || (q >= mr.base && size <= mr.size && static_cast<size_t>(q - mr.base) <= mr.size - size);
}

// A send larger than the posted receive delivers what fits, as NCCL's own
// IB transport does (NCCL 2.28 posts such sends: a receive sized for one
// protocol's step may meet a larger send). Logged once per comm.
size_t Truncate(Comm& c, size_t size, size_t room) {
  if (!c.warned_truncation) {
    c.warned_truncation = true;
    INFO("send of %zu bytes to %s truncated to the posted receive of %zu bytes (further truncations not logged)",
         size, c.peer.c_str(), room);
  }
  return room;
}

void DestroyComm(Comm* c) {
  State& s = S();
  if (c->transport == Transport::kTcp) {
    if (c->ctrl) ShutdownQuietly(c->ctrl.get());
    for (UniqueFd& fd : c->data) {
      if (fd) ShutdownQuietly(fd.get());
    }
  }
  if (c->transport == Transport::kPodlink && s.engine) {
    for (Request& r : c->reqs) {
      if (r.in_use && r.batch != 0) (void)s.engine->Wait(r.batch);  // the relay may still read our memory
    }
    CloseRemotes(*c);
  }
  if (c->region_export != 0 && s.client) (void)s.client->Release(c->region_export);
  if (c->stream != nullptr && s.cuda != nullptr) {
    {
      cu::ScopedContext use(*s.cuda, c->stream_ctx);
      (void)s.cuda->StreamSynchronize(c->stream);  // copies in flight end before their buffers go
    }
    for (Request& r : c->reqs) {
      if (r.in_use) DropRequest(r);
    }
    for (HostStage& st : c->stage_pool) FreeStage(*c, st);
    cu::ScopedContext use(*s.cuda, c->stream_ctx);
    for (cu::Event e : c->event_pool) s.cuda->EventDestroy(e);
    s.cuda->StreamDestroy(c->stream);
  }
  c->magic = 0;
  delete c;
  std::lock_guard<std::mutex> l(s.mu);
  s.live_comms--;
}

}  // namespace podlink::ncclnet
