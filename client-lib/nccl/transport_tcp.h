// The TCP transport (peers on other nodes, or any peer without podlinkd):
// clear-to-send and data frames on a control socket, payloads split over
// several data sockets (small sends from host memory inline, after their
// frame on the control socket: PODLINK_NCCL_TCP_INLINE bytes, default
// 32 KiB, 0 for none), GPU memory staged through page-locked buffers with
// asynchronous copies, so the proxy thread never waits for the GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "client-lib/nccl/comm.h"
#include "client-lib/nccl/gpu_staging.h"

namespace podlink::ncclnet {

struct TcpRequest : Request {
  int frames_left = 0;  // receive: data frames still due
  int pieces_left = 0;  // payload pieces still on the sockets
  // GPU memory: page-locked copies of the GPU buffers, and the event that
  // marks the copy to them (send) or from them (receive) done.
  HostStage staging[kMaxRecvs];
  cu::Event copied = nullptr;
  bool copying = false;  // receive: copies to the GPU started
  char* src = nullptr;   // send: the bytes for the wire (the buffer itself, or staging[0])
  bool queued = false;   // send: its pieces are in the data sockets' queues
  // Send with its payload inline on the control socket: done once the
  // control stream has been written up to here.
  uint64_t inline_end = 0;
};

class TcpComm final : public Comm {
 public:
  TcpComm(bool send, int dev, std::string peer, UniqueFd ctrl, std::vector<UniqueFd> data);
  ~TcpComm() override;

  TransportId id() const override { return TransportId::kTcp; }
  std::string Describe() const override;
  Result SetupReceiver(Welcome&) override { return nccl_abi::kSuccess; }
  Result SetupSender(const Welcome&) override { return nccl_abi::kSuccess; }
  Result RegMr(void* data, size_t size, int type, Mr** mr) override;
  Result Isend(void* data, size_t size, int tag, Mr* mr, void** request) override;
  Result Irecv(int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request) override;
  Result Test(Request& r, int* done, int* sizes) override;

 private:
  struct Piece {
    TcpRequest* req;
    char* p;
    size_t left;
  };
  // Moves whatever the sockets take now: frames out and in, payload pieces.
  Result Progress();
  void QueueFrame(const Frame& f) { out_.append(reinterpret_cast<const char*>(&f), sizeof(f)); }
  // Splits `size` bytes over the data sockets; both sides call it in the
  // same message order, so they agree.
  template <typename F>
  void ForEachPiece(size_t size, F&& f);
  void Drop(TcpRequest& r);
  Result ReceiveDone(TcpRequest& r, int* done, int* sizes);

  std::vector<UniqueFd> data_;
  std::vector<std::deque<Piece>> pieces_;  // per data socket
  uint32_t rr_ = 0;                        // next data socket (advances identically on both sides)
  RequestSlots<TcpRequest> reqs_;
  uint64_t next_seq_ = 0;
  std::string out_;        // control bytes not yet sent
  uint64_t out_sent_ = 0;  // control bytes sent so far
  // Receiver: an inline payload still being read off the control socket.
  TcpRequest* inline_req_ = nullptr;
  char* inline_dst_ = nullptr;
  size_t inline_left_ = 0;
  Frame in_{};
  size_t in_got_ = 0;
  std::deque<Frame> cts_queue_;  // sender: clear-to-send frames not yet consumed
  uint32_t cts_consumed_ = 0;    // sender: buffers of cts_queue_.front() already sent to
  std::string peer_closed_;      // receiver: why the peer's control stream ended; empty while open
  std::deque<TcpRequest*> unqueued_;  // sender: sends in frame order whose pieces wait for their staging copy
  StagingPool staging_{copies_};
};

}  // namespace podlink::ncclnet
