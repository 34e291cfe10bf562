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

}  // namespace podlink::mesh
