// Sealed routes: what crosses relays is protected end to end (docs/design/mesh.md §8.1).
//
// A relay re-slices what it forwards and holds a grant of its own, so a tag
// per frame would not survive the hop, and any byte it could write into the
// export would land. A sealed grant therefore never lets a frame touch the
// export: the grant's address space is a window of slots held by the owner,
// and every operation of the importer is one unit through one slot:
//
//   slot s (of kSlots), at s * kSlotStride:
//     [0, 512)          receipt   written by the owner, read by the importer
//     [512, 1024)       request   written by the importer
//     [1024, +1 MiB)    data      write: the importer's ciphertext; read: the owner's
//
//   write:  WRITE request + ciphertext  ->  READ receipt
//   read:   WRITE request               ->  READ receipt + request + ciphertext
//   notify: WRITE request               ->  READ receipt
//
// The request's header (kind, sequence number, export offset, length) is
// authenticated, and so is every 64 KiB record of the data, under the
// importer's key with the nonce (sequence number, record); the owner acts on a
// request only when all of it verifies — it decrypts a write out of the
// window into memory of its own and copies only verified plaintext into the
// export; the window (which the grant addresses) never holds plaintext — and answers with a
// receipt (the status, authenticated under the owner's key) and, for a read,
// records sealed under its key. The first read of a slot after a new request
// makes the owner act; every later read of it gets the same bytes. Sequence
// numbers grow per grant and slot s takes only those equal to s modulo
// kSlots, each once: a replayed request or record is refused, and neither
// side ever seals twice under one nonce. A relay that alters, drops, replays
// or makes up bytes makes the operation fail (DATA_LOSS, or the receipt never
// verifying); it can never make bytes land that the importer did not send,
// nor hand the importer bytes the owner did not read, nor learn what either sent.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/mesh/links/links.h"
#include "daemon/mesh/links/node_shares.h"
#include "daemon/mesh/seal/seal_crypto.h"

namespace podlink::mesh::seal {

inline constexpr uint64_t kRecordBytes = 64 << 10;
inline constexpr uint64_t kSlotDataBytes = 1 << 20;
inline constexpr uint32_t kRecordsPerSlot = kSlotDataBytes / kRecordBytes;  // 16
inline constexpr uint32_t kSlots = 16;
inline constexpr uint64_t kReceiptBytes = 512;
inline constexpr uint64_t kRequestBytes = 512;
inline constexpr uint64_t kDataAt = kReceiptBytes + kRequestBytes;
inline constexpr uint64_t kSlotStride = kDataAt + kSlotDataBytes;
inline constexpr uint64_t kWindowBytes = kSlots * kSlotStride;
inline constexpr size_t kMaxReceiptMessage = 208;

enum class Kind : uint8_t { kWrite = 1, kRead = 2, kNotify = 3 };

// The authenticated part of a request: 32 bytes, little-endian.
struct RequestHeader {
  Kind kind = Kind::kWrite;
  uint64_t seq = 0;
  uint64_t offset = 0;  // in the export; kNotify: the value
  uint64_t length = 0;  // kNotify: 0
  std::string Encode() const;
  static bool Decode(const char* p, RequestHeader* out);
};

// What the owner does with a request that verified: the export's bytes
// (ranges not checked yet) and its owner's notification queue.
class Lander {
 public:
  virtual ~Lander() = default;
  virtual absl::Status CopyIn(uint64_t offset, const char* src, uint64_t n) = 0;
  virtual absl::Status CopyOut(uint64_t offset, char* dst, uint64_t n) = 0;
  virtual absl::Status Notify(uint64_t value) = 0;
};

// Counters of one engine's sealed grants (owner side).
struct SealCounters {
  std::atomic<uint64_t> units{0};           // requests that verified and were acted on
  std::atomic<uint64_t> refused{0};         // requests or records that did not verify, or were replays
  std::atomic<uint64_t> bytes_landed{0};    // verified write bytes copied into exports
  std::atomic<uint64_t> bytes_sealed{0};    // read bytes sealed for importers
};

// The owner's side of one sealed grant: the window. Thread-safe (a lock per
// slot, held while a request is acted on: the lander's locks come after it).
class SealedRegion {
 public:
  // `node`: the peer node the grant was given; a slot's memory (kSlotStride)
  // is taken from `budget` (its share) when first written, and given back
  // with the region.
  SealedRegion(SealKeys keys, uint64_t export_size, std::string node, NodeShares* budget, SealCounters* counters);
  ~SealedRegion();
  SealedRegion(const SealedRegion&) = delete;
  SealedRegion& operator=(const SealedRegion&) = delete;

  // A frame's write into the window: the request and data areas of one slot
  // (the receipt is the owner's to write). RESOURCE_EXHAUSTED when the budget
  // has no room for the slot.
  absl::Status Write(uint64_t offset, const char* src, uint64_t n);
  // A frame's read of the window: a slot's first read after a new request
  // acts on it (through `lander`), then its bytes are copied out.
  absl::Status Read(uint64_t offset, char* dst, uint64_t n, Lander& lander);

 private:
  struct Slot {
    absl::Mutex mu;
    std::unique_ptr<char[]> bytes ABSL_GUARDED_BY(mu);  // kSlotStride, once written
    uint64_t last_seq ABSL_GUARDED_BY(mu) = 0;          // the last request acted on
  };
  absl::StatusOr<Slot*> SlotOf(uint64_t offset, uint64_t n, uint64_t* at) const;
  // With the slot's lock: acts on its request when it is new and verifies.
  void Act(Slot& s, uint32_t index, Lander& lander) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  void WriteReceipt(Slot& s, uint64_t seq, const absl::Status& st, const std::vector<Tag>& tags)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

  const SealKeys keys_;
  const uint64_t export_size_;
  const std::string node_;
  NodeShares* const budget_;
  SealCounters* const counters_;
  std::array<Slot, kSlots> slots_;
  std::atomic<uint64_t> allocated_{0};  // slots whose memory the budget gave
};

// The importer's side of one sealed grant, in front of the link set that
// carries it: whole operations on the export in, units through the window
// out. Completions of the carrier's link threads are taken off them by
// `defer` (which returns false once it runs nothing any more: the work then
// runs where it is).
class SealedLinks : public DataLinks, public std::enable_shared_from_this<SealedLinks> {
 public:
  using Carrier = std::function<std::shared_ptr<DataLinks>()>;
  using Defer = std::function<bool(std::function<void()>)>;
  SealedLinks(SealKeys keys, uint64_t grant, uint64_t export_size, Carrier carrier, Defer defer);
  ~SealedLinks() override;  // the keys wiped

  const char* transport() const override { return "sealed"; }
  uint64_t instance() const override;
  // `op` addresses the export ([offset, offset + length) within it; kNotify:
  // the value); its grant is ignored (the carrier's grant is this one's).
  absl::Status Submit(LinkOp op) override;
  size_t live() const override;
  LinkStats Stats() const override;
  std::vector<std::tuple<std::string, bool, uint64_t>> Connections() const override;

  // Units waiting for a slot or in flight (tests).
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Op;
  struct Unit;
  void Pump() ABSL_LOCKS_EXCLUDED(mu_);
  void Send(std::shared_ptr<Unit> u);
  // Submits one frame of unit `u` (at `at` in its slot, from or into its
  // buffer); `next` runs off the carrier's thread with its result.
  void Step(std::shared_ptr<Unit> u, FrameType type, uint64_t at, uint64_t length,
            void (SealedLinks::*next)(std::shared_ptr<Unit>, const absl::Status&));
  void Sent(std::shared_ptr<Unit> u, const absl::Status& st);
  void Answered(std::shared_ptr<Unit> u, const absl::Status& st);
  void Finish(std::shared_ptr<Unit> u, const absl::Status& st);
  void Later(std::function<void()> task);
  absl::Status SubmitToCarrier(LinkOp op);

  const SealKeys keys_;
  const uint64_t grant_;
  const uint64_t export_size_;
  const Carrier carrier_;
  const Defer defer_;
  mutable absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::array<bool, kSlots> busy_ ABSL_GUARDED_BY(mu_) = {};
  std::deque<std::shared_ptr<Unit>> waiting_ ABSL_GUARDED_BY(mu_);
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace podlink::mesh::seal
