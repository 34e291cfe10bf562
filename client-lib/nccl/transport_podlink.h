// The podlink transport (peers on this node, through podlinkd): the
// receiver exports a control region (wire.h's CtrlRegion) in which it posts
// clear-to-send entries naming exported buffers; the sender has the relay
// (or the direct path) copy into them through TransferEngine and posts
// completions in the same region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "client-lib/nccl/comm.h"
#include "podlink/client.h"
#include "podlink/transfer.h"

namespace podlink::ncclnet {

// Registered memory of the podlink transport: it names an exported region
// that holds the bytes, NCCL's own cuMem buffer (one export per allocation,
// shared by the plugin's comms) or a bounce buffer when the memory cannot be
// exported (plain host memory, non-VMM GPU memory).
struct PodlinkMr final : Mr {
  ~PodlinkMr() override;
  LocalRegion region;          // the export the relay reads / writes
  uint64_t region_offset = 0;  // where `base` lies in it
  uint64_t alloc_base = 0;     // key of the shared cuMem export (0: bounce)
  std::unique_ptr<HostBuffer> host_bounce;
  std::unique_ptr<GpuBuffer> gpu_bounce;
  bool pinned = false;  // host_bounce is page-locked for CUDA (cuMemHostRegister)
  bool bounce() const { return host_bounce || gpu_bounce; }
  uint64_t bounce_ptr() const {
    return host_bounce ? reinterpret_cast<uint64_t>(host_bounce->data()) : gpu_bounce->device_ptr();
  }
};

// RegMr of the transports whose bytes podlinkd moves: NCCL's cuMem buffer
// exported as it is, else a bounce buffer of the same size that can be
// exported (`gpu_in_host`: GPU memory always gets a host bounce buffer, for
// paths that carry host memory only, as the mesh does today).
Result RegisterExported(Comm* comm, int dev, void* data, size_t size, int type, bool gpu_in_host, Mr** out);

// The end of a receive whose buffers got `got[i]` bytes (kSizeError: that
// send failed), for the transports built on PodlinkMr: checks each size
// against the posted buffer, copies bounce buffers out (the comm's copy
// stream) and fills `sizes`. The request's result; it is complete either way.
Result FinishReceive(CopyStream& copies, const std::string& peer, const Request& r, const uint64_t* got, int* sizes);

struct PodlinkRequest : Request {
  uint64_t batch = 0;  // send: the TransferEngine batch in flight
  uint64_t t_try = 0, t_post = 0, t_submit = 0;  // step trace (step_trace.h), when on
};

class PodlinkComm final : public Comm {
 public:
  PodlinkComm(bool send, int dev, std::string peer, UniqueFd ctrl);
  ~PodlinkComm() override;

  TransportId id() const override { return TransportId::kPodlink; }
  std::string Describe() const override { return "podlink (same node: podlinkd relay over NVLink)"; }
  Result SetupReceiver(Welcome& w) override;
  Result SetupSender(const Welcome& w) override;
  Result RegMr(void* data, size_t size, int type, Mr** mr) override;
  Result Isend(void* data, size_t size, int tag, Mr* mr, void** request) override;
  Result Irecv(int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request) override;
  Result Test(Request& r, int* done, int* sizes) override;

 private:
  bool PeerGone();
  void PublishDone(uint64_t seq, int index, uint64_t size);
  absl::StatusOr<RemoteRegion> OpenRemote(uint64_t export_id);
  void CloseRemotes();
  Result SendDone(PodlinkRequest& r, int* done, int* sizes);
  Result ReceiveDone(PodlinkRequest& r, int* done, int* sizes);
  void Drop(PodlinkRequest& r) { r.in_use = false; }

  RequestSlots<PodlinkRequest> reqs_;
  uint64_t next_seq_ = 0;
  uint64_t conn_key_ = 0;   // the control region's export: names the connection in the step trace
  uint64_t first_try_ = 0;  // step trace: when NCCL first asked to send the next step
  uint64_t calls_ = 0;                     // for PeerGone's sampling
  std::unique_ptr<HostBuffer> region_buf_;  // receiver: the control region
  uint64_t region_export_ = 0;
  std::unique_ptr<Mapping> region_map_;  // sender: the receiver's region mapped
  CtrlRegion* region_ = nullptr;
  bool have_cts_ = false;  // sender: cts_copy_ is the entry being consumed
  CtsSlot cts_copy_;
  uint32_t cts_consumed_ = 0;
  uint64_t done_seq_[kSlots] = {};
  uint32_t done_mask_[kSlots] = {};
  std::set<uint64_t> opened_;  // sender: remote exports in use
};

}  // namespace podlink::ncclnet
