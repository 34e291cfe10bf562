// The entry points of the NCCL net plugin (api.h).
#include "client-lib/nccl/api.h"

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

Result Init(nccl_abi::Logger logger) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (logger != nullptr) s.logger = logger;
  if (s.refs++ > 0) return kSuccess;
  if (s.client != nullptr || s.tcp_fallback_kept) return kSuccess;  // kept by a finalize that found comms open
  s.nsocks = std::clamp(EnvInt("PODLINK_NCCL_NSOCKS", 4), 1, 16);
  s.trace_left = std::max(0, EnvInt("PODLINK_NCCL_TRACE", 0));
  s.tcp_only = EnvIs("PODLINK_NCCL_TRANSPORT", "tcp");
  auto addr = ChooseListenAddress(&s.ifname);
  if (!addr.ok()) {
    s.refs--;
    return FailStatus(kSystemError, "no interface to listen on", addr.status());
  }
  s.listen_addr = *addr;

  if (s.devs.empty()) EnumerateDevices(s);  // once: names handed to NCCL stay valid

  if (!s.tcp_only) {
    ConnectOptions opt;
    opt.timeout = absl::Seconds(10);
    auto client = Client::Connect(opt);
    absl::Status st = client.status();
    if (client.ok()) {
      TransferEngine::Options eo;
      eo.log_transport = false;
      eo.allow_direct = EnvIs("PODLINK_NCCL_DIRECT", "1");
      eo.force_relay = EnvIs("PODLINK_NCCL_FORCE_RELAY", "1");
      auto engine = TransferEngine::Create(**client, eo);
      auto node = (*client)->GetNodeInfo();
      st = engine.ok() ? node.status() : engine.status();
      if (st.ok()) {
        s.client = *std::move(client);
        s.engine = *std::move(engine);
        s.node_id = node->node_id;
      }
    }
    if (!st.ok()) {
      s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
            "podlinkd not usable (%s): peers on this node use TCP like other nodes", st.ToString().c_str());
    }
  }
  // Defaults for the relay, set only when podlinkd is reachable and the user
  // chose nothing (aws-ofi-nccl does the same on its platforms); NCCL reads
  // them when it builds the communicator, after this init (docs/nccl.md):
  //  - NCCL_PROTO=Simple: NCCL's LL/LL128 mix is slower over the relay at
  //    every size measured.
  //  - NCCL_MIN_NCHANNELS=16, NCCL_BUFFSIZE=16 MiB: NCCL sizes channels from
  //    the topology, where the plugin's NIC sits behind the GPU's PCIe link,
  //    and opens 4; the relay needs more requests in flight (80 -> 255 GB/s).
  if (!s.node_id.empty()) {
    auto set_default = [&](const char* name, const char* value, const char* keep) {
      if (std::getenv(name) != nullptr || EnvIs(keep, "1")) return;
      ::setenv(name, value, 0);
      s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
            "%s was not set: setting %s=%s for the podlink relay (%s=1 keeps NCCL's)", name, name, value, keep);
    };
    set_default("NCCL_PROTO", "Simple", "PODLINK_NCCL_KEEP_PROTO");
    set_default("NCCL_MIN_NCHANNELS", "16", "PODLINK_NCCL_KEEP_CHANNELS");
    set_default("NCCL_BUFFSIZE", "16777216", "PODLINK_NCCL_KEEP_CHANNELS");
  }
  s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
        "NET/podlink %s: %zu device(s), listening on %s (%s), %d data sockets per TCP connection, node %s",
        "v1", s.devs.size(), s.listen_addr.ToString().c_str(), s.ifname.c_str(), s.nsocks,
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
    std::vector<State::Dev>().swap(s.devs);  // NCCL asks for names again after the next init
  }
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
  const State::Dev& d = s.devs[dev];
  *p = DeviceProps();
  p->name = d.name.c_str();
  p->pci_path = d.pci_path.empty() ? nullptr : d.pci_path.c_str();
  uint64_t h = 1469598103934665603ull;
  for (char ch : s.node_id + d.name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  p->guid = h;
  p->ptr_support = nccl_abi::kPtrHost | (s.cuda != nullptr ? nccl_abi::kPtrCuda : 0);
  // What NVLink carries through the relay when a podlinkd is there. NCCL
  // still sizes channels by the NIC's PCIe path; Init's defaults and the
  // tuner take care of the channel count (docs/nccl.md).
  p->speed_mbps = EnvInt("PODLINK_NCCL_SPEED_MBPS", s.node_id.empty() ? 100000 : 3200000);
  p->port = 1;
  p->latency_us = static_cast<float>(EnvInt("PODLINK_NCCL_LATENCY_US", 5));
  p->max_comms = 1 << 20;
  p->max_recvs = kMaxRecvs;
  p->max_p2p_bytes = INT_MAX;
  p->max_coll_bytes = INT_MAX;
  return kSuccess;
}

Result RegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr || c->magic != kCommMagic || mhandle == nullptr) return Fail(kInvalidArgument, "regMr: bad comm");
  if (type != nccl_abi::kPtrHost && type != nccl_abi::kPtrCuda) {
    return Fail(kInvalidArgument, absl::StrCat("regMr: unsupported memory type ", type));
  }
  if (data == nullptr && size > 0) return Fail(kInvalidArgument, "regMr: NULL buffer");
  State& s = S();
  auto mr = std::make_unique<Mr>();
  mr->comm = c;
  mr->base = static_cast<char*>(data);
  mr->size = size;
  mr->type = type;
  if (c->transport == Transport::kPodlink && size > 0) {
    absl::Status why = absl::OkStatus();
    if (type == nccl_abi::kPtrCuda && s.cuda == nullptr) {
      return Fail(kInvalidArgument, "regMr: GPU memory but no CUDA driver in this process");
    }
    if (type == nccl_abi::kPtrCuda) {
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
      if (type == nccl_abi::kPtrHost) {
        auto buf = s.client->AllocateHost(size);
        if (!buf.ok()) return FailStatus(kSystemError, "regMr: host bounce buffer", buf.status());
        mr->host_bounce = *std::move(buf);
        region = s.engine->Register(*mr->host_bounce);
      } else {
        INFO("regMr: GPU buffer %p is not an exportable cuMem allocation (%s); using a bounce buffer", data,
             why.ToString().c_str());
        auto buf = s.client->AllocateGpu(size, c->dev);
        if (!buf.ok()) return FailStatus(kUnhandledCudaError, "regMr: GPU bounce buffer", buf.status());
        mr->gpu_bounce = *std::move(buf);
        region = s.engine->Register(*mr->gpu_bounce);
      }
      if (!region.ok()) return FailStatus(kSystemError, "regMr: exporting the bounce buffer", region.status());
      mr->region = *region;
    }
  }
  *mhandle = mr.release();
  return kSuccess;
}

Result DeregMr(void* comm, void* mhandle) {
  auto* mr = static_cast<Mr*>(mhandle);
  if (mr == nullptr || mr->magic != kMrMagic) return Fail(kInvalidArgument, "deregMr: not a podlink registration");
  State& s = S();
  std::unique_ptr<Mr> owned(mr);
  owned->magic = 0;
  if (owned->alloc_base != 0) {
    bool last = false;
    LocalRegion region;
    {
      std::lock_guard<std::mutex> l(s.mu);
      auto it = s.exports.find(owned->alloc_base);
      if (it != s.exports.end() && --it->second.refs == 0) {
        last = true;
        region = it->second.region;
        s.exports.erase(it);
      }
    }
    if (last) (void)s.engine->Unregister(region);
  } else if (owned->bounce() && s.engine) {
    (void)s.engine->Unregister(owned->region);
  }
  return kSuccess;
}

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
  char* p = static_cast<char*>(data);
  if (!Covers(*mr, p, size)) {
    return Fail(kInvalidArgument, "isend: buffer outside its registration");
  }
  if (c->transport == Transport::kPodlink) return PodlinkIsend(*c, data, size, tag, mr, request);

  Result pr = TcpProgress(*c);
  if (pr != kSuccess) return pr;
  if (c->cts_queue.empty()) return kSuccess;
  const Frame cts = c->cts_queue.front();  // by value: consuming it may pop it
  int index = -1;
  if (Result m = MatchTag(cts.tags, cts.n, c->cts_consumed, tag, c->peer, &index); m != kSuccess) return m;
  Request* r = TakeRequest(*c);
  if (r == nullptr) return kSuccess;
  r->send = true;
  r->seq = cts.seq;
  r->index = index;
  r->size = size;
  Frame f{};
  f.type = kFrameData;
  f.seq = cts.seq;
  f.index = static_cast<uint32_t>(index);
  if (size > cts.sizes[index]) size = r->size = Truncate(*c, size, cts.sizes[index]);
  f.sizes[0] = size;
  c->cts_consumed |= 1u << index;
  if (c->cts_consumed == (1u << cts.n) - 1) {
    c->cts_queue.pop_front();
    c->cts_consumed = 0;
  }
  TcpQueueFrame(*c, f);
  TRACE_OP("trace tcp isend comm=%p peer=%s seq=%lu index=%d tag=%d size=%zu type=%d", static_cast<void*>(c),
           c->peer.c_str(), static_cast<unsigned long>(cts.seq), index, tag, size, mr->type);
  r->src = p;
  if (mr->type != nccl_abi::kPtrHost && size > 0) {
    auto st = TakeStage(*c, size);
    absl::Status cs = st.ok() ? absl::OkStatus() : st.status();
    if (cs.ok()) {
      r->staging[0] = *st;
      r->src = st->p;
      cs = StartCopies(*c, *r, {{reinterpret_cast<uint64_t>(st->p), reinterpret_cast<uint64_t>(p), size}});
    }
    if (!cs.ok()) {
      c->failed = kUnhandledCudaError;
      DropRequest(*r);
      return FailStatus(kUnhandledCudaError, "isend: staging GPU memory", cs);
    }
  }
  c->unqueued.push_back(r);
  *request = r;
  return TcpProgress(*c);
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
    if (!Covers(*mrs[i], data[i], sizes[i])) {
      return Fail(kInvalidArgument, "irecv: buffer outside its registration");
    }
  }
  Result pr = c->transport == Transport::kTcp ? TcpProgress(*c) : kSuccess;
  if (pr != kSuccess) return pr;
  if (c->transport == Transport::kPodlink) {
    Result r = PodlinkIrecv(*c, n, data, sizes, tags, mrs, request);
    if (*request != nullptr) {
      auto* req = static_cast<Request*>(*request);
      for (int i = 0; i < n; ++i) {
        req->data[i] = data[i];
        req->posted[i] = sizes[i];
        req->mr[i] = mrs[i];
      }
    }
    return r;
  }
  if (!c->peer_closed.empty()) {
    c->failed = kRemoteError;
    return Fail(kRemoteError, absl::StrCat("irecv: connection with ", c->peer, ": ", c->peer_closed));
  }
  Request* r = TakeRequest(*c, static_cast<int>(c->next_seq % kMaxRequests));
  if (r == nullptr) return kSuccess;
  r->seq = c->next_seq++;
  r->n = n;
  r->frames_left = n;
  Frame f{};
  f.type = kFrameCts;
  f.seq = r->seq;
  f.n = static_cast<uint32_t>(n);
  for (int i = 0; i < n; ++i) {
    r->data[i] = data[i];
    r->posted[i] = sizes[i];
    r->mr[i] = mrs[i];
    f.tags[i] = tags[i];
    f.sizes[i] = sizes[i];
  }
  TcpQueueFrame(*c, f);
  TRACE_OP("trace tcp irecv comm=%p peer=%s seq=%lu n=%d tag0=%d size0=%zu type0=%d", static_cast<void*>(c),
           c->peer.c_str(), static_cast<unsigned long>(r->seq), n, tags[0], sizes[0], mrs[0]->type);
  *request = r;
  return TcpProgress(*c);
}

Result Iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request) {
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
  Comm& c = *r->comm;
  if (c.transport == Transport::kPodlink) return PodlinkTest(*r, done, sizes);
  Result pr = TcpProgress(c);
  if (pr != kSuccess) return pr;
  if (r->send) {
    if (!r->queued || r->pieces_left > 0) return kSuccess;
    TRACE_OP("trace tcp send done comm=%p seq=%lu", static_cast<void*>(&c), static_cast<unsigned long>(r->seq));
    if (sizes != nullptr) sizes[0] = static_cast<int>(r->size);
    *done = 1;
    DropRequest(*r);
    return kSuccess;
  }
  if (r->frames_left > 0 && !c.peer_closed.empty()) {
    c.failed = kRemoteError;
    return Fail(kRemoteError, absl::StrCat("connection with ", c.peer, ": ", c.peer_closed,
                                           " before sending what a receive was due"));
  }
  if (r->frames_left > 0 || r->pieces_left > 0) return kSuccess;
  Result result = r->error;
  if (!r->copying && result == kSuccess) {
    // Page-locked staging -> GPU, asynchronously; done once they have landed.
    std::vector<std::array<uint64_t, 3>> copies;
    for (int i = 0; i < r->n; ++i) {
      if (r->mr[i]->type != nccl_abi::kPtrHost && r->got[i] > 0) {
        copies.push_back(
            {reinterpret_cast<uint64_t>(r->data[i]), reinterpret_cast<uint64_t>(r->staging[i].p), r->got[i]});
      }
    }
    TRACE_OP("trace tcp recv arrived comm=%p seq=%lu copies=%zu", static_cast<void*>(&c),
             static_cast<unsigned long>(r->seq), copies.size());
    r->copying = true;
    if (!copies.empty()) {
      absl::Status st = StartCopies(c, *r, copies);
      if (!st.ok()) result = FailStatus(kUnhandledCudaError, "irecv: copying into GPU memory", st);
    }
  }
  if (result == kSuccess) {
    auto copied = CopiesDone(c, *r);
    if (!copied.ok()) {
      result = FailStatus(kUnhandledCudaError, "irecv: copying into GPU memory", copied.status());
    } else if (!*copied) {
      return kSuccess;
    }
  } else if (r->error != kSuccess) {
    WARN("receive from %s: the matching send was larger than the receive", c.peer.c_str());
  }
  if (result != kSuccess && result != r->error) c.failed = result;
  for (int i = 0; i < r->n; ++i) {
    if (sizes != nullptr) sizes[i] = static_cast<int>(r->got[i]);
  }
  *done = 1;
  DropRequest(*r);
  return result;
}

Result CloseSend(void* send_comm) {
  Comm* c = AsComm(send_comm, true);
  if (c == nullptr) return Fail(kInvalidArgument, "closeSend: not a podlink send comm");
  DestroyComm(c);
  return kSuccess;
}

Result CloseRecv(void* recv_comm) {
  Comm* c = AsComm(recv_comm, false);
  if (c == nullptr) return Fail(kInvalidArgument, "closeRecv: not a podlink receive comm");
  DestroyComm(c);
  return kSuccess;
}

}  // namespace podlink::ncclnet
