#include "client-lib/nccl/transport_tcp.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/net_socket.h"
#include "client-lib/nccl/plugin.h"

namespace podlink::ncclnet {
namespace {

constexpr size_t kMinPiece = 64 << 10;  // smallest share of one data socket

// The largest send from host memory that travels inline on the control
// socket (PODLINK_NCCL_TCP_INLINE, bytes; 0 turns it off).
size_t InlineLimit() {
  static const size_t limit =
      static_cast<size_t>(std::clamp<int>(EnvInt("PODLINK_NCCL_TCP_INLINE", 32 << 10), 0, static_cast<int>(kMaxInlinePayload)));
  return limit;
}

// Ends a TCP connection without a reset. Linux answers a close() with
// unread bytes in the receive queue by RST, and a reset makes the peer drop
// what it has received but not yet read: the tail of the last message.
// Unconsumed input (clear-to-send frames for receives we will never match)
// is read and dropped, then FIN follows everything we sent.
void ShutdownQuietly(int fd) {
  char buf[16384];
  for (int i = 0; i < 4096 && ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; ++i) {
  }
  ::shutdown(fd, SHUT_WR);
}

}  // namespace

TcpComm::TcpComm(bool send, int dev, std::string peer, UniqueFd ctrl, std::vector<UniqueFd> data)
    : Comm(send, dev, std::move(peer), std::move(ctrl)), data_(std::move(data)), pieces_(data_.size()) {}

TcpComm::~TcpComm() {
  if (ctrl) ShutdownQuietly(ctrl.get());
  for (UniqueFd& fd : data_) {
    if (fd) ShutdownQuietly(fd.get());
  }
  copies_.Synchronize();  // copies in flight end before their buffers go
  reqs_.ForEachInUse([&](TcpRequest& r) { Drop(r); });
}

std::string TcpComm::Describe() const { return absl::StrCat("TCP, ", data_.size(), " data sockets"); }

Result TcpComm::RegMr(void* data, size_t size, int type, Mr** mr) {
  auto m = std::make_unique<Mr>();
  m->comm = this;
  m->base = static_cast<char*>(data);
  m->size = size;
  m->type = type;
  *mr = m.release();
  return kSuccess;
}

template <typename F>
void TcpComm::ForEachPiece(size_t size, F&& f) {
  size_t ns = data_.size();
  size_t share = (size + ns - 1) / ns;
  share = std::max(kMinPiece, (share + 127) & ~size_t{127});  // 128-byte boundaries
  for (size_t off = 0; off < size; off += share) {
    f(rr_ % ns, off, std::min(share, size - off));
    rr_++;
  }
}

// Returns the request's staging buffers and event to the pools.
void TcpComm::Drop(TcpRequest& r) {
  for (HostStage& st : r.staging) {
    staging_.Give(st);
    st = HostStage();
  }
  staging_.GiveEvent(r.copied);
  r.copied = nullptr;
  r.in_use = false;
}

Result TcpComm::Progress() {
  if (failed != kSuccess) return failed;
  auto fail = [&](Result r, const std::string& why) { return FailComm(r, why); };
  // Sends whose staging copy has finished go to the sockets, in frame order.
  while (!unqueued_.empty()) {
    TcpRequest& r = *unqueued_.front();
    auto copied = staging_.Done(r.copied);
    if (!copied.ok()) return fail(kUnhandledCudaError, absl::StrCat("staging a send: ", copied.status().ToString()));
    if (!*copied) break;
    unqueued_.pop_front();
    ForEachPiece(r.size, [&](size_t sock, size_t off, size_t len) {
      pieces_[sock].push_back(Piece{&r, r.src + off, len});
      r.pieces_left++;
    });
    r.queued = true;
  }
  while (!out_.empty()) {
    auto n = SendSome(ctrl.get(), out_.data(), out_.size());
    if (!n.ok()) return fail(kRemoteError, n.status().ToString());
    if (*n == 0) break;
    out_.erase(0, *n);
    out_sent_ += *n;
  }
  // Control frames in, and the payloads that travel inline after theirs.
  while (peer_closed_.empty()) {
    const bool payload = inline_left_ > 0;
    auto n = payload ? RecvSome(ctrl.get(), inline_dst_, inline_left_)
                     : RecvSome(ctrl.get(), reinterpret_cast<char*>(&in_) + in_got_, sizeof(Frame) - in_got_);
    if (!n.ok()) {
      if (send) {
        if (reqs_.AnyInUse()) return fail(kRemoteError, n.status().ToString());
        break;  // an idle sender notices a closed peer on its next send
      }
      // What the peer sent before closing still counts: a receive whose data
      // frames all arrived completes from the data sockets; one still
      // waiting for frames fails when tested (Test), as does a new receive.
      peer_closed_ = n.status().ToString();
      break;
    }
    if (*n == 0) break;
    if (payload) {
      inline_dst_ += *n;
      inline_left_ -= *n;
      if (inline_left_ == 0) {
        inline_req_->pieces_left--;
        inline_req_ = nullptr;
      }
      continue;
    }
    in_got_ += *n;
    if (in_got_ < sizeof(Frame)) continue;
    in_got_ = 0;
    Frame f = in_;
    if (send) {
      if (f.type != kFrameCts || f.n < 1 || f.n > kMaxRecvs) return fail(kRemoteError, "malformed clear-to-send");
      cts_queue_.push_back(f);
      continue;
    }
    if (f.type != kFrameData && f.type != kFrameDataInline) return fail(kRemoteError, "unexpected frame type");
    TcpRequest& r = reqs_.at(f.seq % kMaxRequests);
    if (!r.in_use || r.seq != f.seq || f.index >= static_cast<uint32_t>(r.n) || r.frames_left <= 0) {
      return fail(kRemoteError, absl::StrCat("data for unknown receive ", f.seq, "/", f.index));
    }
    r.frames_left--;
    uint64_t size = f.sizes[0];
    if (f.type == kFrameDataInline && (size == kSizeError || size > kMaxInlinePayload)) {
      return fail(kRemoteError, absl::StrCat("inline payload of ", size, " bytes (at most ", kMaxInlinePayload, ")"));
    }
    if (size == kSizeError) {
      r.error = kInvalidUsage;
      r.got[f.index] = 0;
      continue;
    }
    if (size > r.posted[f.index]) return fail(kRemoteError, "peer sent more than the receive holds");
    r.got[f.index] = size;
    char* dst = static_cast<char*>(r.data[f.index]);
    if (r.mr[f.index]->type != nccl_abi::kPtrHost && size > 0) {
      auto st = staging_.Take(size);
      if (!st.ok()) return fail(kUnhandledCudaError, absl::StrCat("staging a receive: ", st.status().ToString()));
      r.staging[f.index] = *st;
      dst = st->p;
    }
    if (f.type == kFrameDataInline) {
      if (size > 0) {
        r.pieces_left++;
        inline_req_ = &r;
        inline_dst_ = dst;
        inline_left_ = size;
      }
      continue;
    }
    ForEachPiece(size, [&](size_t sock, size_t off, size_t len) {
      pieces_[sock].push_back(Piece{&r, dst + off, len});
      r.pieces_left++;
    });
  }
  // Payload.
  for (size_t s = 0; s < data_.size(); ++s) {
    auto& q = pieces_[s];
    while (!q.empty()) {
      Piece& p = q.front();
      auto n = send ? SendSome(data_[s].get(), p.p, p.left) : RecvSome(data_[s].get(), p.p, p.left);
      if (!n.ok()) return fail(kRemoteError, n.status().ToString());
      if (*n == 0) break;
      p.p += *n;
      p.left -= *n;
      if (p.left == 0) {
        p.req->pieces_left--;
        q.pop_front();
      }
    }
  }
  return kSuccess;
}


Result TcpComm::Isend(void* data, size_t size, int tag, Mr* mr, void** request) {
  Result pr = Progress();
  if (pr != kSuccess) return pr;
  if (cts_queue_.empty()) return kSuccess;
  const Frame cts = cts_queue_.front();  // by value: consuming it may pop it
  int index = -1;
  if (Result m = MatchTag(cts.tags, cts.n, cts_consumed_, tag, peer, &index); m != kSuccess) return m;
  TcpRequest* r = reqs_.Take(this);
  if (r == nullptr) return kSuccess;
  r->send = true;
  r->seq = cts.seq;
  r->index = index;
  r->size = size;
  Frame f{};
  f.type = kFrameData;
  f.seq = cts.seq;
  f.index = static_cast<uint32_t>(index);
  if (size > cts.sizes[index]) size = r->size = Truncate(size, cts.sizes[index]);
  f.sizes[0] = size;
  cts_consumed_ |= 1u << index;
  if (cts_consumed_ == (1u << cts.n) - 1) {
    cts_queue_.pop_front();
    cts_consumed_ = 0;
  }
  char* p = static_cast<char*>(data);
  if (mr->type == nccl_abi::kPtrHost && size > 0 && size <= InlineLimit()) {
    // The payload is copied behind its frame now, so the buffer is NCCL's
    // again once the control stream has carried it.
    f.type = kFrameDataInline;
    QueueFrame(f);
    out_.append(p, size);
    r->src = p;
    r->queued = true;
    r->inline_end = out_sent_ + out_.size();
    TRACE_OP("trace tcp isend inline comm=%p peer=%s seq=%lu index=%d tag=%d size=%zu", static_cast<void*>(this),
             peer.c_str(), static_cast<unsigned long>(cts.seq), index, tag, size);
    *request = r;
    return Progress();
  }
  QueueFrame(f);
  TRACE_OP("trace tcp isend comm=%p peer=%s seq=%lu index=%d tag=%d size=%zu type=%d", static_cast<void*>(this),
           peer.c_str(), static_cast<unsigned long>(cts.seq), index, tag, size, mr->type);
  r->src = p;
  if (mr->type != nccl_abi::kPtrHost && size > 0) {
    auto st = staging_.Take(size);
    absl::Status cs = st.ok() ? absl::OkStatus() : st.status();
    if (cs.ok()) {
      r->staging[0] = *st;
      r->src = st->p;
      cs = staging_.StartCopies({{reinterpret_cast<uint64_t>(st->p), reinterpret_cast<uint64_t>(p), size}},
                                &r->copied);
    }
    if (!cs.ok()) {
      failed = kUnhandledCudaError;
      Drop(*r);
      return FailStatus(kUnhandledCudaError, "isend: staging GPU memory", cs);
    }
  }
  unqueued_.push_back(r);
  *request = r;
  return Progress();
}

Result TcpComm::Irecv(int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request) {
  Result pr = Progress();
  if (pr != kSuccess) return pr;
  if (!peer_closed_.empty()) {
    failed = kRemoteError;
    return Fail(kRemoteError, absl::StrCat("irecv: connection with ", peer, ": ", peer_closed_));
  }
  TcpRequest* r = reqs_.Take(this, static_cast<int>(next_seq_ % kMaxRequests));
  if (r == nullptr) return kSuccess;
  r->seq = next_seq_++;
  r->Post(n, data, sizes, mrs);
  r->frames_left = n;
  Frame f{};
  f.type = kFrameCts;
  f.seq = r->seq;
  f.n = static_cast<uint32_t>(n);
  for (int i = 0; i < n; ++i) {
    f.tags[i] = tags[i];
    f.sizes[i] = sizes[i];
  }
  QueueFrame(f);
  TRACE_OP("trace tcp irecv comm=%p peer=%s seq=%lu n=%d tag0=%d size0=%zu type0=%d", static_cast<void*>(this),
           peer.c_str(), static_cast<unsigned long>(r->seq), n, tags[0], sizes[0], mrs[0]->type);
  *request = r;
  return Progress();
}

Result TcpComm::Test(Request& base, int* done, int* sizes) {
  auto& r = static_cast<TcpRequest&>(base);
  Result pr = Progress();
  if (pr != kSuccess) return pr;
  if (r.send) {
    if (!r.queued || r.pieces_left > 0 || out_sent_ < r.inline_end) return kSuccess;
    TRACE_OP("trace tcp send done comm=%p seq=%lu", static_cast<void*>(this), static_cast<unsigned long>(r.seq));
    if (sizes != nullptr) sizes[0] = static_cast<int>(r.size);
    *done = 1;
    Drop(r);
    return kSuccess;
  }
  return ReceiveDone(r, done, sizes);
}

Result TcpComm::ReceiveDone(TcpRequest& r, int* done, int* sizes) {
  if ((r.frames_left > 0 || &r == inline_req_) && !peer_closed_.empty()) {
    failed = kRemoteError;
    return Fail(kRemoteError, absl::StrCat("connection with ", peer, ": ", peer_closed_,
                                           " before sending what a receive was due"));
  }
  if (r.frames_left > 0 || r.pieces_left > 0) return kSuccess;
  Result result = r.error;
  if (!r.copying && result == kSuccess) {
    // Page-locked staging -> GPU, asynchronously; done once they have landed.
    std::vector<std::array<uint64_t, 3>> copies;
    for (int i = 0; i < r.n; ++i) {
      if (r.mr[i]->type != nccl_abi::kPtrHost && r.got[i] > 0) {
        copies.push_back(
            {reinterpret_cast<uint64_t>(r.data[i]), reinterpret_cast<uint64_t>(r.staging[i].p), r.got[i]});
      }
    }
    TRACE_OP("trace tcp recv arrived comm=%p seq=%lu copies=%zu", static_cast<void*>(this),
             static_cast<unsigned long>(r.seq), copies.size());
    r.copying = true;
    if (!copies.empty()) {
      absl::Status st = staging_.StartCopies(copies, &r.copied);
      if (!st.ok()) result = FailStatus(kUnhandledCudaError, "irecv: copying into GPU memory", st);
    }
  }
  if (result == kSuccess) {
    auto copied = staging_.Done(r.copied);
    if (!copied.ok()) {
      result = FailStatus(kUnhandledCudaError, "irecv: copying into GPU memory", copied.status());
    } else if (!*copied) {
      return kSuccess;
    }
  } else if (r.error != kSuccess) {
    WARN("receive from %s: the matching send was larger than the receive", peer.c_str());
  }
  if (result != kSuccess && result != r.error) failed = result;
  for (int i = 0; i < r.n; ++i) {
    if (sizes != nullptr) sizes[i] = static_cast<int>(r.got[i]);
  }
  *done = 1;
  Drop(r);
  return result;
}

}  // namespace podlink::ncclnet
