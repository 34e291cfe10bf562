// The objects NCCL holds handles to: registered memory (Mr), requests and
// comms, and the helpers every transport uses on them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "client-lib/nccl/api.h"
#include "client-lib/nccl/gpu_staging.h"
#include "client-lib/nccl/wire.h"
#include "common/cuda_driver.h"
#include "common/unique_fd.h"
#include "podlink/client.h"
#include "podlink/transfer.h"

namespace podlink::ncclnet {

struct Comm;

// Registered memory. For the podlink transport it names an exported region
// that holds the bytes: NCCL's own cuMem buffer, or a bounce buffer when
// the memory cannot be exported (plain host memory, non-VMM GPU memory).
struct Mr {
  uint32_t magic = kMrMagic;
  Comm* comm = nullptr;
  char* base = nullptr;
  size_t size = 0;
  int type = 0;
  LocalRegion region;        // the export the relay reads / writes
  uint64_t region_offset = 0;  // where `base` lies in it
  uint64_t alloc_base = 0;   // key of the shared cuMem export (0: bounce or TCP)
  std::unique_ptr<HostBuffer> host_bounce;
  std::unique_ptr<GpuBuffer> gpu_bounce;
  bool bounce() const { return host_bounce || gpu_bounce; }
  uint64_t bounce_ptr() const {
    return host_bounce ? reinterpret_cast<uint64_t>(host_bounce->data()) : gpu_bounce->device_ptr();
  }
};

struct Request {
  Comm* comm = nullptr;
  bool in_use = false;
  bool send = false;
  uint64_t seq = 0;
  int n = 1;
  Result error = nccl_abi::kSuccess;
  // send
  int index = 0;
  size_t size = 0;
  uint64_t batch = 0;  // relay batch in flight (podlink)
  // recv
  void* data[kMaxRecvs] = {};
  size_t posted[kMaxRecvs] = {};
  size_t got[kMaxRecvs] = {};
  Mr* mr[kMaxRecvs] = {};
  int frames_left = 0;  // TCP: data frames still due
  // TCP payload in flight
  int pieces_left = 0;
  // TCP with GPU memory: page-locked host copies of the GPU buffers, and the
  // event that marks the copy to them (send) or from them (receive) done.
  HostStage staging[kMaxRecvs];
  cu::Event copied = nullptr;
  bool copying = false;  // receive: copies to the GPU started
  char* src = nullptr;   // send: the bytes for the wire (the buffer itself, or staging[0])
  bool queued = false;   // send: its pieces are in the data sockets' queues
};

struct Piece {
  Request* req;
  char* p;
  size_t left;
};

struct Comm {
  uint32_t magic = kCommMagic;
  bool send = false;
  Transport transport = Transport::kTcp;
  int dev = 0;
  std::string peer;  // for messages
  UniqueFd ctrl;
  std::vector<UniqueFd> data;
  Request reqs[kMaxRequests];
  uint64_t next_seq = 0;
  Result failed = nccl_abi::kSuccess;
  uint64_t calls = 0;
  bool warned_truncation = false;
  cu::Stream stream = nullptr;  // staging / bounce copies, in `stream_ctx` (the plugin's copy context)
  cu::Context stream_ctx = nullptr;
  // podlink transport
  std::unique_ptr<HostBuffer> region_buf;  // receiver: the control region
  uint64_t region_export = 0;
  std::unique_ptr<Mapping> region_map;     // sender: the receiver's region mapped
  CtrlRegion* region = nullptr;
  bool have_cts = false;                   // sender: `cts` is the entry being consumed
  CtsSlot cts_copy;
  uint32_t cts_consumed = 0;
  uint64_t done_seq[kSlots] = {};
  uint32_t done_mask[kSlots] = {};
  std::set<uint64_t> opened;               // sender: remote exports in use
  // TCP transport
  std::string out;       // control bytes not yet sent
  Frame in{};
  size_t in_got = 0;
  std::deque<Frame> cts_queue;  // sender: clear-to-send frames not yet consumed
  std::string peer_closed;      // receiver: why the peer's control stream ended; empty while open
  std::vector<std::deque<Piece>> pieces;  // per data socket
  std::deque<Request*> unqueued;  // sender: sends in frame order whose pieces wait for their staging copy
  std::vector<HostStage> stage_pool;   // free page-locked staging buffers
  std::vector<cu::Event> event_pool;   // free completion events
  uint32_t rr = 0;       // next data socket (advances identically on both sides)
};

// The comm behind an NCCL handle, or nullptr when it is not a live comm of
// that direction.
Comm* AsComm(void* p, bool send);

// A free request of the comm (the one at `slot` when given), reset.
Request* TakeRequest(Comm& c, int slot = -1);
void DropRequest(Request& r);

Result MatchTag(const int32_t* tags, uint32_t n, uint32_t consumed, int tag, const std::string& peer, int* index);
bool Covers(const Mr& mr, const void* p, size_t size);
size_t Truncate(Comm& c, size_t size, size_t room);

// Ends the comm's transport, waits for copies in flight, frees it.
void DestroyComm(Comm* c);

}  // namespace podlink::ncclnet
