#include "common/relay_ring.h"

#include "absl/strings/str_cat.h"

namespace podlink {
namespace {
bool PowerOfTwoInRange(uint32_t n) { return n >= 2 && n <= kMaxRingEntries && (n & (n - 1)) == 0; }
size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }
}  // namespace

absl::StatusOr<RingLayout> RingLayout::Make(uint32_t sq, uint32_t cq, uint32_t nq, uint32_t message_slots) {
  if (!PowerOfTwoInRange(sq) || !PowerOfTwoInRange(cq) || !PowerOfTwoInRange(nq)) {
    return absl::InvalidArgumentError(absl::StrCat("ring sizes must be powers of two in [2, ", kMaxRingEntries,
                                                   "]: sq=", sq, " cq=", cq, " nq=", nq));
  }
  if (cq < sq) return absl::InvalidArgumentError("ring needs cq_entries >= sq_entries");
  if (message_slots > kMaxRingMessageSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ring has at most ", kMaxRingMessageSlots, " message slots, not ", message_slots));
  }
  RingLayout l;
  l.sq_entries = sq;
  l.cq_entries = cq;
  l.nq_entries = nq;
  l.sq_offset = sizeof(RingHeader);
  l.cq_offset = RoundUp(l.sq_offset + size_t{sq} * sizeof(RelaySqe), 64);
  l.nq_offset = RoundUp(l.cq_offset + size_t{cq} * sizeof(RelayCqe), 64);
  l.total = RoundUp(l.nq_offset + size_t{nq} * sizeof(RelayNqe), 4096);
  if (message_slots != 0) {
    l.message_slots = message_slots;
    l.in_offset = l.total;
    l.out_offset = l.in_offset + size_t{nq} * kRingMessageBytes;
    l.total = l.out_offset + size_t{message_slots} * kRingMessageBytes;
  }
  return l;
}

}  // namespace podlink
