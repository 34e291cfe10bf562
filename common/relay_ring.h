// The relay ring: a per-session shared-memory region (a sealed memfd the
// client creates and hands to podlinkd) with three single-producer /
// single-consumer queues, so transfers need no gRPC call each:
//
//   SQ  client -> daemon  transfer requests (RelaySqe)
//   CQ  daemon -> client  completions, one per SQE (RelayCqe)
//   NQ  daemon -> client  notifications other sessions sent to this
//                         session's exports (RelayNqe)
//
// Version 2 rings add two message areas, so a notification can carry bytes
// (up to kRingMessageBytes; NIXL's notifications are byte strings):
//
//   OUT  client -> daemon  message_slots slots of kRingMessageBytes: the
//                          bytes of a kNotifyMessage request, copied out by
//                          the daemon when it takes the request; the slot is
//                          the client's again once the request's completion
//                          arrives
//   IN   daemon -> client  one slot of kRingMessageBytes per NQ entry: the
//                          bytes of the notification in the NQ entry of the
//                          same index
//
// Indices are free-running uint32 counters; slot = index & (entries - 1).
// (The NCCL plugin's control region uses sequence-addressed slots instead of
// these queues; client-lib/nccl/wire.h says why.)
// The daemon treats the whole region as hostile: it copies each SQE out once
// before validating it, checks every index it reads against the queue size,
// and stops serving a ring whose indices make no sense.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace podlink {

inline constexpr uint32_t kRingMagic = 0x474e4952;  // "RING"
inline constexpr uint32_t kRingVersion = 1;          // no message areas
inline constexpr uint32_t kRingVersionMessages = 2;  // with them
inline constexpr uint32_t kMaxRingEntries = 1 << 16;
// The most bytes one notification carries, and the most OUT slots a ring has.
inline constexpr uint32_t kRingMessageBytes = 4096;
inline constexpr uint32_t kMaxRingMessageSlots = 1024;

enum class RelayOp : uint32_t {
  kWrite = 1,   // local region -> remote region
  kRead = 2,    // remote region -> local region
  kNotify = 3,  // after every earlier op of this ring is done, tell the remote export's owner
  // kNotify with bytes (version 2 rings): remote_offset is the value,
  // local_offset the OUT slot and length the message's size (at most
  // kRingMessageBytes).
  kNotifyMessage = 4,
};

struct RelaySqe {
  uint64_t user_data;
  uint32_t opcode;  // RelayOp
  uint32_t flags;   // must be 0
  uint64_t local_export;
  uint64_t local_offset;
  uint64_t remote_export;
  uint64_t remote_offset;
  uint64_t length;  // bytes; for kNotify the value delivered
  uint64_t reserved;
};
static_assert(sizeof(RelaySqe) == 64);

struct RelayCqe {
  uint64_t user_data;
  int32_t status;  // absl::StatusCode
  uint32_t reserved;
};
static_assert(sizeof(RelayCqe) == 16);

struct RelayNqe {
  uint64_t export_id;     // the receiving session's export the sender named
  uint64_t value;
  uint64_t from_session;
  // 0: a value alone. kNqeHasMessage | n: the entry's IN slot holds n bytes.
  uint64_t message;
};
inline constexpr uint64_t kNqeHasMessage = uint64_t{1} << 63;
static_assert(sizeof(RelayNqe) == 32);

struct alignas(64) RingIndex {
  std::atomic<uint32_t> value;
  char pad[60];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct RingHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t sq_entries;
  uint32_t cq_entries;
  uint32_t nq_entries;
  uint32_t pad[11];
  RingIndex sq_tail;  // written by the client
  RingIndex sq_head;  // written by the daemon
  RingIndex cq_tail;  // written by the daemon
  RingIndex cq_head;  // written by the client
  RingIndex nq_tail;  // written by the daemon
  RingIndex nq_head;  // written by the client
  RingIndex daemon_idle;  // 1 while the daemon sleeps: the client then writes the doorbell eventfd
  RingIndex daemon_status;  // 0 while served; an absl::StatusCode once the daemon stopped serving the ring
};
static_assert(sizeof(RingHeader) == 64 * 9);

struct RingLayout {
  uint32_t sq_entries = 0, cq_entries = 0, nq_entries = 0;
  uint32_t message_slots = 0;  // OUT slots; 0: a version 1 ring (no message areas)
  size_t sq_offset = 0, cq_offset = 0, nq_offset = 0, total = 0;
  size_t in_offset = 0, out_offset = 0;  // the message areas (version 2)

  // Entries must be powers of two in [2, kMaxRingEntries], and cq >= sq so a
  // completion always has room; message_slots at most kMaxRingMessageSlots.
  static absl::StatusOr<RingLayout> Make(uint32_t sq, uint32_t cq, uint32_t nq, uint32_t message_slots = 0);
  uint32_t version() const { return message_slots == 0 ? kRingVersion : kRingVersionMessages; }
};

}  // namespace podlink
