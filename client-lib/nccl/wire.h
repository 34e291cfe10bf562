// Wire formats of the NCCL net plugin: the listen handle NCCL carries between
// ranks, the hello and welcome of the connection handshake, the TCP
// transport's frames and the podlink transport's shared control region.
// Every struct crosses a process boundary, so each size is pinned.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "client-lib/nccl/api.h"
#include "client-lib/nccl/nccl_net_abi.h"

namespace podlink::ncclnet {

constexpr uint32_t kHandleMagic = 0x4b4e4c50;  // "PLNK"
constexpr uint32_t kHelloMagic = 0x4f4c4548;   // "HELO"
constexpr uint32_t kRegionMagic = 0x4c525443;  // "CTRL"
constexpr uint16_t kWireVersion = 1;
constexpr int kSlots = 64;  // control-region ring slots (> NCCL's 32 requests in flight)
constexpr uint64_t kSizeError = ~0ull;  // a completion size meaning "this send failed"

// Which transport a connection uses, as the hello carries it. The transports
// themselves are classes (transports.h selects and makes them).
// kMesh: another node reached through both nodes' podlinkd mesh
// (transport_mesh.h).
enum class TransportId : uint8_t { kTcp = 1, kPodlink = 2, kMesh = 3 };

constexpr uint64_t kHandleFlagMesh = 1;  // WireHandle::flags: the listener's podlinkd runs the mesh

// The listen handle NCCL carries to the peer (<= 128 bytes). The last 16
// bytes are the connecting side's own bookkeeping and never trusted as a
// pointer.
struct WireHandle {
  uint32_t magic;
  uint16_t version;
  uint16_t family;
  uint8_t addr[16];
  uint16_t port;  // network order
  uint16_t dev;
  uint32_t pad;
  uint64_t nonce;
  char node_id[48];
  uint64_t connect_cookie;
  uint64_t flags;  // kHandleFlag*
};
static_assert(sizeof(WireHandle) <= nccl_abi::kHandleMaxSize);

struct Hello {  // first bytes on every socket a connect opens
  uint32_t magic;
  uint16_t version;
  uint8_t kind;  // 0 control, 1 data
  uint8_t transport;
  uint64_t nonce;    // the listen handle's: proves the connector saw the handle
  uint64_t conn_id;  // groups a connection's sockets
  uint32_t nsocks;
  uint32_t index;
  uint32_t pid;
  uint32_t pad;
  char node_id[48];
};
static_assert(sizeof(Hello) == 88);

struct Welcome {  // accept's answer on the control socket
  uint32_t magic;
  int32_t status;  // 0 ok
  uint64_t ctrl_export;
  uint64_t ctrl_size;
  char message[40];
};
static_assert(sizeof(Welcome) == 64);

// kFrameDataInline: a data frame whose sizes[0] payload bytes follow it on
// the control socket itself (small sends from host memory), so the message
// is one write and one segment instead of a frame plus a piece on a data
// socket.
enum FrameType : uint32_t { kFrameCts = 1, kFrameData = 2, kFrameDataInline = 3 };
// The most payload bytes a receiver accepts inline, whatever the sender's
// PODLINK_NCCL_TCP_INLINE says.
constexpr uint64_t kMaxInlinePayload = 64 << 10;

struct Frame {  // TCP control messages
  uint32_t type;
  uint32_t index;  // data: which buffer of the grouped receive
  uint64_t seq;
  uint32_t n;
  uint32_t pad;
  int32_t tags[kMaxRecvs];
  uint64_t sizes[kMaxRecvs];  // cts: room per buffer; data: sizes[0] = bytes that follow (or kSizeError)
};
static_assert(sizeof(Frame) == 120);

// The podlink transport's shared control region (receiver creates it).
//
// Why this is not the relay ring's queue (common/relay_ring.h): the ring's
// SQ/CQ/NQ are head/tail queues of independent entries, each consumed once
// in order, with back-pressure through the consumer's head. These slots are
// addressed by NCCL's request sequence number instead: NCCL already bounds
// the requests in flight (32 < kSlots), so no head is needed; a clear-to-send
// slot is published once (`ready` = seq + 1), but a done slot is rewritten
// as the buffers of a grouped receive complete one by one (a mask in
// `state`), which a queue entry cannot express. Both keep the same rules:
// the writer fills an entry, then publishes it with a release store; the
// reader acquires, copies the entry once and checks it (the peer is not
// trusted).
// The mesh transport's control messages, on the control socket.
enum MeshFrameType : uint32_t { kMeshCts = 1, kMeshDone = 2 };
struct MeshFrame {
  uint32_t type;
  uint32_t index;  // done: which buffer of the grouped receive
  uint64_t seq;
  uint32_t n;  // cts: buffers
  uint32_t pad;
  int32_t tags[kMaxRecvs];
  uint64_t sizes[kMaxRecvs];    // cts: room per buffer; done: sizes[0] = bytes written (or kSizeError)
  uint64_t exports[kMaxRecvs];  // cts: the receiver's export each buffer lies in
  uint64_t offsets[kMaxRecvs];  // cts: where in it
};
static_assert(sizeof(MeshFrame) == 248);

// The first message a mesh receiver sends: its node, as a region descriptor
// without an export ("podlink2;..."; TransferEngine::RegionDescriptor).
constexpr uint32_t kMeshNodeMagic = 0x45444f4e;  // "NODE"
struct MeshNode {
  uint32_t magic;
  uint32_t len;
  char text[1016];
};
static_assert(sizeof(MeshNode) == 1024);

struct alignas(64) CtsSlot {
  std::atomic<uint64_t> ready;  // seq + 1 once the entry is complete
  uint32_t n;
  uint32_t pad;
  int32_t tags[kMaxRecvs];
  uint64_t sizes[kMaxRecvs];
  uint64_t region[kMaxRecvs];  // export id the bytes must land in
  uint64_t offset[kMaxRecvs];
};
struct alignas(64) DoneSlot {
  std::atomic<uint64_t> state;  // (seq << 8) | mask of completed buffers
  uint64_t sizes[kMaxRecvs];
};
struct CtrlRegion {
  uint32_t magic;
  uint32_t version;
  char pad[56];
  CtsSlot cts[kSlots];
  DoneSlot done[kSlots];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

inline uint64_t DoneState(uint64_t seq, uint32_t mask) { return (seq << 8) | mask; }

}  // namespace podlink::ncclnet
