#include "client-lib/nccl/transport_tcp.h"

#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/net_socket.h"
#include "client-lib/nccl/plugin.h"

namespace podlink::ncclnet {

using nccl_abi::kInternalError;
using nccl_abi::kInvalidArgument;
using nccl_abi::kInvalidUsage;
using nccl_abi::kRemoteError;
using nccl_abi::kSuccess;
using nccl_abi::kSystemError;
using nccl_abi::kUnhandledCudaError;

// Splits `size` bytes over the comm's data sockets on 128-byte boundaries.
// Both sides call it in the same message order, so they agree.
template <typename F>
void ForEachPiece(Comm& c, size_t size, F&& f) {
  size_t ns = c.data.size();
  size_t share = (size + ns - 1) / ns;
  share = std::max(kMinPiece, (share + 127) & ~size_t{127});
  for (size_t off = 0; off < size; off += share) {
    f(c.rr % ns, off, std::min(share, size - off));
    c.rr++;
  }
}

Result TcpProgress(Comm& c) {
  if (c.failed != kSuccess) return c.failed;
  auto fail = [&](Result r, const std::string& why) {
    c.failed = r;
    return Fail(r, absl::StrCat("connection with ", c.peer, ": ", why));
  };
  // Sends whose staging copy has finished go to the sockets, in frame order.
  while (!c.unqueued.empty()) {
    Request& r = *c.unqueued.front();
    auto copied = CopiesDone(c, r);
    if (!copied.ok()) return fail(kUnhandledCudaError, absl::StrCat("staging a send: ", copied.status().ToString()));
    if (!*copied) break;
    c.unqueued.pop_front();
    ForEachPiece(c, r.size, [&](size_t sock, size_t off, size_t len) {
      c.pieces[sock].push_back(Piece{&r, r.src + off, len});
      r.pieces_left++;
    });
    r.queued = true;
  }
  while (!c.out.empty()) {
    auto n = SendSome(c.ctrl.get(), c.out.data(), c.out.size());
    if (!n.ok()) return fail(kRemoteError, n.status().ToString());
    if (*n == 0) break;
    c.out.erase(0, *n);
  }
  // Control frames in.
  while (c.peer_closed.empty()) {
    auto n = RecvSome(c.ctrl.get(), reinterpret_cast<char*>(&c.in) + c.in_got, sizeof(Frame) - c.in_got);
    if (!n.ok()) {
      if (c.send) {
        bool busy = false;
        for (const Request& r : c.reqs) busy |= r.in_use;
        if (busy) return fail(kRemoteError, n.status().ToString());
        break;  // an idle sender notices a closed peer on its next send
      }
      // What the peer sent before closing still counts: a receive whose data
      // frames all arrived completes from the data sockets; one still
      // waiting for frames fails when tested (Test), as does a new receive.
      c.peer_closed = n.status().ToString();
      break;
    }
    if (*n == 0) break;
    c.in_got += *n;
    if (c.in_got < sizeof(Frame)) continue;
    c.in_got = 0;
    Frame f = c.in;
    if (c.send) {
      if (f.type != kFrameCts || f.n < 1 || f.n > kMaxRecvs) return fail(kRemoteError, "malformed clear-to-send");
      c.cts_queue.push_back(f);
      continue;
    }
    if (f.type != kFrameData) return fail(kRemoteError, "unexpected frame type");
    Request& r = c.reqs[f.seq % kMaxRequests];
    if (!r.in_use || r.seq != f.seq || f.index >= static_cast<uint32_t>(r.n) || r.frames_left <= 0) {
      return fail(kRemoteError, absl::StrCat("data for unknown receive ", f.seq, "/", f.index));
    }
    r.frames_left--;
    uint64_t size = f.sizes[0];
    if (size == kSizeError) {
      r.error = kInvalidUsage;
      r.got[f.index] = 0;
      continue;
    }
    if (size > r.posted[f.index]) return fail(kRemoteError, "peer sent more than the receive holds");
    r.got[f.index] = size;
    char* dst = static_cast<char*>(r.data[f.index]);
    if (r.mr[f.index]->type != nccl_abi::kPtrHost && size > 0) {
      auto st = TakeStage(c, size);
      if (!st.ok()) {
        c.failed = kUnhandledCudaError;
        return FailStatus(kUnhandledCudaError, "staging a receive", st.status());
      }
      r.staging[f.index] = *st;
      dst = st->p;
    }
    ForEachPiece(c, size, [&](size_t sock, size_t off, size_t len) {
      c.pieces[sock].push_back(Piece{&r, dst + off, len});
      r.pieces_left++;
    });
  }
  // Payload.
  for (size_t s = 0; s < c.data.size(); ++s) {
    auto& q = c.pieces[s];
    while (!q.empty()) {
      Piece& p = q.front();
      auto n = c.send ? SendSome(c.data[s].get(), p.p, p.left) : RecvSome(c.data[s].get(), p.p, p.left);
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

void TcpQueueFrame(Comm& c, const Frame& f) { c.out.append(reinterpret_cast<const char*>(&f), sizeof(f)); }

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

}  // namespace podlink::ncclnet
