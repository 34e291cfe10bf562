// Fuzzes the relay (daemon/relay/relay_engine.h, RelayEngine) through the
// one thing a client controls once its ring is open: the shared ring
// (common/relay_ring.h). Each input gets a fresh engine (one worker, no CUDA)
// serving two rings, wired as Broker::OpenRelay wires them (a sealed memfd
// adopted with HostMemfdBackend, a doorbell eventfd): the client's own
// (session 1), which the input drives, and an honest peer's (session 2),
// which only receives notifications. The resolver knows four exports, sealed
// and fully allocated host memfds like the ones Broker::Export accepts:
//
//   id 1 (16 KiB), id 2 (4 KiB)  owned by session 1
//   id 4 (8 KiB)                 owned by session 2, imported by session 1
//   id 3 (4 KiB)                 foreign: owned by session 3, never imported
//                                (PERMISSION_DENIED), filled with a poison
//                                pattern that is checked after every input
//   any other id                 NOT_FOUND
//
// Input (every part may be cut short; missing bytes read as 0):
//
//   byte 0   ring: bits 0-1 sq = 2 << n; bit 2 cq = 2 * sq (else sq);
//            bit 3 nq = 4 (else 2); bit 4 corrupt the header's magic first
//            (AddRing must refuse it, then accept the repaired ring);
//            bits 5-6 starting indices in the header: 0 all 0, 1 all 4 short
//            of the 2^32 wrap, 2 the daemon's cq_tail and nq_tail far from the
//            client's heads, 3 sq_head ahead of sq_tail
//   actions  at most kMaxActions; one byte each (action = byte % kActions),
//            then its operands:
//     PUSH sqe      write the next SQE at the client's tail (skipped, as an
//                   honest client would wait, while the SQ is full)
//     PUBLISH       store sq_tail; ring the doorbell if the daemon sleeps
//     BUMP d        store a nonsense sq_tail: off by a little, by the ring
//                   size, or 4 raw bytes
//     REWRITE k sqe overwrite SQ slot k, consumed or not
//     CQ_HEAD       consume every posted CQE (what an honest client does)
//     CQ_GARBAGE d  store a cq_head no honest client would (ahead of cq_tail,
//                   behind the last one, or 4 raw bytes)
//     NQ_HEAD, NQ_GARBAGE d   the same for the notification queue
//     DOORBELL      write the doorbell
//     DRAIN         read the doorbell empty (the daemon must not care)
//     SETTLE        let the daemon catch up (a bounded wait)
//     PUNCH p       punch a page out of export 1 or 4: later copies touching
//                   it must fail rather than allocate
//   sqe      a: bits 0-1 opcode (write, read, notify, or a raw byte that
//            follows), bit 2 flags = 1, bit 3 reserved = 1, bits 4-6 local
//            export; b: bits 0-2 remote export (ids 1, 2, 4, 3, 0, 5, 2^64-1,
//            1); then one selector byte each for the local offset, the remote
//            offset and the length (see Pick: 0, small, around the export's
//            end, near 2^64 so that offset + length overflows, 2^32..2^63, or
//            8 raw bytes that follow).
//
// After the actions the harness behaves (consumes completions and
// notifications while it has been honest about them, rings the doorbell
// whenever the daemon sleeps) until the ring is final: broken (daemon_status
// DATA_LOSS), or every SQE the daemon took completed and it may take no more
// (the SQ is empty or the CQ full). A correct daemon gets there within
// milliseconds; one that has not after kHardTimeout is reported as stuck.
// Then both rings are removed and the engine stopped; violations of these
// abort:
//
//   always   daemon_status is DATA_LOSS if the ring broke, else UNAVAILABLE
//            (set by the removal), and the peer's is UNAVAILABLE; the
//            daemon never wrote what the client owns (header magic, version
//            and sizes, sq_tail, cq_head, nq_head, the SQ); every CQE in the
//            queue has a valid absl::StatusCode, reserved 0 and a user_data
//            the client wrote; every NQE names an export of the ring's session
//            and comes from session 1; the peer's NQ, never consumed, holds at
//            most nq_entries; the foreign export is unchanged; no descriptor
//            leaks
//   while cq_head was honest: cq_tail - cq_head <= cq_entries (same for NQ)
//   while the SQ and cq_head were honest and the ring was served to the end:
//            every SQE taken completed exactly once; a completion is OK iff
//            the request is valid (flags and reserved 0, a known opcode,
//            exports the session may use, length > 0, both ranges inside
//            their exports with no overflow, no overlap within one export;
//            a valid notification may also find the queue full); a
//            notification completes after every earlier request; with
//            nothing punched, the exports hold exactly what the OK copies,
//            applied in order, make of them; and while nq_head was honest each
//            receiving NQ holds exactly the OK notifications, in order.
#include <dirent.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/relay_ring.h"
#include "common/unique_fd.h"
#include "daemon/gpu/gpu_inventory.h"
#include "daemon/gpu/host_backend.h"
#include "daemon/registry/registry.h"
#include "daemon/relay/relay_engine.h"
#include "spdlog/spdlog.h"

#include "tests/fuzz/fuzz_check.h"

namespace podlink {
namespace {

constexpr uint64_t kSelf = 1, kPeer = 2, kStranger = 3;
constexpr uint64_t kForeignId = 3;
constexpr size_t kMaxActions = 64;
constexpr auto kHardTimeout = std::chrono::seconds(3);
constexpr uint64_t kExportChoices[8] = {1, 2, 4, 3, 0, 5, ~uint64_t{0}, 1};
constexpr uint8_t kPoison = 0xa5;

enum Action : uint8_t {
  kPush,
  kPublish,
  kBump,
  kRewrite,
  kCqHead,
  kCqGarbage,
  kNqHead,
  kNqGarbage,
  kDoorbell,
  kDrain,
  kSettle,
  kPunch,
  kActions
};

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return size_ == 0; }
  uint8_t Byte() {
    if (size_ == 0) return 0;
    --size_;
    return *data_++;
  }
  uint64_t Raw(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{Byte()} << (8 * i);
    return v;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

void Pause() {
  timespec ts{0, 20 * 1000};
  ::nanosleep(&ts, nullptr);
}

// A memfd as libpodlink makes one: fully allocated, then sealed against
// shrinking, growing and further sealing.
UniqueFd SealedMemfd(uint64_t size, const char* name) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  FUZZ_CHECK(fd.valid(), "memfd_create: %s", std::strerror(errno));
  int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size));
  FUZZ_CHECK(err == 0, "posix_fallocate: %s", std::strerror(err));
  FUZZ_CHECK(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0, "seal: %s",
             std::strerror(errno));
  return fd;
}

uint8_t* MapShared(int fd, uint64_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  FUZZ_CHECK(p != MAP_FAILED, "mmap: %s", std::strerror(errno));
  return static_cast<uint8_t*>(p);
}

// The daemon's side of a descriptor the client handed over: a duplicate,
// validated by HostMemfdBackend as Broker::Export and Broker::OpenRelay do.
std::shared_ptr<MemoryObject> Adopt(int fd, uint64_t size) {
  UniqueFd dup(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  FUZZ_CHECK(dup.valid(), "dup: %s", std::strerror(errno));
  absl::StatusOr<std::shared_ptr<MemoryObject>> m =
      HostMemfdBackend().Adopt({size, "", HandleKind::kHostMemfd}, std::move(dup), "");
  FUZZ_CHECK(m.ok(), "HostMemfdBackend refused a sealed, allocated memfd: %s", m.status().ToString().c_str());
  return *std::move(m);
}

// --- exports ---------------------------------------------------------------

struct Export {
  uint64_t id = 0, owner = 0, importer = 0, size = 0;
  UniqueFd fd;               // the client's descriptor
  uint8_t* bytes = nullptr;  // the client's mapping
  std::shared_ptr<const ExportRecord> record;
};

// Made once (a few memfds for the whole run); never freed.
std::vector<Export>& Exports() {
  static std::vector<Export>* all = [] {
    auto* v = new std::vector<Export>();
    const struct {
      uint64_t id, owner, importer, size;
    } specs[] = {{1, kSelf, 0, 16384}, {2, kSelf, 0, 4096}, {4, kPeer, kSelf, 8192}, {kForeignId, kStranger, 0, 4096}};
    for (const auto& s : specs) {
      Export e;
      e.id = s.id;
      e.owner = s.owner;
      e.importer = s.importer;
      e.size = s.size;
      e.fd = SealedMemfd(s.size, "podlink-fuzz-export");
      e.bytes = MapShared(e.fd.get(), s.size);
      ExportRecord rec;
      rec.id = s.id;
      rec.name = "export-" + std::to_string(s.id);
      rec.size = s.size;
      rec.kind = HandleKind::kHostMemfd;
      rec.owner_session = s.owner;
      rec.memory = Adopt(e.fd.get(), s.size);
      e.record = std::make_shared<const ExportRecord>(std::move(rec));
      if (s.id == kForeignId) std::memset(e.bytes, kPoison, s.size);
      v->push_back(std::move(e));
    }
    return v;
  }();
  return *all;
}

Export* FindExport(uint64_t id) {
  for (Export& e : Exports()) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

// Registry::GetUsable's rule: the owner, or a session that imported it.
bool Usable(uint64_t session, uint64_t id) {
  const Export* e = FindExport(id);
  return e != nullptr && (e->owner == session || e->importer == session);
}

absl::StatusOr<std::shared_ptr<const ExportRecord>> Resolve(uint64_t session, uint64_t id) {
  const Export* e = FindExport(id);
  if (e == nullptr) return absl::NotFoundError("no such export");
  if (!Usable(session, id)) return absl::PermissionDeniedError("neither this session's nor imported by it");
  return e->record;
}

uint64_t SizeOf(uint64_t id) {
  const Export* e = FindExport(id);
  return e != nullptr ? e->size : 4096;
}

// The starting contents of the client's exports (not the foreign one).
uint8_t Pattern(uint64_t id, uint64_t i) { return static_cast<uint8_t>(i * 13 + id * 101); }

// --- requests --------------------------------------------------------------

// An offset or length for an export of `size` bytes.
uint64_t Pick(Input& in, uint8_t sel, uint64_t size) {
  const uint64_t k = sel >> 3;
  switch (sel & 7) {
    case 0:
      return 0;
    case 1:
      return k * 64;
    case 2:
      return size - k;  // wraps past 0 for k > size: another huge value
    case 3:
      return size + k;
    case 4:
      return size / 2 + k;
    case 5:
      return ~uint64_t{0} - k;
    case 6:
      return uint64_t{1} << (32 + k);
    default:
      return in.Raw(8);
  }
}

RelaySqe DecodeSqe(Input& in, uint64_t tag) {
  const uint8_t a = in.Byte();
  const uint8_t b = in.Byte();
  RelaySqe e{};
  e.user_data = tag;
  constexpr RelayOp kOps[3] = {RelayOp::kWrite, RelayOp::kRead, RelayOp::kNotify};
  e.opcode = (a & 3) == 3 ? in.Byte() : static_cast<uint32_t>(kOps[a & 3]);
  e.flags = (a >> 2) & 1;
  e.reserved = (a >> 3) & 1;
  e.local_export = kExportChoices[(a >> 4) & 7];
  e.remote_export = kExportChoices[b & 7];
  e.local_offset = Pick(in, in.Byte(), SizeOf(e.local_export));
  e.remote_offset = Pick(in, in.Byte(), SizeOf(e.remote_export));
  e.length = Pick(in, in.Byte(), std::min(SizeOf(e.local_export), SizeOf(e.remote_export)));
  return e;
}

bool IsCopy(const RelaySqe& e) {
  return e.opcode == static_cast<uint32_t>(RelayOp::kWrite) || e.opcode == static_cast<uint32_t>(RelayOp::kRead);
}
bool IsNotify(const RelaySqe& e) { return e.opcode == static_cast<uint32_t>(RelayOp::kNotify); }

// Whether the relay must carry out the request from session 1 (a valid
// notification may still meet a full queue).
bool Valid(const RelaySqe& e) {
  if (e.flags != 0 || e.reserved != 0) return false;
  if (IsNotify(e)) return Usable(kSelf, e.remote_export);
  if (!IsCopy(e)) return false;
  if (!Usable(kSelf, e.local_export) || !Usable(kSelf, e.remote_export) || e.length == 0) return false;
  auto inside = [&](uint64_t off, uint64_t size) { return off <= size && e.length <= size - off; };
  if (!inside(e.local_offset, SizeOf(e.local_export)) || !inside(e.remote_offset, SizeOf(e.remote_export))) {
    return false;
  }
  if (e.local_export == e.remote_export) {  // one mapping: the ranges must not overlap
    const uint64_t gap =
        e.local_offset > e.remote_offset ? e.local_offset - e.remote_offset : e.remote_offset - e.local_offset;
    if (gap < e.length) return false;
  }
  return true;
}

// --- rings -----------------------------------------------------------------

// The client's side of a ring, made as client-lib/engine/transfer.cc makes it.
struct ClientRing {
  RingLayout layout;
  UniqueFd fd, bell;
  uint8_t* base = nullptr;
  RingHeader* hdr = nullptr;
  RelaySqe* sq = nullptr;
  RelayCqe* cq = nullptr;
  RelayNqe* nq = nullptr;

  ClientRing(uint32_t sq_entries, uint32_t cq_entries, uint32_t nq_entries) {
    absl::StatusOr<RingLayout> l = RingLayout::Make(sq_entries, cq_entries, nq_entries);
    FUZZ_CHECK(l.ok(), "RingLayout::Make(%u, %u, %u): %s", sq_entries, cq_entries, nq_entries,
               l.status().ToString().c_str());
    layout = *l;
    fd = SealedMemfd(layout.total, "podlink-fuzz-ring");
    base = MapShared(fd.get(), layout.total);
    hdr = reinterpret_cast<RingHeader*>(base);
    hdr->magic = kRingMagic;
    hdr->version = kRingVersion;
    hdr->sq_entries = sq_entries;
    hdr->cq_entries = cq_entries;
    hdr->nq_entries = nq_entries;
    sq = reinterpret_cast<RelaySqe*>(base + layout.sq_offset);
    cq = reinterpret_cast<RelayCqe*>(base + layout.cq_offset);
    nq = reinterpret_cast<RelayNqe*>(base + layout.nq_offset);
    bell.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    FUZZ_CHECK(bell.valid(), "eventfd: %s", std::strerror(errno));
  }
  ~ClientRing() { ::munmap(base, layout.total); }

  absl::Status Open(RelayEngine& engine, uint64_t session) {
    UniqueFd doorbell(::fcntl(bell.get(), F_DUPFD_CLOEXEC, 0));
    FUZZ_CHECK(doorbell.valid(), "dup: %s", std::strerror(errno));
    return engine.AddRing(session, Adopt(fd.get(), layout.total), layout, std::move(doorbell));
  }
  // What libpodlink's RingDoorbell does.
  void RingIfIdle() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (hdr->daemon_idle.value.load(std::memory_order_seq_cst) != 0) Ring();
  }
  void Ring() {
    uint64_t one = 1;
    (void)!::write(bell.get(), &one, sizeof(one));
  }
  uint32_t Load(const RingIndex& i) const { return i.value.load(std::memory_order_acquire); }
  void Store(RingIndex& i, uint32_t v) { i.value.store(v, std::memory_order_release); }
};

// What the client did to its ring, and what it saw.
struct Client {
  explicit Client(ClientRing& r) : ring(r), sq_shadow(r.layout.sq_entries) {}
  ClientRing& ring;
  uint32_t sq_base = 0, cq_base = 0, nq_base = 0;  // the daemon's starting indices
  uint32_t tail = 0, published = 0;                // next SQE to write; sq_tail as stored
  uint32_t cq_head = 0, cq_seen = 0, nq_head = 0, nq_seen = 0;
  bool sq_honest = true, cq_honest = true, nq_honest = true, punched = false;
  std::vector<RelaySqe> written;      // every SQE written, by user_data - 1
  std::vector<RelaySqe> sq_shadow;    // the SQ as the client last wrote it
  std::vector<RelayCqe> completions;  // every CQE, in order (while cq_honest)
  std::vector<RelayNqe> notes;        // every NQE, in order (while nq_honest)
  std::array<uint8_t, 64> header{};   // magic .. pad, as written

  uint32_t sq_entries() const { return ring.layout.sq_entries; }
  uint32_t cq_entries() const { return ring.layout.cq_entries; }
  uint32_t nq_entries() const { return ring.layout.nq_entries; }

  void WriteSlot(uint32_t index, const RelaySqe& e) {
    const uint32_t slot = index & (sq_entries() - 1);
    ring.sq[slot] = e;
    sq_shadow[slot] = e;
  }
  // Reads the CQEs (NQEs) posted since the last look, then hands their slots
  // back, as an honest client does.
  void ConsumeCq() {
    const uint32_t tail_now = ring.Load(ring.hdr->cq_tail);
    for (; cq_seen != tail_now; ++cq_seen) completions.push_back(ring.cq[cq_seen & (cq_entries() - 1)]);
    cq_head = tail_now;
    ring.Store(ring.hdr->cq_head, cq_head);
  }
  void ConsumeNq() {
    const uint32_t tail_now = ring.Load(ring.hdr->nq_tail);
    for (; nq_seen != tail_now; ++nq_seen) notes.push_back(ring.nq[nq_seen & (nq_entries() - 1)]);
    nq_head = tail_now;
    ring.Store(ring.hdr->nq_head, nq_head);
  }
};

// Starting indices: the daemon adopts sq_head, cq_tail and nq_tail from the
// header (AddRing); the client's own start where it says.
void SetStart(Client& c, int mode) {
  RingHeader* h = c.ring.hdr;
  uint32_t sq_head = 0, sq_tail = 0, cq_tail = 0, cq_head = 0, nq_tail = 0, nq_head = 0;
  switch (mode) {
    case 1:
      sq_head = sq_tail = cq_tail = cq_head = nq_tail = nq_head = 0xfffffffc;
      break;
    case 2:
      cq_tail = 0x80000000;
      nq_tail = 7;
      c.cq_honest = c.nq_honest = false;
      break;
    case 3:
      sq_head = 5;
      c.sq_honest = false;
      break;
  }
  h->sq_head.value.store(sq_head);
  h->sq_tail.value.store(sq_tail);
  h->cq_tail.value.store(cq_tail);
  h->cq_head.value.store(cq_head);
  h->nq_tail.value.store(nq_tail);
  h->nq_head.value.store(nq_head);
  c.sq_base = sq_head;
  c.cq_base = cq_tail;
  c.nq_base = nq_tail;
  c.tail = c.published = sq_tail;
  c.cq_head = cq_head;
  c.cq_seen = cq_tail;
  c.nq_head = nq_head;
  c.nq_seen = nq_tail;
}

// True once the daemon has nothing left to do on the ring (file comment);
// *broken when it stopped serving it.
bool Final(const Client& c, bool* broken) {
  const ClientRing& r = c.ring;
  *broken = r.Load(r.hdr->daemon_status) != 0;
  if (*broken) return true;
  const uint32_t sq_head = r.Load(r.hdr->sq_head);  // before cq_tail: its CQEs are posted first
  const uint32_t cq_tail = r.Load(r.hdr->cq_tail);
  if (cq_tail - c.cq_base != sq_head - c.sq_base) return false;  // completions outstanding
  const uint32_t avail = c.published - sq_head;
  if (avail == 0) return true;
  const uint32_t used = cq_tail - c.cq_head;
  if (avail > c.sq_entries() || used > c.cq_entries()) return false;  // it must break the ring
  // A full CQ: the daemon may take nothing more.
  return used == c.cq_entries();
}

// Until the daemon took everything published (or has nothing left it may
// do), at most a few milliseconds; nothing is checked.
void Settle(Client& c) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
  bool broken;
  while (std::chrono::steady_clock::now() < until) {
    if (Final(c, &broken) || c.ring.Load(c.ring.hdr->sq_head) == c.published) return;
    c.ring.RingIfIdle();
    Pause();
  }
}

void RunActions(Client& c, Input& in) {
  for (size_t n = 0; n < kMaxActions && !in.empty(); ++n) {
    RingHeader* h = c.ring.hdr;
    switch (in.Byte() % kActions) {
      case kPush: {
        RelaySqe e = DecodeSqe(in, c.written.size() + 1);
        if (c.tail - c.ring.Load(h->sq_head) >= c.sq_entries()) break;  // full: an honest client waits
        c.written.push_back(e);
        c.WriteSlot(c.tail++, e);
        break;
      }
      case kPublish:
        c.published = c.tail;
        c.ring.Store(h->sq_tail, c.published);
        c.ring.RingIfIdle();
        break;
      case kBump: {
        const uint8_t d = in.Byte();
        const uint32_t deltas[] = {1, 2, ~0u, ~1u, c.sq_entries(), c.sq_entries() + 1, 0u - c.sq_entries() - 1};
        c.published = (d & 7) == 7 ? static_cast<uint32_t>(in.Raw(4)) : c.published + deltas[d & 7];
        c.tail = c.published;
        c.ring.Store(h->sq_tail, c.published);
        c.sq_honest = false;
        break;
      }
      case kRewrite: {
        const uint8_t k = in.Byte();
        RelaySqe e = DecodeSqe(in, c.written.size() + 1);
        c.written.push_back(e);
        c.WriteSlot(k, e);
        c.sq_honest = false;
        break;
      }
      case kCqHead:
        if (c.cq_honest) {
          c.ConsumeCq();
        } else {  // the client lost track already: it only hands back what is posted
          c.cq_head = c.ring.Load(h->cq_tail);
          c.ring.Store(h->cq_head, c.cq_head);
        }
        break;
      case kCqGarbage: {
        const uint8_t d = in.Byte();
        const uint32_t cq_tail = c.ring.Load(h->cq_tail);
        const uint32_t values[] = {cq_tail + 1, cq_tail + c.cq_entries(), c.cq_head - 1,
                                   c.cq_head - c.cq_entries() - 1};
        c.cq_head = (d & 4) ? static_cast<uint32_t>(in.Raw(4)) : values[d & 3];
        c.ring.Store(h->cq_head, c.cq_head);
        c.cq_honest = false;
        break;
      }
      case kNqHead:
        if (c.nq_honest) {
          c.ConsumeNq();
        } else {
          c.nq_head = c.ring.Load(h->nq_tail);
          c.ring.Store(h->nq_head, c.nq_head);
        }
        break;
      case kNqGarbage: {
        const uint8_t d = in.Byte();
        const uint32_t nq_tail = c.ring.Load(h->nq_tail);
        const uint32_t values[] = {nq_tail + 1, nq_tail + c.nq_entries(), c.nq_head - 1,
                                   c.nq_head - c.nq_entries() - 1};
        c.nq_head = (d & 4) ? static_cast<uint32_t>(in.Raw(4)) : values[d & 3];
        c.ring.Store(h->nq_head, c.nq_head);
        c.nq_honest = false;
        break;
      }
      case kDoorbell:
        c.ring.Ring();
        break;
      case kDrain: {
        uint64_t v;
        (void)!::read(c.ring.bell.get(), &v, sizeof(v));
        break;
      }
      case kSettle:
        Settle(c);
        break;
      case kPunch: {
        const uint8_t p = in.Byte();
        Export* e = FindExport(p & 1 ? 4 : 1);
        const off_t page = static_cast<off_t>((p >> 1) % (e->size / 4096)) * 4096;
        FUZZ_CHECK(::fallocate(e->fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, page, 4096) == 0, "punch: %s",
                   std::strerror(errno));
        c.punched = true;
        break;
      }
    }
  }
}

// Behaves until the ring is final; aborts if the daemon never gets there.
bool Finish(Client& c) {
  const auto deadline = std::chrono::steady_clock::now() + kHardTimeout;
  bool broken = false;
  for (;;) {
    if (c.cq_honest) c.ConsumeCq();
    if (c.nq_honest) c.ConsumeNq();
    if (Final(c, &broken)) return broken;
    const RingHeader* h = c.ring.hdr;
    FUZZ_CHECK(std::chrono::steady_clock::now() < deadline,
               "ring stuck: sq_tail %u sq_head %u cq_tail %u cq_head %u (started at sq %u cq %u), status 0",
               c.published, c.ring.Load(h->sq_head), c.ring.Load(h->cq_tail), c.cq_head, c.sq_base, c.cq_base);
    c.ring.RingIfIdle();
    Pause();
  }
}

// --- checks ----------------------------------------------------------------

void CheckCqe(const RelayCqe& q, const Client& c) {
  FUZZ_CHECK(q.status >= 0 && q.status <= static_cast<int>(absl::StatusCode::kUnauthenticated),
             "CQE status %d is no absl::StatusCode", q.status);
  FUZZ_CHECK(q.reserved == 0, "CQE reserved = %u", q.reserved);
  FUZZ_CHECK(q.user_data <= c.written.size(), "CQE user_data %llu was never written (%zu SQEs)",
             static_cast<unsigned long long>(q.user_data), c.written.size());
}

void CheckNqe(const RelayNqe& n, uint64_t session) {
  const Export* e = FindExport(n.export_id);
  FUZZ_CHECK(e != nullptr && e->owner == session, "NQE for export %llu reached session %llu",
             static_cast<unsigned long long>(n.export_id), static_cast<unsigned long long>(session));
  FUZZ_CHECK(n.from_session == kSelf && n.message == 0, "NQE from session %llu, message %llu",
             static_cast<unsigned long long>(n.from_session), static_cast<unsigned long long>(n.message));
}

// The last min(posted, entries) entries of a queue, oldest first.
template <typename T>
std::vector<T> Window(const T* queue, uint32_t entries, uint32_t base, uint32_t tail) {
  const uint32_t n = std::min(tail - base, entries);
  std::vector<T> out;
  for (uint32_t i = tail - n; i != tail; ++i) out.push_back(queue[i & (entries - 1)]);
  return out;
}

void CheckAlways(const Client& c, const ClientRing& peer, bool broken) {
  const RingHeader* h = c.ring.hdr;
  const uint32_t status = c.ring.Load(h->daemon_status);
  constexpr auto kDataLoss = static_cast<uint32_t>(absl::StatusCode::kDataLoss);
  constexpr auto kUnavailable = static_cast<uint32_t>(absl::StatusCode::kUnavailable);
  // Draining at removal may still find the ring broken; a broken one stays so.
  FUZZ_CHECK(status == kDataLoss || (!broken && status == kUnavailable),
             "daemon_status %u after removal (broken before: %d)", status, broken);
  FUZZ_CHECK(std::memcmp(h, c.header.data(), c.header.size()) == 0, "the daemon changed the header's sizes");
  FUZZ_CHECK(c.ring.Load(h->sq_tail) == c.published && c.ring.Load(h->cq_head) == c.cq_head &&
                 c.ring.Load(h->nq_head) == c.nq_head,
             "the daemon wrote a client index: sq_tail %u (client %u) cq_head %u (%u) nq_head %u (%u)",
             c.ring.Load(h->sq_tail), c.published, c.ring.Load(h->cq_head), c.cq_head, c.ring.Load(h->nq_head),
             c.nq_head);
  FUZZ_CHECK(std::memcmp(c.ring.sq, c.sq_shadow.data(), c.sq_entries() * sizeof(RelaySqe)) == 0,
             "the daemon wrote the SQ");
  const uint32_t cq_tail = c.ring.Load(h->cq_tail), nq_tail = c.ring.Load(h->nq_tail);
  for (const RelayCqe& q : Window(c.ring.cq, c.cq_entries(), c.cq_base, cq_tail)) CheckCqe(q, c);
  for (const RelayNqe& n : Window(c.ring.nq, c.nq_entries(), c.nq_base, nq_tail)) CheckNqe(n, kSelf);
  if (c.cq_honest) {
    FUZZ_CHECK(cq_tail - c.cq_head <= c.cq_entries(), "cq_tail %u is more than %u ahead of cq_head %u", cq_tail,
               c.cq_entries(), c.cq_head);
  }
  if (c.nq_honest) {
    FUZZ_CHECK(nq_tail - c.nq_head <= c.nq_entries(), "nq_tail %u is more than %u ahead of nq_head %u", nq_tail,
               c.nq_entries(), c.nq_head);
  }

  // The peer only receives notifications and never consumes them.
  const RingHeader* p = peer.hdr;
  FUZZ_CHECK(peer.Load(p->daemon_status) == kUnavailable && peer.Load(p->sq_head) == 0 && peer.Load(p->cq_tail) == 0,
             "the honest peer's ring: status %u sq_head %u cq_tail %u", peer.Load(p->daemon_status),
             peer.Load(p->sq_head), peer.Load(p->cq_tail));
  const uint32_t peer_nq = peer.Load(p->nq_tail);
  FUZZ_CHECK(peer_nq <= peer.layout.nq_entries, "the peer's NQ got %u entries, room for %u", peer_nq,
             peer.layout.nq_entries);
  for (uint32_t i = 0; i < peer_nq; ++i) CheckNqe(peer.nq[i], kPeer);

  const Export* foreign = FindExport(kForeignId);
  for (uint64_t i = 0; i < foreign->size; ++i) {
    FUZZ_CHECK(foreign->bytes[i] == kPoison, "foreign export changed at byte %llu", static_cast<unsigned long long>(i));
  }
}

// For an honest client whose ring was served to the end (file comment).
void CheckModel(const Client& c, const ClientRing& peer) {
  const uint32_t taken = c.ring.Load(c.ring.hdr->sq_head) - c.sq_base;
  FUZZ_CHECK(c.completions.size() == taken, "%u SQEs taken, %zu completions", taken, c.completions.size());
  std::vector<bool> done(c.written.size() + 1, false);
  uint64_t done_below = 1;  // every user_data below this completed
  // The notifications the completions promise, to this ring and the peer's.
  std::vector<RelayNqe> own, peers;
  for (const RelayCqe& q : c.completions) {
    FUZZ_CHECK(q.user_data >= 1 && q.user_data <= taken && !done[q.user_data],
               "completion for user_data %llu: not one of the %u SQEs taken, or a second one",
               static_cast<unsigned long long>(q.user_data), taken);
    const RelaySqe& e = c.written[q.user_data - 1];
    const bool ok = q.status == 0;
    if (IsNotify(e) && e.flags == 0 && e.reserved == 0) {
      FUZZ_CHECK(done_below == q.user_data, "notification %llu completed before request %llu",
                 static_cast<unsigned long long>(q.user_data), static_cast<unsigned long long>(done_below));
      FUZZ_CHECK(Valid(e) ? ok || q.status == static_cast<int>(absl::StatusCode::kResourceExhausted) : !ok,
                 "notification to export %llu: status %d", static_cast<unsigned long long>(e.remote_export), q.status);
      if (ok) {
        RelayNqe n{e.remote_export, e.length, kSelf, 0};
        (FindExport(e.remote_export)->owner == kSelf ? own : peers).push_back(n);
      }
    } else {
      // A punched page may fail a valid copy, never pass an invalid one.
      FUZZ_CHECK(ok ? Valid(e) : !Valid(e) || c.punched,
                 "opcode %u flags %u reserved %llu, %llu+%llu of export %llu, %llu+%llu of export %llu: status %d",
                 e.opcode, e.flags, static_cast<unsigned long long>(e.reserved),
                 static_cast<unsigned long long>(e.local_offset), static_cast<unsigned long long>(e.length),
                 static_cast<unsigned long long>(e.local_export), static_cast<unsigned long long>(e.remote_offset),
                 static_cast<unsigned long long>(e.length), static_cast<unsigned long long>(e.remote_export), q.status);
    }
    done[q.user_data] = true;
    while (done_below <= taken && done[done_below]) ++done_below;
  }

  // The exports hold what the OK copies, in order, make of the pattern.
  if (!c.punched) {
    std::map<uint64_t, std::vector<uint8_t>> shadow;
    for (const Export& x : Exports()) {
      if (x.id == kForeignId) continue;
      auto& s = shadow[x.id];
      for (uint64_t i = 0; i < x.size; ++i) s.push_back(Pattern(x.id, i));
    }
    std::vector<int> status(c.written.size() + 1, -1);
    for (const RelayCqe& q : c.completions) status[q.user_data] = q.status;
    for (uint64_t tag = 1; tag <= taken; ++tag) {
      const RelaySqe& e = c.written[tag - 1];
      if (status[tag] != 0 || !IsCopy(e)) continue;
      const bool write = e.opcode == static_cast<uint32_t>(RelayOp::kWrite);
      std::vector<uint8_t>& src = shadow[write ? e.local_export : e.remote_export];
      std::vector<uint8_t>& dst = shadow[write ? e.remote_export : e.local_export];
      std::memmove(dst.data() + (write ? e.remote_offset : e.local_offset),
                   src.data() + (write ? e.local_offset : e.remote_offset), e.length);
    }
    for (const Export& x : Exports()) {
      if (x.id == kForeignId) continue;
      const std::vector<uint8_t>& want = shadow[x.id];
      for (uint64_t i = 0; i < x.size; ++i) {
        FUZZ_CHECK(x.bytes[i] == want[i], "export %llu byte %llu is %u, the completed copies make it %u",
                   static_cast<unsigned long long>(x.id), static_cast<unsigned long long>(i), x.bytes[i], want[i]);
      }
    }
  }

  auto same = [](const std::vector<RelayNqe>& want, const std::vector<RelayNqe>& got, const char* whose) {
    FUZZ_CHECK(want.size() == got.size(), "%s NQ holds %zu notifications, %zu completed OK", whose, got.size(),
               want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      FUZZ_CHECK(std::memcmp(&want[i], &got[i], sizeof(RelayNqe)) == 0, "%s notification %zu differs", whose, i);
    }
  };
  if (c.nq_honest) same(own, c.notes, "own");
  same(peers, std::vector<RelayNqe>(peer.nq, peer.nq + peer.Load(peer.hdr->nq_tail)), "the peer's");
}

void RunOne(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t cfg = in.Byte();
  const uint32_t sq = 2u << (cfg & 3);
  const uint32_t cq = (cfg & 4) ? 2 * sq : sq;
  const uint32_t nq = (cfg & 8) ? 4 : 2;

  // The client's exports start from the pattern, every page allocated again.
  for (Export& x : Exports()) {
    if (x.id == kForeignId) continue;
    int err = ::posix_fallocate(x.fd.get(), 0, static_cast<off_t>(x.size));
    FUZZ_CHECK(err == 0, "posix_fallocate: %s", std::strerror(err));
    for (uint64_t i = 0; i < x.size; ++i) x.bytes[i] = Pattern(x.id, i);
  }

  static const GpuInventory* const kNoCuda = [] {
    auto* inv = new GpuInventory();
    inv->cuda_available = false;
    return inv;
  }();
  RelayOptions options;
  options.workers = 1;
  options.spin_before_sleep_us = 20;
  options.batch_per_ring = 4;           // several rounds per burst
  options.inflight_per_ring = 8;        // and the in-flight cap
  options.host_bytes_per_round = 4096;  // copies of more than a page take several rounds
  auto engine = std::make_unique<RelayEngine>(Resolve, *kNoCuda, options);

  ClientRing peer(2, 2, 2);
  absl::Status st = peer.Open(*engine, kPeer);
  FUZZ_CHECK(st.ok(), "AddRing (peer): %s", st.ToString().c_str());

  ClientRing own(sq, cq, nq);
  Client c(own);
  SetStart(c, (cfg >> 5) & 3);
  if (cfg & 0x10) {
    own.hdr->magic = ~kRingMagic;
    st = own.Open(*engine, kSelf);
    FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument, "AddRing with a bad magic: %s", st.ToString().c_str());
    own.hdr->magic = kRingMagic;  // the refused ring must have left nothing behind
  }
  std::memcpy(c.header.data(), own.hdr, c.header.size());
  st = own.Open(*engine, kSelf);
  FUZZ_CHECK(st.ok(), "AddRing: %s", st.ToString().c_str());

  RunActions(c, in);
  const bool broken = Finish(c);
  engine->RemoveRing(kSelf);
  engine->RemoveRing(kPeer);
  engine.reset();  // joins the worker: nothing touches the rings or exports from here on
  if (c.cq_honest) c.ConsumeCq();
  if (c.nq_honest) c.ConsumeNq();

  CheckAlways(c, peer, broken);
  if (c.sq_honest && c.cq_honest && !broken) CheckModel(c, peer);
}

}  // namespace
}  // namespace podlink

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // a broken ring logs a warning; thousands of them slow the run
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  podlink::Exports();  // made once, before the first count
  const int before = OpenFdCount();
  podlink::RunOne(data, size);
  const int after = OpenFdCount();
  FUZZ_CHECK(after == before, "descriptor leak: %d open before this input, %d after", before, after);
  return 0;
}
