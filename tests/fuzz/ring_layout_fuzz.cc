// Fuzzes the relay ring's layout (common/relay_ring.h, RingLayout::Make): the
// queue sizes come from the client's CreateRelayRing request, and the daemon
// maps and indexes the client's memfd by the layout they give.
//
// Input: for each of sq, cq, nq one selector byte, then (when its bit 7 is
// set) four raw bytes of the value. Without bit 7 the value is
// 2^(bits 0-4), plus 1 (bit 5) or minus 1 (bit 6), so powers of two and their
// neighbours are common.
//
// Make must accept exactly the sizes that are powers of two in
// [2, kMaxRingEntries] with cq >= sq, and an accepted layout must be sane:
// queues after the header, 64-byte aligned, in order, not overlapping, and
// inside `total`, all computed without overflow. Violations abort.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/relay_ring.h"

#include "tests/fuzz/fuzz_check.h"

namespace podlink {
namespace {

uint32_t NextValue(const uint8_t*& data, size_t& size) {
  if (size == 0) return 0;
  const uint8_t sel = *data++;
  --size;
  if (sel & 0x80) {
    uint32_t v = 0;
    size_t n = size < sizeof(v) ? size : sizeof(v);
    std::memcpy(&v, data, n);  // little-endian host; a short tail leaves high bytes 0
    data += n;
    size -= n;
    return v;
  }
  uint32_t v = uint32_t{1} << (sel & 31);
  if (sel & 0x20) ++v;
  if (sel & 0x40) --v;
  return v;
}

bool ValidEntries(uint32_t n) { return n >= 2 && n <= kMaxRingEntries && (n & (n - 1)) == 0; }

// Checks that [offset, offset + entries * entry_size) lies in [lo, hi), with
// the arithmetic done in 128 bits so an overflow in Make cannot hide.
void CheckQueue(const char* name, size_t offset, uint32_t entries, size_t entry_size, size_t lo, size_t hi) {
  using u128 = unsigned __int128;
  const u128 end = static_cast<u128>(offset) + static_cast<u128>(entries) * entry_size;
  FUZZ_CHECK(offset % 64 == 0, "%s offset %zu is not 64-byte aligned", name, offset);
  FUZZ_CHECK(offset >= lo && end <= hi, "%s [%zu, +%u*%zu) is outside [%zu, %zu)", name, offset, entries, entry_size,
             lo, hi);
}

}  // namespace
}  // namespace podlink

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace podlink;
  const uint32_t sq = NextValue(data, size);
  const uint32_t cq = NextValue(data, size);
  const uint32_t nq = NextValue(data, size);
  absl::StatusOr<RingLayout> l = RingLayout::Make(sq, cq, nq);
  const bool valid = ValidEntries(sq) && ValidEntries(cq) && ValidEntries(nq) && cq >= sq;
  FUZZ_CHECK(l.ok() == valid, "sq=%u cq=%u nq=%u: %s", sq, cq, nq,
             l.ok() ? "accepted" : l.status().ToString().c_str());
  if (!l.ok()) {
    FUZZ_CHECK(l.status().code() == absl::StatusCode::kInvalidArgument, "sq=%u cq=%u nq=%u refused with %s", sq, cq,
               nq, l.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(l->sq_entries == sq && l->cq_entries == cq && l->nq_entries == nq, "entries changed: %u %u %u",
             l->sq_entries, l->cq_entries, l->nq_entries);
  FUZZ_CHECK(l->sq_offset < l->cq_offset && l->cq_offset < l->nq_offset && l->nq_offset < l->total,
             "offsets not increasing: %zu %zu %zu total %zu", l->sq_offset, l->cq_offset, l->nq_offset, l->total);
  CheckQueue("sq", l->sq_offset, sq, sizeof(RelaySqe), sizeof(RingHeader), l->cq_offset);
  CheckQueue("cq", l->cq_offset, cq, sizeof(RelayCqe), l->sq_offset, l->nq_offset);
  CheckQueue("nq", l->nq_offset, nq, sizeof(RelayNqe), l->cq_offset, l->total);
  return 0;
}
