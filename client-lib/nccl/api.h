// The version-agnostic API of libnccl-net-podlink.so. nccl_net_exports.cc
// adapts it to NCCL's ncclNet_v8..v11 tables; the conformance tests drive
// the same tables through dlopen.
//
// Connections. listen() opens a TCP socket and writes a handle with its
// address and the node identity of the podlinkd this process talks to (the
// boot id). connect() compares that identity with its own:
//   same node  -> podlink transport: the receiver shares a small control
//                 region (a memfd exported through podlinkd) in which it
//                 publishes clear-to-send entries (region, offset, size, tag)
//                 and the sender publishes completions; the bytes move
//                 between exported buffers by the relay (podlinkd's copy
//                 engines) or, for host memory, through the shared mapping.
//   other node -> TCP: the same clear-to-send rendezvous on a control socket,
//                 the payload split over several data sockets.
// No thread of its own: every call progresses the comm it is given, so
// NCCL's proxy thread drives everything and finalize has nothing to join.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "client-lib/nccl/nccl_net_abi.h"

namespace podlink::ncclnet {

using nccl_abi::Result;
// The ncclResult_t values every part of the plugin returns.
using nccl_abi::kInternalError;
using nccl_abi::kInvalidArgument;
using nccl_abi::kInvalidUsage;
using nccl_abi::kRemoteError;
using nccl_abi::kSuccess;
using nccl_abi::kSystemError;
using nccl_abi::kUnhandledCudaError;

struct DeviceProps {
  const char* name = nullptr;
  const char* pci_path = nullptr;
  uint64_t guid = 0;
  int ptr_support = 0;
  int speed_mbps = 0;
  int port = 0;
  float latency_us = 0;
  int max_comms = 0;
  int max_recvs = 0;
  size_t max_p2p_bytes = 0;
  size_t max_coll_bytes = 0;
};

inline constexpr int kMaxRecvs = 8;

// Entry points; each returns an ncclResult_t value and logs why it failed.
Result Init(nccl_abi::Logger logger);
Result Finalize();
Result Devices(int* ndev);
Result GetProperties(int dev, DeviceProps* props);
Result Listen(int dev, void* handle, void** listen_comm);
Result Connect(int dev, void* handle, void** send_comm);
Result Accept(void* listen_comm, void** recv_comm);
Result RegMr(void* comm, void* data, size_t size, int type, void** mhandle);
Result DeregMr(void* comm, void* mhandle);
Result Isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request);
Result Irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
             void** request);
Result Iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request);
// sizes gets one value per buffer of the request (n for grouped receives).
Result Test(void* request, int* done, int* sizes);
Result CloseSend(void* send_comm);
Result CloseRecv(void* recv_comm);
Result CloseListen(void* listen_comm);

// The tuner (ncclTuner_v4). With podlinkd, for communicators spanning more
// than one "node" (pod), it caps the channels of collectives below 64 MiB at
// bytes / 4 MiB (at least 4). The relay wants many channels for large
// collectives (at least 16, see Init) but few for small ones, where every
// extra channel only shrinks the messages each relay operation carries. From
// 64 MiB, without podlinkd, or with PODLINK_NCCL_TUNER=0, NCCL decides.
int TunerChannels(size_t n_ranks, size_t n_nodes, int coll_type, size_t bytes);
Result TunerInit(size_t n_ranks, size_t n_nodes, nccl_abi::Logger logger, void** context);
Result TunerGetCollInfo(void* context, int coll_type, size_t bytes, int num_pipe_ops, float** cost_table,
                        int num_algo, int num_proto, int reg_buff, int* n_channels);
Result TunerDestroy(void* context);

}  // namespace podlink::ncclnet
