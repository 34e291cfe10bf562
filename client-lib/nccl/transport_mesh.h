// The mesh transport (peers on other nodes whose podlinkd runs the mesh, as
// this node's does): clear-to-send and completion messages on the control
// socket, the bytes written one-sided into the receiver's exported buffers
// by the two podlinkd over their mesh links (TransferEngine regions of
// another node). The pods need no route to each other's daemons and no RDMA
// device. The daemons carry host memory only so far, so GPU buffers go
// through host bounce buffers (copied by the plugin's copy stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "client-lib/nccl/comm.h"
#include "client-lib/nccl/transport_podlink.h"
#include "podlink/transfer.h"

namespace podlink::ncclnet {

struct MeshRequest : Request {
  uint64_t batch = 0;    // send: the TransferEngine batch in flight
  uint32_t done_mask = 0;  // receive: buffers whose completion arrived
  uint64_t t_try = 0, t_post = 0, t_submit = 0;  // step trace (step_trace.h), when on
};

class MeshComm final : public Comm {
 public:
  MeshComm(bool send, int dev, std::string peer, UniqueFd ctrl);
  ~MeshComm() override;

  TransportId id() const override { return TransportId::kMesh; }
  std::string Describe() const override { return "mesh (other node: both podlinkd over their mesh links)"; }
  Result SetupReceiver(Welcome& w) override;
  Result SetupSender(const Welcome& w) override;
  Result RegMr(void* data, size_t size, int type, Mr** mr) override;
  Result Isend(void* data, size_t size, int tag, Mr* mr, void** request) override;
  Result Irecv(int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request) override;
  Result Test(Request& r, int* done, int* sizes) override;

 private:
  // Moves control bytes both ways as far as the socket allows now.
  Result Progress();
  void Queue(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  Result SendDone(MeshRequest& r, int* done, int* sizes);
  Result ReceiveDone(MeshRequest& r, int* done, int* sizes);
  absl::StatusOr<RemoteRegion> OpenRemote(uint64_t export_id);

  RequestSlots<MeshRequest> reqs_;
  uint64_t next_seq_ = 0;
  std::string out_;  // control bytes not yet sent
  // Incoming: the receiver's node first (sender), then frames.
  MeshNode node_in_{};
  size_t node_got_ = 0;
  RegionDescriptor peer_node_;  // sender: the receiver's node (export id filled per buffer)
  MeshFrame in_{};
  size_t in_got_ = 0;
  std::deque<MeshFrame> cts_;  // sender: clear-to-send frames not yet consumed
  uint32_t cts_consumed_ = 0;  // buffers of cts_.front() already sent to
  std::map<uint64_t, RemoteRegion> opened_;  // sender: the receiver's export -> its opening here
  std::string peer_closed_;    // why the control stream ended; empty while open
  // Step trace: the control socket's two ends name the connection alike
  // (made on first use), and when NCCL first asked to send the next step.
  uint64_t ConnKey();
  uint64_t conn_key_ = 0;
  uint64_t first_try_ = 0;
};

}  // namespace podlink::ncclnet
