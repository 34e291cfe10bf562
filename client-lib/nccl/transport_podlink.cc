#include "client-lib/nccl/transport_podlink.h"

#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/net_socket.h"
#include "client-lib/nccl/plugin.h"
#include "common/status_util.h"

namespace podlink::ncclnet {

using nccl_abi::kInternalError;
using nccl_abi::kInvalidArgument;
using nccl_abi::kInvalidUsage;
using nccl_abi::kRemoteError;
using nccl_abi::kSuccess;
using nccl_abi::kSystemError;
using nccl_abi::kUnhandledCudaError;

bool PodlinkPeerGone(Comm& c) {
  // Cheap enough every 4096 calls; a dead peer otherwise leaves NCCL waiting forever.
  return (++c.calls & 4095) == 0 && PeerClosed(c.ctrl.get());
}

void PublishDone(Comm& c, uint64_t seq, int index, uint64_t size) {
  DoneSlot& d = c.region->done[seq % kSlots];
  int slot = static_cast<int>(seq % kSlots);
  if (c.done_seq[slot] != seq || c.done_mask[slot] == 0) {
    c.done_seq[slot] = seq;
    c.done_mask[slot] = 0;
  }
  d.sizes[index] = size;
  c.done_mask[slot] |= 1u << index;
  d.state.store(DoneState(seq, c.done_mask[slot]), std::memory_order_release);
}

absl::StatusOr<RemoteRegion> OpenRemote(Comm& c, uint64_t export_id) {
  State& s = S();
  RegionDescriptor d;
  d.node_id = s.node_id;
  d.export_id = export_id;
  PODLINK_ASSIGN_OR_RETURN(RemoteRegion r, s.engine->Open(d));
  if (c.opened.insert(export_id).second) {
    std::lock_guard<std::mutex> l(s.mu);
    s.remote_refs[export_id]++;
  }
  return r;
}

void CloseRemotes(Comm& c) {
  State& s = S();
  for (uint64_t id : c.opened) {
    bool last = false;
    {
      std::lock_guard<std::mutex> l(s.mu);
      last = --s.remote_refs[id] == 0;
      if (last) s.remote_refs.erase(id);
    }
    if (last) {
      RemoteRegion r;
      r.export_id = id;
      (void)s.engine->Close(r);
    }
  }
  c.opened.clear();
}

Result PodlinkIsend(Comm& c, void* data, size_t size, int tag, Mr* mr, void** request) {
  const size_t asked = size;
  if (!c.have_cts) {
    CtsSlot& slot = c.region->cts[c.next_seq % kSlots];
    if (slot.ready.load(std::memory_order_acquire) != c.next_seq + 1) {
      if (PodlinkPeerGone(c)) {
        c.failed = kRemoteError;
        return Fail(kRemoteError, absl::StrCat("connection with ", c.peer, ": the receiver went away"));
      }
      return kSuccess;  // *request stays NULL: not now
    }
    // Copy once: the peer could change the entry under us.
    c.cts_copy.n = slot.n;
    std::memcpy(c.cts_copy.tags, slot.tags, sizeof(slot.tags));
    std::memcpy(c.cts_copy.sizes, slot.sizes, sizeof(slot.sizes));
    std::memcpy(c.cts_copy.region, slot.region, sizeof(slot.region));
    std::memcpy(c.cts_copy.offset, slot.offset, sizeof(slot.offset));
    if (c.cts_copy.n < 1 || c.cts_copy.n > kMaxRecvs) {
      c.failed = kRemoteError;
      return Fail(kRemoteError, absl::StrCat("connection with ", c.peer, ": malformed clear-to-send entry"));
    }
    c.have_cts = true;
    c.cts_consumed = 0;
  }
  const CtsSlot& cts = c.cts_copy;
  int index = -1;
  if (Result m = MatchTag(cts.tags, cts.n, c.cts_consumed, tag, c.peer, &index); m != kSuccess) return m;
  Request* r = TakeRequest(c);
  if (r == nullptr) return kSuccess;  // all 32 in use: not now
  uint64_t seq = c.next_seq;
  c.cts_consumed |= 1u << index;
  if (c.cts_consumed == (1u << cts.n) - 1) {
    c.have_cts = false;
    c.next_seq++;
  }
  r->send = true;
  r->seq = seq;
  r->index = index;
  r->size = size;
  if (size > cts.sizes[index]) size = r->size = Truncate(c, size, cts.sizes[index]);
  if (size > 0) {
    uint64_t off = static_cast<char*>(data) - mr->base;
    if (mr->bounce()) {
      absl::Status st = CopyFor(c, mr->type, reinterpret_cast<void*>(mr->bounce_ptr() + off), data, size);
      if (!st.ok()) {
        DropRequest(*r);
        return FailStatus(kUnhandledCudaError, "staging a send", st);
      }
    }
    auto remote = OpenRemote(c, cts.region[index]);
    if (!remote.ok()) {
      DropRequest(*r);
      return FailStatus(kSystemError, "opening the receiver's buffer", remote.status());
    }
    TransferOp op{&mr->region, mr->region_offset + off, &*remote, cts.offset[index], size};
    auto batch = S().engine->WriteAsync({op});
    if (!batch.ok()) {
      DropRequest(*r);
      return FailStatus(kSystemError, "submitting a relay copy", batch.status());
    }
    r->batch = *batch;
  }
  TRACE_OP("trace isend comm=%p peer=%s seq=%lu index=%d tag=%d size=%zu room=%lu type=%d", static_cast<void*>(&c),
           c.peer.c_str(), static_cast<unsigned long>(seq), index, tag, asked,
           static_cast<unsigned long>(cts.sizes[index]), mr != nullptr ? mr->type : -1);
  *request = r;
  return kSuccess;
}

Result PodlinkIrecv(Comm& c, int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request) {
  Request* r = TakeRequest(c, static_cast<int>(c.next_seq % kMaxRequests));
  if (r == nullptr) return kSuccess;
  CtsSlot& slot = c.region->cts[c.next_seq % kSlots];
  slot.n = static_cast<uint32_t>(n);
  for (int i = 0; i < n; ++i) {
    uint64_t off = static_cast<char*>(data[i]) - mrs[i]->base;
    slot.tags[i] = tags[i];
    slot.sizes[i] = sizes[i];
    slot.region[i] = mrs[i]->region.export_id;
    slot.offset[i] = mrs[i]->region_offset + off;
  }
  r->seq = c.next_seq;
  r->n = n;
  TRACE_OP("trace irecv comm=%p peer=%s seq=%lu n=%d tag0=%d size0=%zu type0=%d", static_cast<void*>(&c),
           c.peer.c_str(), static_cast<unsigned long>(c.next_seq), n, tags[0], sizes[0], mrs[0]->type);
  slot.ready.store(c.next_seq + 1, std::memory_order_release);
  c.next_seq++;
  *request = r;
  return kSuccess;
}

Result PodlinkTest(Request& r, int* done, int* sizes) {
  Comm& c = *r.comm;
  if (r.send) {
    if (r.batch != 0) {
      auto polled = S().engine->Poll(r.batch);
      if (polled.ok() && !*polled) return kSuccess;
      absl::Status st = polled.ok() ? S().engine->Wait(r.batch) : polled.status();
      r.batch = 0;
      if (!st.ok()) {
        PublishDone(c, r.seq, r.index, kSizeError);
        DropRequest(r);
        return FailStatus(kSystemError, "relay copy", st);
      }
    }
    PublishDone(c, r.seq, r.index, r.size);
    if (sizes != nullptr) sizes[0] = static_cast<int>(r.size);
    *done = 1;
    DropRequest(r);
    return kSuccess;
  }
  DoneSlot& d = c.region->done[r.seq % kSlots];
  uint32_t full = (1u << r.n) - 1;
  if (d.state.load(std::memory_order_acquire) != DoneState(r.seq, full)) {
    if (PodlinkPeerGone(c)) {
      c.failed = kRemoteError;
      return Fail(kRemoteError, absl::StrCat("connection with ", c.peer, ": the sender went away"));
    }
    return kSuccess;
  }
  Result result = kSuccess;
  for (int i = 0; i < r.n; ++i) {
    uint64_t got = d.sizes[i];
    if (got == kSizeError) {
      result = Fail(kInvalidUsage, absl::StrCat("receive from ", c.peer, ": the matching send failed (see the "
                                                "sender's log; a send larger than the receive is an error)"));
      continue;
    }
    if (got > r.posted[i]) {
      result = Fail(kRemoteError, absl::StrCat("receive from ", c.peer, ": peer reports ", got, " bytes for a ",
                                               r.posted[i], "-byte buffer"));
      continue;
    }
    Mr* mr = r.mr[i];
    if (mr->bounce() && got > 0) {
      uint64_t off = static_cast<char*>(r.data[i]) - mr->base;
      absl::Status st = CopyFor(c, mr->type, r.data[i], reinterpret_cast<void*>(mr->bounce_ptr() + off), got);
      if (!st.ok()) result = FailStatus(kUnhandledCudaError, "copying a receive out of its bounce buffer", st);
    }
    if (sizes != nullptr) sizes[i] = static_cast<int>(got);
  }
  *done = 1;
  DropRequest(r);
  return result;
}

Result SetupPodlinkReceiver(Comm& c, Welcome& w) {
  State& s = S();
  auto buf = s.client->AllocateHost(sizeof(CtrlRegion));
  if (!buf.ok()) return FailStatus(kSystemError, "allocating the control region", buf.status());
  auto id = s.client->Export(**buf);
  if (!id.ok()) return FailStatus(kSystemError, "exporting the control region", id.status());
  c.region_buf = *std::move(buf);
  c.region_export = *id;
  c.region = static_cast<CtrlRegion*>(c.region_buf->data());  // zero-filled memfd
  c.region->magic = kRegionMagic;
  c.region->version = kWireVersion;
  w.ctrl_export = *id;
  w.ctrl_size = sizeof(CtrlRegion);
  return kSuccess;
}

Result SetupPodlinkSender(Comm& c, const Welcome& w) {
  State& s = S();
  auto imp = s.client->Import(w.ctrl_export);
  if (!imp.ok()) return FailStatus(kSystemError, "importing the receiver's control region", imp.status());
  if (imp->info().handle_type != HandleType::kHostMemfd || imp->info().size < sizeof(CtrlRegion)) {
    return Fail(kRemoteError, "the receiver's control region is not a host region of the expected size");
  }
  auto map = s.client->Map(*imp);
  if (!map.ok()) return FailStatus(kSystemError, "mapping the receiver's control region", map.status());
  c.region_map = *std::move(map);
  c.region = static_cast<CtrlRegion*>(c.region_map->host_ptr());
  if (c.region->magic != kRegionMagic || c.region->version != kWireVersion) {
    return Fail(kRemoteError, "the receiver's control region has an unknown format");
  }
  // The import record can go; the mapping keeps the memory.
  (void)s.client->Release(w.ctrl_export);
  return kSuccess;
}

}  // namespace podlink::ncclnet
