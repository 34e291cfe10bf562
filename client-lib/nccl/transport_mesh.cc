#include "client-lib/nccl/transport_mesh.h"

#include <sys/socket.h>

#include <poll.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/net_socket.h"
#include "client-lib/nccl/plugin.h"
#include "client-lib/nccl/step_trace.h"

namespace podlink::ncclnet {

namespace {
constexpr size_t kMaxQueuedCts = 2 * kMaxRequests;  // NCCL posts at most 32 receives at a time
}  // namespace

MeshComm::MeshComm(bool send, int dev, std::string peer, UniqueFd ctrl)
    : Comm(send, dev, std::move(peer), std::move(ctrl)) {}

MeshComm::~MeshComm() {
  State& s = S();
  if (s.engine) {
    reqs_.ForEachInUse([&](MeshRequest& r) {
      if (r.batch != 0) (void)s.engine->Wait(r.batch);  // the daemons may still read our memory
    });
  }
  // Completions still queued go out before the socket closes (a second at most).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!out_.empty() && ctrl && std::chrono::steady_clock::now() < deadline) {
    auto n = SendSome(ctrl.get(), out_.data(), out_.size());
    if (!n.ok()) break;
    if (*n == 0) {
      pollfd p{ctrl.get(), POLLOUT, 0};
      ::poll(&p, 1, 50);
      continue;
    }
    out_.erase(0, *n);
  }
  if (!s.engine) return;
  for (auto& [id, remote] : opened_) {
    bool last = false;
    {
      std::lock_guard<std::mutex> l(s.mu);
      last = --s.remote_refs[remote.export_id] == 0;
      if (last) s.remote_refs.erase(remote.export_id);
    }
    if (last) (void)s.engine->Close(remote);
  }
}

Result MeshComm::SetupReceiver(Welcome&) {
  // The sender learns where this node's daemon is from the first message.
  const std::string& node = S().mesh_node;
  MeshNode m{};
  m.magic = kMeshNodeMagic;
  if (node.empty() || node.size() > sizeof(m.text)) return Fail(kSystemError, "mesh: this node has no mesh to offer");
  m.len = static_cast<uint32_t>(node.size());
  std::memcpy(m.text, node.data(), node.size());
  Queue(&m, sizeof(m));
  return kSuccess;
}

Result MeshComm::SetupSender(const Welcome&) { return kSuccess; }

Result MeshComm::RegMr(void* data, size_t size, int type, Mr** mr) {
  // The daemons' mesh carries host exports: GPU buffers get host bounce buffers.
  return RegisterExported(this, dev, data, size, type, /*gpu_in_host=*/true, mr);
}

Result MeshComm::Progress() {
  if (failed != kSuccess) return failed;
  while (!out_.empty()) {
    auto n = SendSome(ctrl.get(), out_.data(), out_.size());
    if (!n.ok()) return FailComm(kRemoteError, n.status().ToString());
    if (*n == 0) break;
    out_.erase(0, *n);
  }
  while (peer_closed_.empty()) {
    if (send && node_got_ < sizeof(MeshNode)) {
      auto n = RecvSome(ctrl.get(), reinterpret_cast<char*>(&node_in_) + node_got_, sizeof(MeshNode) - node_got_);
      if (!n.ok()) {
        peer_closed_ = n.status().ToString();
        break;
      }
      if (*n == 0) break;
      node_got_ += *n;
      if (node_got_ < sizeof(MeshNode)) continue;
      if (node_in_.magic != kMeshNodeMagic || node_in_.len > sizeof(node_in_.text)) {
        return FailComm(kRemoteError, "mesh: malformed node message from the receiver");
      }
      auto d = RegionDescriptor::Parse(std::string(node_in_.text, node_in_.len));
      if (!d.ok() || d->mesh_addresses.empty()) {
        return FailComm(kRemoteError, absl::StrCat("mesh: the receiver's node is not reachable over the mesh: ",
                                                   d.ok() ? "no mesh addresses" : d.status().ToString()));
      }
      if (d->node_id == S().node_id) return FailComm(kRemoteError, "mesh: the receiver claims to be on this node");
      peer_node_ = *std::move(d);
      continue;
    }
    auto n = RecvSome(ctrl.get(), reinterpret_cast<char*>(&in_) + in_got_, sizeof(MeshFrame) - in_got_);
    if (!n.ok()) {
      peer_closed_ = n.status().ToString();
      break;
    }
    if (*n == 0) break;
    in_got_ += *n;
    if (in_got_ < sizeof(MeshFrame)) continue;
    in_got_ = 0;
    const MeshFrame& f = in_;
    if (send) {
      if (f.type != kMeshCts || f.n < 1 || f.n > kMaxRecvs) return FailComm(kRemoteError, "mesh: malformed clear-to-send");
      if (cts_.size() >= kMaxQueuedCts) return FailComm(kRemoteError, "mesh: the receiver posted too many receives");
      cts_.push_back(f);
      continue;
    }
    if (f.type != kMeshDone) return FailComm(kRemoteError, "mesh: unexpected frame type from the sender");
    MeshRequest& r = reqs_.at(static_cast<int>(f.seq % kMaxRequests));
    if (!r.in_use || r.send || r.seq != f.seq || f.index >= static_cast<uint32_t>(r.n) ||
        (r.done_mask & (1u << f.index)) != 0) {
      return FailComm(kRemoteError, absl::StrCat("mesh: completion for unknown receive ", f.seq, "/", f.index));
    }
    uint64_t got = f.sizes[0];
    if (got != kSizeError && got > r.posted[f.index]) {
      return FailComm(kRemoteError, absl::StrCat("mesh: the sender reports ", got, " bytes for a ", r.posted[f.index],
                                                 "-byte buffer"));
    }
    r.got[f.index] = got;
    r.done_mask |= 1u << f.index;
  }
  return kSuccess;
}

absl::StatusOr<RemoteRegion> MeshComm::OpenRemote(uint64_t export_id) {
  if (auto it = opened_.find(export_id); it != opened_.end()) return it->second;
  State& s = S();
  if (s.engine == nullptr || peer_node_.node_id.empty()) {
    return absl::FailedPreconditionError("no podlinkd session, or the receiver's node is not known yet");
  }
  RegionDescriptor d = peer_node_;
  d.export_id = export_id;
  // The first buffer of a node dials its daemon (the engine caches the opening).
  auto r = s.engine->Open(d);
  if (!r.ok()) return r.status();
  opened_[export_id] = *r;
  std::lock_guard<std::mutex> l(s.mu);
  s.remote_refs[r->export_id]++;
  return *r;
}

uint64_t MeshComm::ConnKey() {
  if (conn_key_ != 0) return conn_key_;
  // The control socket's two endpoints, in an order both sides agree on.
  sockaddr_storage a{}, b{};
  socklen_t la = sizeof(a), lb = sizeof(b);
  ::getsockname(ctrl.get(), reinterpret_cast<sockaddr*>(&a), &la);
  ::getpeername(ctrl.get(), reinterpret_cast<sockaddr*>(&b), &lb);
  std::string x(reinterpret_cast<const char*>(&a), la), y(reinterpret_cast<const char*>(&b), lb);
  if (y < x) std::swap(x, y);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char ch : x + y) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  conn_key_ = h == 0 ? 1 : h;
  return conn_key_;
}

Result MeshComm::Isend(void* data, size_t size, int tag, Mr* base_mr, void** request) {
  auto* mr = static_cast<PodlinkMr*>(base_mr);
  if (Result p = Progress(); p != kSuccess) return p;
  const bool tracing = trace::On();
  if (tracing && first_try_ == 0) first_try_ = trace::Now();
  if (cts_.empty()) {
    if (!peer_closed_.empty()) return FailComm(kRemoteError, "mesh: the receiver went away: " + peer_closed_);
    return kSuccess;  // *request stays NULL: not now
  }
  const MeshFrame cts = cts_.front();
  if (cts.seq != next_seq_) return FailComm(kRemoteError, "mesh: clear-to-send out of order");
  int index = -1;
  if (Result m = MatchTag(cts.tags, cts.n, cts_consumed_, tag, peer, &index); m != kSuccess) return m;
  MeshRequest* r = reqs_.Take(this);
  if (r == nullptr) return kSuccess;
  cts_consumed_ |= 1u << index;
  if (cts_consumed_ == (1u << cts.n) - 1) {
    cts_.pop_front();
    cts_consumed_ = 0;
    next_seq_++;
  }
  r->send = true;
  r->seq = cts.seq;
  r->index = index;
  r->size = size > cts.sizes[index] ? Truncate(size, cts.sizes[index]) : size;
  if (tracing) {
    r->t_try = first_try_;
    r->t_post = trace::Now();
    first_try_ = 0;
  }
  if (r->size > 0) {
    uint64_t off = static_cast<char*>(data) - mr->base;
    if (mr->bounce()) {
      absl::Status st = copies_.CopyFor(mr->type, reinterpret_cast<void*>(mr->bounce_ptr() + off), data, r->size);
      if (!st.ok()) {
        r->in_use = false;
        return FailStatus(kUnhandledCudaError, "mesh: staging a send", st);
      }
    }
    auto remote = OpenRemote(cts.exports[index]);
    if (!remote.ok()) {
      r->in_use = false;
      return FailStatus(kSystemError, "mesh: opening the receiver's buffer on its node", remote.status());
    }
    TransferOp op{&mr->region, mr->region_offset + off, &*remote, cts.offsets[index], r->size};
    auto batch = S().engine->WriteAsync({op});
    if (!batch.ok()) {
      r->in_use = false;
      return FailStatus(kSystemError, "mesh: submitting a write", batch.status());
    }
    r->batch = *batch;
  }
  if (tracing) r->t_submit = trace::Now();
  *request = r;
  return kSuccess;
}

Result MeshComm::Irecv(int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request) {
  if (Result p = Progress(); p != kSuccess) return p;
  if (!peer_closed_.empty()) return FailComm(kRemoteError, "mesh: the sender went away: " + peer_closed_);
  MeshRequest* r = reqs_.Take(this, static_cast<int>(next_seq_ % kMaxRequests));
  if (r == nullptr) return kSuccess;
  MeshFrame f{};
  f.type = kMeshCts;
  f.seq = next_seq_;
  f.n = static_cast<uint32_t>(n);
  for (int i = 0; i < n; ++i) {
    auto* mr = static_cast<PodlinkMr*>(mrs[i]);
    f.tags[i] = tags[i];
    f.sizes[i] = sizes[i];
    f.exports[i] = mr->region.export_id;
    f.offsets[i] = mr->region_offset + (static_cast<char*>(data[i]) - mr->base);
  }
  r->seq = next_seq_++;
  r->Post(n, data, sizes, mrs);
  if (trace::On()) r->t_post = trace::Now();
  Queue(&f, sizeof(f));
  *request = r;
  return Progress();
}

Result MeshComm::Test(Request& base, int* done, int* sizes) {
  auto& r = static_cast<MeshRequest&>(base);
  return r.send ? SendDone(r, done, sizes) : ReceiveDone(r, done, sizes);
}

Result MeshComm::SendDone(MeshRequest& r, int* done, int* sizes) {
  MeshFrame f{};
  f.type = kMeshDone;
  f.seq = r.seq;
  f.index = static_cast<uint32_t>(r.index);
  f.sizes[0] = r.size;
  Result result = kSuccess;
  if (r.batch != 0) {
    auto polled = S().engine->Poll(r.batch);
    if (polled.ok() && !*polled) return Progress();
    absl::Status st = polled.ok() ? S().engine->Wait(r.batch) : polled.status();
    r.batch = 0;
    if (!st.ok()) {
      f.sizes[0] = kSizeError;
      result = FailStatus(kSystemError, "mesh: write to the receiver's node", st);
    }
  }
  // The bytes are in the receiver's memory (its daemon acknowledged them): say so.
  Queue(&f, sizeof(f));
  if (trace::On()) trace::Record({'s', ConnKey(), r.seq, r.index, r.size, r.t_try, r.t_post, r.t_submit, trace::Now()});
  if (Result p = Progress(); p != kSuccess && result == kSuccess) result = p;
  if (sizes != nullptr) sizes[0] = static_cast<int>(r.size);
  *done = 1;
  r.in_use = false;
  return result;
}

Result MeshComm::ReceiveDone(MeshRequest& r, int* done, int* sizes) {
  if (Result p = Progress(); p != kSuccess) return p;
  uint32_t full = (1u << r.n) - 1;
  if (r.done_mask != full) {
    if (!peer_closed_.empty()) return FailComm(kRemoteError, "mesh: the sender went away: " + peer_closed_);
    return kSuccess;
  }
  uint64_t got[kMaxRecvs];
  for (int i = 0; i < r.n; ++i) got[i] = r.got[i];
  Result result = FinishReceive(copies_, peer, r, got, sizes);
  if (trace::On()) {
    uint64_t now = trace::Now();
    for (int i = 0; i < r.n; ++i) trace::Record({'r', ConnKey(), r.seq, i, r.posted[i], 0, r.t_post, 0, now});
  }
  *done = 1;
  r.in_use = false;
  return result;
}

}  // namespace podlink::ncclnet
