// The entry points of the NCCL net plugin (api.h).
#include "client-lib/nccl/api.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/comm.h"
#include "client-lib/nccl/handshake.h"
#include "client-lib/nccl/plugin.h"
#include "client-lib/nccl/step_trace.h"

namespace podlink::ncclnet {

Result Init(nccl_abi::Logger logger) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (logger != nullptr) s.logger = logger;
  if (s.refs++ > 0) return kSuccess;
  if (s.client != nullptr || s.tcp_fallback_kept) return kSuccess;  // kept by a finalize that found comms open
  s.nsocks = std::clamp(EnvInt("PODLINK_NCCL_NSOCKS", 4), 1, 16);
  s.trace_left = std::max(0, EnvInt("PODLINK_NCCL_TRACE", 0));
  trace::Configure();
  s.tcp_only = EnvIs("PODLINK_NCCL_TRANSPORT", "tcp");
  auto addr = ChooseListenAddress(&s.ifname);
  if (!addr.ok()) {
    s.refs--;
    return FailStatus(kSystemError, "no interface to listen on", addr.status());
  }
  s.listen_addr = *addr;
  s.ifname_speed_mbps = InterfaceSpeedMbps(s.ifname);

  if (!s.tcp_only) ConnectPodlinkd(s);
  JoinNative(s);
  // Once (names handed to NCCL stay valid), from what the daemon says of its
  // mesh NICs.
  if (s.devs.empty()) EnumerateDevices(s);
  if (!s.node_id.empty() && !s.native) SetRelayDefaults(s);
  s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
        "NET/podlink %s: %zu device(s), listening on %s (%s, %d Mb/s), %d data sockets per TCP connection, node %s",
        "v1", s.devs.size(), s.listen_addr.ToString().c_str(), s.ifname.c_str(), s.ifname_speed_mbps, s.nsocks,
        s.node_id.empty() ? "(no podlinkd)" : s.node_id.c_str());
  return kSuccess;
}

Result Finalize() {
  State& s = S();
  std::unique_ptr<TransferEngine> engine;
  std::unique_ptr<Client> client;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.refs <= 0) return kSuccess;
    if (--s.refs > 0) return kSuccess;
    if (s.live_comms > 0 || !s.exports.empty()) {
      WARN("finalize with %d comm(s) and %zu registration(s) still open: keeping the podlinkd session", s.live_comms,
           s.exports.size());
      s.refs = 0;
      s.tcp_fallback_kept = s.client == nullptr;
      return kSuccess;
    }
    engine = std::move(s.engine);
    client = std::move(s.client);
    s.connecting.clear();
    s.remote_refs.clear();
    std::string().swap(s.node_id);
    std::vector<NodeInfo::MeshNic>().swap(s.mesh_nics);
    std::vector<State::Dev>().swap(s.devs);  // NCCL asks for names again after the next init
  }
  trace::Flush();
  engine.reset();  // waits for relay copies it still has in flight
  client.reset();  // closes the session; gRPC stops its threads with the last channel
  std::map<int, cu::Context> contexts;
  {
    std::lock_guard<std::mutex> l(s.mu);
    contexts.swap(s.copy_ctx);
  }
  for (auto& [dev, ctx] : contexts) s.cuda->CtxDestroy(ctx);  // every comm, and its stream, is gone
  return kSuccess;
}

Result Devices(int* ndev) {
  if (ndev == nullptr) return kInvalidArgument;
  std::lock_guard<std::mutex> l(S().mu);
  *ndev = static_cast<int>(S().devs.size());
  return kSuccess;
}

Result GetProperties(int dev, DeviceProps* p) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (p == nullptr || dev < 0 || dev >= static_cast<int>(s.devs.size())) {
    return Fail(kInvalidArgument, absl::StrCat("getProperties: no device ", dev));
  }
  if (s.native && dev == 0) {
    // NCCL (2.27-2.29) binds its proxy's IPC socket at the end of bootstrap
    // and builds its topology (this call) before the bootstrap exchange that
    // lets any peer go on to use that socket: mirrored into the group's pods
    // now, no peer ever finds it missing.
    absl::Status st = s.client->SyncNcclIpc();
    if (!st.ok()) WARN("NCCL native mode: syncing NCCL's IPC sockets failed: %s", st.ToString().c_str());
  }
  const State::Dev& d = s.devs[dev];
  *p = DeviceProps();
  p->name = d.name.c_str();
  p->pci_path = d.pci_path.empty() ? nullptr : d.pci_path.c_str();
  uint64_t h = 1469598103934665603ull;
  for (char ch : s.node_id + d.name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  p->guid = h;
  // GPU buffers only where podlinkd carries them (relay, mesh). Over the
  // plugin's TCP alone (no podlinkd, or PODLINK_NCCL_TRANSPORT=tcp) GPU
  // memory would be staged by copies in the plugin's own CUDA context, which
  // waits for a GPU time slice behind NCCL's running kernel (2.4 ms per
  // small message on 2xH200, 2026-11-27): host buffers, as NCCL's own
  // NET/Socket uses, need no copy of the plugin's.
  const bool gpu_buffers = s.cuda != nullptr && !s.tcp_only && !s.node_id.empty();
  p->ptr_support = nccl_abi::kPtrHost | (gpu_buffers ? nccl_abi::kPtrCuda : 0);
  // What NVLink carries through the relay when a podlinkd is there. NCCL
  // still sizes channels by the NIC's PCIe path; Init's defaults and the
  // tuner take care of the channel count (docs/nccl.md).
  // A rail group: its NICs' speed (what other nodes are reached at).
  // TCP alone: the listening interface's speed, as NET/Socket reports it.
  // NCCL's cost model picks protocols by it: at 100 Gb/s on a veth it chose
  // LL up to 512 KiB, which moves twice the bytes of Simple over the sockets
  // (all_reduce at 0.50-0.58 of NET/Socket at 256-512 KiB, 2026-11-28).
  const int dflt = s.node_id.empty() ? s.ifname_speed_mbps : d.speed_mbps != 0 ? static_cast<int>(d.speed_mbps) : 3200000;
  p->speed_mbps = EnvInt("PODLINK_NCCL_SPEED_MBPS", dflt);
  p->port = 1;
  p->latency_us = static_cast<float>(EnvInt("PODLINK_NCCL_LATENCY_US", 5));
  p->max_comms = 1 << 20;
  p->max_recvs = kMaxRecvs;
  p->max_p2p_bytes = INT_MAX;
  p->max_coll_bytes = INT_MAX;
  return kSuccess;
}

// ---------------------------------------------------------------- connections

namespace {
bool KnownDevice(int dev) {
  std::lock_guard<std::mutex> l(S().mu);
  return dev >= 0 && static_cast<size_t>(dev) < S().devs.size();
}
}  // namespace

Result Listen(int dev, void* handle, void** listen_comm) {
  if (handle == nullptr || listen_comm == nullptr) return kInvalidArgument;
  if (!KnownDevice(dev)) return Fail(kInvalidArgument, absl::StrCat("listen: no device ", dev));
  return StartListen(dev, handle, listen_comm);
}

Result Connect(int dev, void* handle, void** send_comm) {
  if (handle == nullptr || send_comm == nullptr) return kInvalidArgument;
  *send_comm = nullptr;
  if (!KnownDevice(dev)) return Fail(kInvalidArgument, absl::StrCat("connect: no device ", dev));
  auto* h = static_cast<WireHandle*>(handle);
  if (h->magic != kHandleMagic || h->version != kWireVersion || h->family != AF_INET || h->port == 0) {
    return Fail(kInvalidArgument, "connect: the handle is not a podlink listen handle (corrupted, or from another "
                                  "plugin or version)");
  }
  return ConnectStep(dev, h, send_comm);
}

Result Accept(void* listen_comm, void** recv_comm) {
  auto* lc = static_cast<Listener*>(listen_comm);
  if (lc == nullptr || lc->magic != kListenMagic || recv_comm == nullptr) {
    return Fail(kInvalidArgument, "accept: not a podlink listen comm");
  }
  *recv_comm = nullptr;
  return AcceptStep(lc, recv_comm);
}

Result CloseListen(void* listen_comm) {
  auto* lc = static_cast<Listener*>(listen_comm);
  if (lc == nullptr || lc->magic != kListenMagic) return Fail(kInvalidArgument, "closeListen: not a listen comm");
  CloseListener(lc);
  return kSuccess;
}

Result CloseSend(void* send_comm) {
  Comm* c = AsComm(send_comm, true);
  if (c == nullptr) return Fail(kInvalidArgument, "closeSend: not a podlink send comm");
  delete c;
  return kSuccess;
}

Result CloseRecv(void* recv_comm) {
  Comm* c = AsComm(recv_comm, false);
  if (c == nullptr) return Fail(kInvalidArgument, "closeRecv: not a podlink receive comm");
  delete c;
  return kSuccess;
}

// ---------------------------------------------------------------- memory

Result RegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr || c->magic != kCommMagic || mhandle == nullptr) return Fail(kInvalidArgument, "regMr: bad comm");
  if (type != nccl_abi::kPtrHost && type != nccl_abi::kPtrCuda) {
    return Fail(kInvalidArgument, absl::StrCat("regMr: unsupported memory type ", type));
  }
  if (data == nullptr && size > 0) return Fail(kInvalidArgument, "regMr: NULL buffer");
  Mr* mr = nullptr;
  Result r = c->RegMr(data, size, type, &mr);
  if (r == kSuccess) *mhandle = mr;
  return r;
}

Result DeregMr(void* /*comm*/, void* mhandle) {
  // Only the registration is used: NCCL may deregister after closing the comm.
  auto* mr = static_cast<Mr*>(mhandle);
  if (mr == nullptr || mr->magic != kMrMagic) return Fail(kInvalidArgument, "deregMr: not a podlink registration");
  mr->magic = 0;
  delete mr;
  return kSuccess;
}

// ---------------------------------------------------------------- operations

Result Isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request) {
  if (request == nullptr) return kInvalidArgument;
  *request = nullptr;
  Comm* c = AsComm(send_comm, true);
  auto* mr = static_cast<Mr*>(mhandle);
  if (c == nullptr) return Fail(kInvalidArgument, "isend: not a podlink send comm");
  if (c->failed != kSuccess) return c->failed;
  if (mr == nullptr || mr->magic != kMrMagic || mr->comm != c) {
    return Fail(kInvalidArgument, "isend: memory handle not registered on this comm");
  }
  if (!mr->Covers(data, size)) return Fail(kInvalidArgument, "isend: buffer outside its registration");
  return c->Isend(data, size, tag, mr, request);
}

Result Irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
             void** request) {
  if (request == nullptr) return kInvalidArgument;
  *request = nullptr;  // also overwrites NCCL's optional-completion hint
  Comm* c = AsComm(recv_comm, false);
  if (c == nullptr) return Fail(kInvalidArgument, "irecv: not a podlink receive comm");
  if (c->failed != kSuccess) return c->failed;
  if (n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || tags == nullptr || mhandles == nullptr) {
    return Fail(kInvalidArgument, absl::StrCat("irecv: bad arguments (n=", n, ", at most ", kMaxRecvs, ")"));
  }
  Mr* mrs[kMaxRecvs];
  for (int i = 0; i < n; ++i) {
    mrs[i] = static_cast<Mr*>(mhandles[i]);
    if (mrs[i] == nullptr || mrs[i]->magic != kMrMagic || mrs[i]->comm != c) {
      return Fail(kInvalidArgument, "irecv: memory handle not registered on this comm");
    }
    if (!mrs[i]->Covers(data[i], sizes[i])) return Fail(kInvalidArgument, "irecv: buffer outside its registration");
  }
  return c->Irecv(n, data, sizes, tags, mrs, request);
}

Result Iflush(void* recv_comm, int /*n*/, void** /*data*/, int* /*sizes*/, void** /*mhandles*/, void** request) {
  // test() reports a receive done only once the bytes are in place (relay
  // completion, or our own copy waited for), so there is nothing to flush.
  if (request != nullptr) *request = nullptr;
  return AsComm(recv_comm, false) != nullptr ? kSuccess : Fail(kInvalidArgument, "iflush: not a receive comm");
}

Result Test(void* request, int* done, int* sizes) {
  auto* r = static_cast<Request*>(request);
  if (r == nullptr || done == nullptr || !r->in_use || r->comm == nullptr || r->comm->magic != kCommMagic) {
    return Fail(kInvalidArgument, "test: not a podlink request in flight");
  }
  *done = 0;
  return r->comm->Test(*r, done, sizes);
}

}  // namespace podlink::ncclnet
