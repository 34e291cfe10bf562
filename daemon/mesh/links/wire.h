// Data frames between daemons (the TCP links of the mesh).
//
// A data connection is plain TCP to the peer's data port. Its first frame is
// AUTH carrying a one-use 32-byte cookie the connecting daemon obtained over
// the mutually authenticated control plane (mesh.proto OpenLink); the
// accepting daemon thereby knows which node the connection belongs to and
// serves nothing before that. Then requests flow from the importing daemon
// and answers back, each frame a 40-byte header and `length` payload bytes:
//
//   WRITE  grant, offset, payload     -> ACK(status)  after the bytes are in the export
//   READ   grant, offset, length      -> DATA(payload) or ACK(error)
//   NOTIFY grant, offset = value      -> ACK(status)  after the owner's queue has it
//   DONE                              -> ACK          the transfer `tag` names is finished
//
// `tag` names the request in its answer: the transfer's number in the high 32
// bits, the slice's in the low 32. AUTH's `grant` field carries the sender's
// link instance (random per set of connections). A slice whose connection
// failed is sent again on another connection of the peer; a transfer that
// needed that sends DONE before it completes, and from then on the receiver
// drops any late copy of its slices (one still in flight on the failed
// connection), so a resent slice never lands after its transfer completed.
// A NOTIFY is delivered once per transfer number, however often it is sent. The receiver checks the magic, the
// type, the length cap, the grant (issued to this connection's node, export
// still live) and the bounds before it touches memory; a refused WRITE's
// payload is read into scratch memory so the stream stays in step. Frames are
// authenticated by their connection, not encrypted (docs/security.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace podlink::mesh {

inline constexpr uint32_t kFrameMagic = 0x314d4c50;  // "PLM1"
inline constexpr uint32_t kMaxFramePayload = 16u << 20;
inline constexpr size_t kCookieBytes = 32;

enum class FrameType : uint16_t {
  kAuth = 1,
  kWrite = 2,
  kRead = 3,
  kData = 4,
  kAck = 5,
  kNotify = 6,
  kDone = 7,
};

inline uint32_t TransferOfTag(uint64_t tag) { return static_cast<uint32_t>(tag >> 32); }

struct FrameHeader {
  uint32_t magic;
  uint16_t type;      // FrameType
  uint16_t flags;     // 0
  uint32_t length;    // payload bytes that follow (READ: bytes asked for; none follow)
  int32_t status;     // ACK: absl::StatusCode
  uint64_t tag;
  uint64_t grant;
  uint64_t offset;    // NOTIFY: the value
};
static_assert(sizeof(FrameHeader) == 40);

// Blocking full reads and writes on a socket (EINTR retried). UNAVAILABLE on
// EOF, reset or timeout.
absl::Status ReadFull(int fd, void* buf, size_t len);
absl::Status WriteFull(int fd, const void* buf, size_t len);
// Header then payload in one sendmsg where possible.
absl::Status WriteFrame(int fd, const FrameHeader& h, const void* payload, size_t len);
// Reads `len` bytes and throws them away.
absl::Status Discard(int fd, size_t len);

// Frame payloads sent without a copy into the kernel (MSG_ZEROCOPY, Linux
// 4.14+): the NIC reads them from the caller's pages. Only for memory that
// stays mapped and unchanged until the peer has answered the frame (a pod's
// host export during its transfer; never a buffer the caller refills at
// once): the kernel holds the pages, not their contents, until it is done.
// The header is always copied (it lives on the caller's stack). Where the
// kernel cannot (no SO_ZEROCOPY; ENOBUFS: the locked-memory limit or optmem
// reached; EFAULT: pages it cannot pin), the payload is copied as before; where it had to copy after all
// (loopback, veth, a device without scatter-gather: the completion says
// COPIED, which costs more than a plain copy), the socket stops asking.
// Completions are read off the socket's error queue by Reap (the sender after
// each frame, and whoever polls the socket when it reports POLLERR).
// Thread-safe: one thread writes frames, any may reap.
struct ZeroCopyCounters {
  std::atomic<uint64_t> bytes{0};      // payload bytes handed to the kernel with MSG_ZEROCOPY
  std::atomic<uint64_t> completed{0};  // sends the kernel reported done
  std::atomic<uint64_t> copied{0};     // of those, sends it had to copy after all
  std::atomic<uint64_t> fell_back{0};  // sends refused (ENOBUFS, EFAULT) and copied instead
};

class ZeroCopySends {
 public:
  static constexpr size_t kMinPayload = 16 << 10;  // below this a copy is cheaper than pinning

  // Counts into `counters` (shared by the sockets of one owner; outlives
  // this). Null: never enabled, every frame copied.
  explicit ZeroCopySends(ZeroCopyCounters* counters) : counters_(counters) {}
  // Turns SO_ZEROCOPY on for `fd`; false (and every frame copied) where the
  // kernel or the socket refuses.
  bool Enable(int fd);
  bool on() const { return on_.load(std::memory_order_relaxed); }
  // WriteFrame, the payload without a copy when on and at least kMinPayload.
  absl::Status WriteFrame(int fd, const FrameHeader& h, const void* payload, size_t len);
  // Reads the completions queued on `fd`'s error queue without blocking;
  // returns how many messages it took.
  int Reap(int fd);

 private:
  ZeroCopyCounters* const counters_;
  std::atomic<bool> on_{false};
};

}  // namespace podlink::mesh
