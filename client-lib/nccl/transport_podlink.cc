#include "client-lib/nccl/transport_podlink.h"

#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/net_socket.h"
#include "client-lib/nccl/plugin.h"
#include "client-lib/nccl/step_trace.h"
#include "common/status_util.h"

namespace podlink::ncclnet {

// ---------------------------------------------------------------- registration

PodlinkMr::~PodlinkMr() {
  State& s = S();
  if (alloc_base != 0) {
    bool last = false;
    LocalRegion shared;
    {
      std::lock_guard<std::mutex> l(s.mu);
      auto it = s.exports.find(alloc_base);
      if (it != s.exports.end() && --it->second.refs == 0) {
        last = true;
        shared = it->second.region;
        s.exports.erase(it);
      }
    }
    if (last) (void)s.engine->Unregister(shared);
  } else if (bounce() && s.engine) {
    (void)s.engine->Unregister(region);
  }
  if (pinned && s.cuda != nullptr) (void)s.cuda->MemHostUnregister(host_bounce->data());
}

Result PodlinkComm::RegMr(void* data, size_t size, int type, Mr** out) {
  return RegisterExported(this, dev, data, size, type, /*gpu_in_host=*/false, out);
}

Result RegisterExported(Comm* comm, int dev, void* data, size_t size, int type, bool gpu_in_host, Mr** out) {
  State& s = S();
  auto mr = std::make_unique<PodlinkMr>();
  mr->comm = comm;
  mr->base = static_cast<char*>(data);
  mr->size = size;
  mr->type = type;
  if (size == 0) {
    *out = mr.release();
    return kSuccess;
  }
  absl::Status why = absl::OkStatus();
  if (type == nccl_abi::kPtrCuda && s.cuda == nullptr) {
    return Fail(kInvalidArgument, "regMr: GPU memory but no CUDA driver in this process");
  }
  if (type == nccl_abi::kPtrCuda && !gpu_in_host) {
    cu::DevicePtr base = 0;
    size_t alloc = 0;
    if (s.cuda->MemGetAddressRange(&base, &alloc, reinterpret_cast<cu::DevicePtr>(data)) == cu::kSuccess) {
      std::lock_guard<std::mutex> l(s.mu);
      auto it = s.exports.find(base);
      if (it != s.exports.end()) {
        it->second.refs++;
        mr->region = it->second.region;
        mr->alloc_base = base;
      }
    }
    if (mr->alloc_base == 0 && base != 0) {
      auto region = s.engine->RegisterExisting(base, alloc);
      if (region.ok()) {
        bool raced = false;
        {
          std::lock_guard<std::mutex> l(s.mu);
          auto& e = s.exports[base];
          raced = e.refs > 0;  // another proxy thread exported the same allocation meanwhile
          if (!raced) e.region = *region;
          e.refs++;
          mr->region = e.region;
          mr->alloc_base = base;
        }
        if (raced) (void)s.engine->Unregister(*region);
      } else {
        why = region.status();
      }
    }
    if (mr->alloc_base != 0) mr->region_offset = reinterpret_cast<cu::DevicePtr>(data) - base;
  }
  if (mr->alloc_base == 0) {
    // Not exportable as is: a bounce buffer of the same size that is.
    absl::StatusOr<LocalRegion> region;
    if (type == nccl_abi::kPtrHost || gpu_in_host) {
      auto buf = s.client->AllocateHost(size);
      if (!buf.ok()) return FailStatus(kSystemError, "regMr: host bounce buffer", buf.status());
      mr->host_bounce = *std::move(buf);
      if (type == nccl_abi::kPtrCuda && !EnvIs("PODLINK_NCCL_PIN_BOUNCE", "0")) {
        // GPU data staged here: page-locked, its copies are DMA at the
        // PCIe link's speed instead of CUDA's pageable path (a copy per step,
        // each side). Best effort: pageable still works.
        mr->pinned = s.cuda->MemHostRegister(mr->host_bounce->data(), mr->host_bounce->size(),
                                             cu::kHostRegisterPortable) == cu::kSuccess;
        if (!mr->pinned) INFO("regMr: could not page-lock a %zu-byte bounce buffer; its copies are pageable", size);
      }
      ExportOptions opts;
      opts.mesh_affinity = AffinityOf(dev);  // to other nodes: the links of this device's rail, or near its GPU
      region = s.engine->Register(*mr->host_bounce, opts);
    } else {
      INFO("regMr: GPU buffer %p is not an exportable cuMem allocation (%s); using a bounce buffer", data,
           why.ToString().c_str());
      // On the GPU that holds NCCL's buffer (its CUDA ordinal; NCCL's net
      // device index need not be it).
      int gpu = GpuOf(dev);
      if (s.cuda->PointerGetAttribute != nullptr &&
          s.cuda->PointerGetAttribute(&gpu, cu::kPointerAttributeDeviceOrdinal,
                                      reinterpret_cast<cu::DevicePtr>(data)) != cu::kSuccess) {
        gpu = GpuOf(dev);
      }
      // AllocateGpu makes the GPU's primary context current: NCCL's proxy
      // thread gets its own back.
      cu::Context caller = nullptr;
      if (s.cuda->CtxGetCurrent(&caller) != cu::kSuccess) caller = nullptr;
      cu::ScopedContext keep(*s.cuda, caller);
      auto buf = s.client->AllocateGpu(size, gpu);
      if (!buf.ok()) return FailStatus(kUnhandledCudaError, "regMr: GPU bounce buffer", buf.status());
      mr->gpu_bounce = *std::move(buf);
      region = s.engine->Register(*mr->gpu_bounce);
    }
    if (!region.ok()) {
      if (mr->pinned) (void)s.cuda->MemHostUnregister(mr->host_bounce->data());
      mr->pinned = false;
      mr->host_bounce.reset();  // nothing registered: the destructor must not unregister
      mr->gpu_bounce.reset();
      return FailStatus(kSystemError, "regMr: exporting the bounce buffer", region.status());
    }
    mr->region = *region;
  }
  *out = mr.release();
  return kSuccess;
}

// ---------------------------------------------------------------- set-up and teardown

PodlinkComm::PodlinkComm(bool send, int dev, std::string peer, UniqueFd ctrl)
    : Comm(send, dev, std::move(peer), std::move(ctrl)) {}

PodlinkComm::~PodlinkComm() {
  State& s = S();
  if (s.engine) {
    reqs_.ForEachInUse([&](PodlinkRequest& r) {
      if (r.batch != 0) (void)s.engine->Wait(r.batch);  // the relay may still read our memory
    });
    CloseRemotes();
  }
  if (region_export_ != 0 && s.client) (void)s.client->Release(region_export_);
}

Result PodlinkComm::SetupReceiver(Welcome& w) {
  State& s = S();
  auto buf = s.client->AllocateHost(sizeof(CtrlRegion));
  if (!buf.ok()) return FailStatus(kSystemError, "allocating the control region", buf.status());
  auto id = s.client->Export(**buf);
  if (!id.ok()) return FailStatus(kSystemError, "exporting the control region", id.status());
  region_buf_ = *std::move(buf);
  region_export_ = *id;
  region_ = static_cast<CtrlRegion*>(region_buf_->data());  // zero-filled memfd
  region_->magic = kRegionMagic;
  region_->version = kWireVersion;
  w.ctrl_export = *id;
  conn_key_ = *id;
  w.ctrl_size = sizeof(CtrlRegion);
  return kSuccess;
}

Result PodlinkComm::SetupSender(const Welcome& w) {
  State& s = S();
  auto imp = s.client->Import(w.ctrl_export);
  if (!imp.ok()) return FailStatus(kSystemError, "importing the receiver's control region", imp.status());
  if (imp->info().handle_type != HandleType::kHostMemfd || imp->info().size < sizeof(CtrlRegion)) {
    return Fail(kRemoteError, "the receiver's control region is not a host region of the expected size");
  }
  auto map = s.client->Map(*imp);
  if (!map.ok()) return FailStatus(kSystemError, "mapping the receiver's control region", map.status());
  region_map_ = *std::move(map);
  conn_key_ = w.ctrl_export;
  region_ = static_cast<CtrlRegion*>(region_map_->host_ptr());
  if (region_->magic != kRegionMagic || region_->version != kWireVersion) {
    return Fail(kRemoteError, "the receiver's control region has an unknown format");
  }
  // The import record can go; the mapping keeps the memory.
  (void)s.client->Release(w.ctrl_export);
  return kSuccess;
}

bool PodlinkComm::PeerGone() {
  // Cheap enough every 4096 calls; a dead peer otherwise leaves NCCL waiting forever.
  return (++calls_ & 4095) == 0 && PeerClosed(ctrl.get());
}

void PodlinkComm::PublishDone(uint64_t seq, int index, uint64_t size) {
  DoneSlot& d = region_->done[seq % kSlots];
  int slot = static_cast<int>(seq % kSlots);
  if (done_seq_[slot] != seq || done_mask_[slot] == 0) {
    done_seq_[slot] = seq;
    done_mask_[slot] = 0;
  }
  d.sizes[index] = size;
  done_mask_[slot] |= 1u << index;
  d.state.store(DoneState(seq, done_mask_[slot]), std::memory_order_release);
}

absl::StatusOr<RemoteRegion> PodlinkComm::OpenRemote(uint64_t export_id) {
  State& s = S();
  RegionDescriptor d;
  d.node_id = s.node_id;
  d.export_id = export_id;
  PODLINK_ASSIGN_OR_RETURN(RemoteRegion r, s.engine->Open(d));
  if (opened_.insert(export_id).second) {
    std::lock_guard<std::mutex> l(s.mu);
    s.remote_refs[export_id]++;
  }
  return r;
}

// Closes the remote exports this comm opened; the plugin's last user of one closes it.
void PodlinkComm::CloseRemotes() {
  State& s = S();
  for (uint64_t id : opened_) {
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
  opened_.clear();
}

// ---------------------------------------------------------------- operations

Result PodlinkComm::Isend(void* data, size_t size, int tag, Mr* base_mr, void** request) {
  auto* mr = static_cast<PodlinkMr*>(base_mr);
  const size_t asked = size;
  const bool tracing = trace::On();
  if (tracing && first_try_ == 0) first_try_ = trace::Now();
  if (!have_cts_) {
    CtsSlot& slot = region_->cts[next_seq_ % kSlots];
    if (slot.ready.load(std::memory_order_acquire) != next_seq_ + 1) {
      if (PeerGone()) return FailComm(kRemoteError, "the receiver went away");
      return kSuccess;  // *request stays NULL: not now
    }
    // Copy once: the peer could change the entry under us.
    cts_copy_.n = slot.n;
    std::memcpy(cts_copy_.tags, slot.tags, sizeof(slot.tags));
    std::memcpy(cts_copy_.sizes, slot.sizes, sizeof(slot.sizes));
    std::memcpy(cts_copy_.region, slot.region, sizeof(slot.region));
    std::memcpy(cts_copy_.offset, slot.offset, sizeof(slot.offset));
    if (cts_copy_.n < 1 || cts_copy_.n > kMaxRecvs) return FailComm(kRemoteError, "malformed clear-to-send entry");
    have_cts_ = true;
    cts_consumed_ = 0;
  }
  const CtsSlot& cts = cts_copy_;
  int index = -1;
  if (Result m = MatchTag(cts.tags, cts.n, cts_consumed_, tag, peer, &index); m != kSuccess) return m;
  PodlinkRequest* r = reqs_.Take(this);
  if (r == nullptr) return kSuccess;  // all 32 in use: not now
  uint64_t seq = next_seq_;
  cts_consumed_ |= 1u << index;
  if (cts_consumed_ == (1u << cts.n) - 1) {
    have_cts_ = false;
    next_seq_++;
  }
  r->send = true;
  r->seq = seq;
  r->index = index;
  r->size = size;
  if (tracing) {
    r->t_try = first_try_;
    r->t_post = trace::Now();
    first_try_ = 0;
  }
  if (size > cts.sizes[index]) size = r->size = Truncate(size, cts.sizes[index]);
  if (size > 0) {
    uint64_t off = static_cast<char*>(data) - mr->base;
    if (mr->bounce()) {
      absl::Status st = copies_.CopyFor(mr->type, reinterpret_cast<void*>(mr->bounce_ptr() + off), data, size);
      if (!st.ok()) {
        Drop(*r);
        return FailStatus(kUnhandledCudaError, "staging a send", st);
      }
    }
    auto remote = OpenRemote(cts.region[index]);
    if (!remote.ok()) {
      Drop(*r);
      return FailStatus(kSystemError, "opening the receiver's buffer", remote.status());
    }
    TransferOp op{&mr->region, mr->region_offset + off, &*remote, cts.offset[index], size};
    auto batch = S().engine->WriteAsync({op});
    if (!batch.ok()) {
      Drop(*r);
      return FailStatus(kSystemError, "submitting a relay copy", batch.status());
    }
    r->batch = *batch;
  }
  if (tracing) r->t_submit = trace::Now();
  TRACE_OP("trace isend comm=%p peer=%s seq=%lu index=%d tag=%d size=%zu room=%lu type=%d",
           static_cast<void*>(this), peer.c_str(), static_cast<unsigned long>(seq), index, tag, asked,
           static_cast<unsigned long>(cts.sizes[index]), mr->type);
  *request = r;
  return kSuccess;
}

Result PodlinkComm::Irecv(int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request) {
  PodlinkRequest* r = reqs_.Take(this, static_cast<int>(next_seq_ % kMaxRequests));
  if (r == nullptr) return kSuccess;
  CtsSlot& slot = region_->cts[next_seq_ % kSlots];
  slot.n = static_cast<uint32_t>(n);
  for (int i = 0; i < n; ++i) {
    auto* mr = static_cast<PodlinkMr*>(mrs[i]);
    uint64_t off = static_cast<char*>(data[i]) - mr->base;
    slot.tags[i] = tags[i];
    slot.sizes[i] = sizes[i];
    slot.region[i] = mr->region.export_id;
    slot.offset[i] = mr->region_offset + off;
  }
  r->seq = next_seq_;
  r->Post(n, data, sizes, mrs);
  if (trace::On()) r->t_post = trace::Now();
  TRACE_OP("trace irecv comm=%p peer=%s seq=%lu n=%d tag0=%d size0=%zu type0=%d", static_cast<void*>(this),
           peer.c_str(), static_cast<unsigned long>(next_seq_), n, tags[0], sizes[0], mrs[0]->type);
  slot.ready.store(next_seq_ + 1, std::memory_order_release);
  next_seq_++;
  *request = r;
  return kSuccess;
}

Result PodlinkComm::Test(Request& base, int* done, int* sizes) {
  auto& r = static_cast<PodlinkRequest&>(base);
  return r.send ? SendDone(r, done, sizes) : ReceiveDone(r, done, sizes);
}

Result PodlinkComm::SendDone(PodlinkRequest& r, int* done, int* sizes) {
  if (r.batch != 0) {
    auto polled = S().engine->Poll(r.batch);
    if (polled.ok() && !*polled) return kSuccess;
    absl::Status st = polled.ok() ? S().engine->Wait(r.batch) : polled.status();
    r.batch = 0;
    if (!st.ok()) {
      PublishDone(r.seq, r.index, kSizeError);
      Drop(r);
      return FailStatus(kSystemError, "relay copy", st);
    }
  }
  PublishDone(r.seq, r.index, r.size);
  if (sizes != nullptr) sizes[0] = static_cast<int>(r.size);
  if (r.t_post != 0) {
    trace::Record({'s', conn_key_, r.seq, r.index, r.size, r.t_try, r.t_post, r.t_submit, trace::Now()});
    r.t_post = 0;
  }
  *done = 1;
  Drop(r);
  return kSuccess;
}

Result PodlinkComm::ReceiveDone(PodlinkRequest& r, int* done, int* sizes) {
  DoneSlot& d = region_->done[r.seq % kSlots];
  uint32_t full = (1u << r.n) - 1;
  if (d.state.load(std::memory_order_acquire) != DoneState(r.seq, full)) {
    if (PeerGone()) return FailComm(kRemoteError, "the sender went away");
    return kSuccess;
  }
  uint64_t got[kMaxRecvs];
  for (int i = 0; i < r.n; ++i) got[i] = d.sizes[i];  // one read of the shared slot
  Result result = FinishReceive(copies_, peer, r, got, sizes);
  if (r.t_post != 0) {
    uint64_t now = trace::Now();
    for (int i = 0; i < r.n; ++i) trace::Record({'r', conn_key_, r.seq, i, r.posted[i], 0, r.t_post, 0, now});
    r.t_post = 0;
  }
  *done = 1;
  Drop(r);
  return result;
}

Result FinishReceive(CopyStream& copies, const std::string& peer, const Request& r, const uint64_t* got, int* sizes) {
  Result result = kSuccess;
  for (int i = 0; i < r.n; ++i) {
    if (got[i] == kSizeError) {
      result = Fail(kInvalidUsage, absl::StrCat("receive from ", peer, ": the matching send failed (see the "
                                                "sender's log; a send larger than the receive is an error)"));
      continue;
    }
    if (got[i] > r.posted[i]) {
      result = Fail(kRemoteError, absl::StrCat("receive from ", peer, ": peer reports ", got[i], " bytes for a ",
                                               r.posted[i], "-byte buffer"));
      continue;
    }
    auto* mr = static_cast<PodlinkMr*>(r.mr[i]);
    if (mr->bounce() && got[i] > 0) {
      uint64_t off = static_cast<char*>(r.data[i]) - mr->base;
      absl::Status st = copies.CopyFor(mr->type, r.data[i], reinterpret_cast<void*>(mr->bounce_ptr() + off), got[i]);
      if (!st.ok()) result = FailStatus(kUnhandledCudaError, "copying a receive out of its bounce buffer", st);
    }
    if (sizes != nullptr) sizes[i] = static_cast<int>(got[i]);
  }
  return result;
}

}  // namespace podlink::ncclnet
