#include "daemon/mesh/seal/window.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "daemon/mesh/links/range.h"

namespace podlink::mesh::seal {
namespace {

constexpr uint32_t kRequestMagic = 0x51534c50;  // "PLSQ"
constexpr uint32_t kReceiptMagic = 0x52534c50;  // "PLSR"
constexpr uint32_t kHeaderRecord = 0xffffffff;  // the request header's own tag
constexpr uint32_t kReceiptRecord = 0xfffffffe;
constexpr size_t kHeaderBytes = 32;
constexpr size_t kTagAt = 32;       // the header's or receipt's own tag
constexpr size_t kTagsAt = 48;      // the data records' tags
constexpr size_t kMessageAt = kTagsAt + kRecordsPerSlot * kTagBytes;  // 304: a receipt's message
static_assert(kMessageAt + kMaxReceiptMessage == kReceiptBytes);
static_assert(kTagsAt + kRecordsPerSlot * kTagBytes <= kRequestBytes);

void Put(char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint64_t Get(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// A data record's associated data: the request header and the record's index.
std::string RecordAad(const std::string& header, uint32_t index) {
  std::string aad = header;
  char i[4];
  Put(i, index, 4);
  aad.append(i, 4);
  return aad;
}

Tag TagAt(const char* p) {
  Tag t;
  std::memcpy(t.data(), p, kTagBytes);
  return t;
}

uint32_t Records(uint64_t length) { return static_cast<uint32_t>((length + kRecordBytes - 1) / kRecordBytes); }

// A write's plaintext on its way from the window to the export: this
// thread's, one unit long, never reachable by peers.
char* Scratch() {
  thread_local std::unique_ptr<char[]> buf(new char[kSlotDataBytes]);
  return buf.get();
}

}  // namespace

std::string RequestHeader::Encode() const {
  std::string out(kHeaderBytes, '\0');
  Put(out.data(), kRequestMagic, 4);
  out[4] = static_cast<char>(kind);
  Put(out.data() + 8, seq, 8);
  Put(out.data() + 16, offset, 8);
  Put(out.data() + 24, length, 8);
  return out;
}

bool RequestHeader::Decode(const char* p, RequestHeader* out) {
  if (Get(p, 4) != kRequestMagic || p[5] != 0 || p[6] != 0 || p[7] != 0) return false;
  const auto kind = static_cast<uint8_t>(p[4]);
  if (kind < 1 || kind > 3) return false;
  out->kind = static_cast<Kind>(kind);
  out->seq = Get(p + 8, 8);
  out->offset = Get(p + 16, 8);
  out->length = Get(p + 24, 8);
  return true;
}

// --- owner ---------------------------------------------------------------------

SealedRegion::SealedRegion(SealKeys keys, uint64_t export_size, std::string node, NodeShares* budget,
                           SealCounters* counters)
    : keys_(keys), export_size_(export_size), node_(std::move(node)), budget_(budget), counters_(counters) {}

SealedRegion::~SealedRegion() {
  // No slot lock: nothing else holds the region now, and the last reference
  // may go where the engine's own lock is held (a grant erased).
  budget_->Give(node_, allocated_.load(std::memory_order_acquire) * kSlotStride);
  OPENSSL_cleanse(const_cast<SealKeys*>(&keys_), sizeof(keys_));
}

absl::StatusOr<SealedRegion::Slot*> SealedRegion::SlotOf(uint64_t offset, uint64_t n, uint64_t* at) const {
  const uint64_t index = offset / kSlotStride;
  *at = offset % kSlotStride;
  if (n == 0 || index >= kSlots || n > kSlotStride - *at) {
    return absl::OutOfRangeError(absl::StrCat("range [", offset, ", +", n,
                                              ") is not within one slot of the sealed grant's window"));
  }
  return const_cast<Slot*>(&slots_[index]);
}

absl::Status SealedRegion::Write(uint64_t offset, const char* src, uint64_t n) {
  uint64_t at = 0;
  absl::StatusOr<Slot*> s = SlotOf(offset, n, &at);
  if (!s.ok()) return s.status();
  if (at < kReceiptBytes) return absl::PermissionDeniedError("a sealed grant's receipts are the owner's to write");
  absl::MutexLock l(&(*s)->mu);
  if ((*s)->bytes == nullptr) {
    if (!budget_->TryTake(node_, kSlotStride)) {
      return absl::ResourceExhaustedError("the owner's memory for sealed routes is taken (mesh.sealed_window_bytes)");
    }
    (*s)->bytes.reset(new char[kSlotStride]());
    allocated_.fetch_add(1, std::memory_order_release);
  }
  std::memcpy((*s)->bytes.get() + at, src, n);
  return absl::OkStatus();
}

absl::Status SealedRegion::Read(uint64_t offset, char* dst, uint64_t n, Lander& lander) {
  uint64_t at = 0;
  absl::StatusOr<Slot*> s = SlotOf(offset, n, &at);
  if (!s.ok()) return s.status();
  Slot& slot = **s;
  absl::MutexLock l(&slot.mu);
  if (slot.bytes == nullptr) return absl::FailedPreconditionError("nothing was written to this slot of the window");
  Act(slot, static_cast<uint32_t>(offset / kSlotStride), lander);
  std::memcpy(dst, slot.bytes.get() + at, n);
  return absl::OkStatus();
}

void SealedRegion::Act(Slot& s, uint32_t index, Lander& lander) {
  char* const slot = s.bytes.get();
  const char* const request = slot + kReceiptBytes;
  RequestHeader h;
  if (!RequestHeader::Decode(request, &h)) return;  // nothing new, or garbage: the bytes as they are
  if (h.seq % kSlots != index || h.seq <= s.last_seq) {
    if (h.seq != s.last_seq) counters_->refused.fetch_add(1, std::memory_order_relaxed);
    return;  // acted on already (the same receipt again), or a replay
  }
  const std::string header(request, kHeaderBytes);
  if (!GcmOpen(keys_.to_owner, Nonce(h.seq, kHeaderRecord), header, nullptr, nullptr, 0, TagAt(request + kTagAt))
           .ok()) {
    counters_->refused.fetch_add(1, std::memory_order_relaxed);
    return;  // not the importer's: no receipt (one under this number could be forged)
  }
  // The importer's own request: this number is used now, whatever follows.
  s.last_seq = h.seq;
  char* const data = slot + kDataAt;
  std::vector<Tag> tags;
  absl::Status st;
  if (h.kind == Kind::kNotify) {
    st = h.length == 0 ? lander.Notify(h.offset) : absl::InvalidArgumentError("a notification carries no data");
  } else if (h.length == 0 || h.length > kSlotDataBytes) {
    st = absl::InvalidArgumentError(absl::StrCat("a sealed unit carries 1 to ", kSlotDataBytes, " bytes"));
  } else if (!ByteRange{h.offset, h.length}.Within(export_size_)) {
    st = ByteRange{h.offset, h.length}.CheckIn(export_size_, "the export");
  } else if (h.kind == Kind::kWrite) {
    // Decrypted out of the window: what peers can read of it (the window is
    // the grant's address space) never holds plaintext.
    char* plain = Scratch();
    for (uint32_t i = 0; i < Records(h.length) && st.ok(); ++i) {
      const uint64_t n = std::min(kRecordBytes, h.length - uint64_t{i} * kRecordBytes);
      const uint64_t at = uint64_t{i} * kRecordBytes;
      if (!GcmOpen(keys_.to_owner, Nonce(h.seq, i), RecordAad(header, i), data + at, plain + at, n,
                   TagAt(request + kTagsAt + i * kTagBytes))
               .ok()) {
        st = absl::DataLossError(absl::StrCat("record ", i, " of the write does not verify: altered on the way; "
                                              "nothing of this unit landed"));
      }
    }
    if (st.ok()) st = lander.CopyIn(h.offset, plain, h.length);
    if (st.ok()) counters_->bytes_landed.fetch_add(h.length, std::memory_order_relaxed);
  } else {
    // The export's bytes pass through the window only under this slot's lock
    // and leave it sealed; on any failure they are wiped before it is let go.
    st = lander.CopyOut(h.offset, data, h.length);
    for (uint32_t i = 0; i < Records(h.length) && st.ok(); ++i) {
      const uint64_t n = std::min(kRecordBytes, h.length - uint64_t{i} * kRecordBytes);
      char* rec = data + uint64_t{i} * kRecordBytes;
      Tag t;
      st = GcmSeal(keys_.to_importer, Nonce(h.seq, i), RecordAad(header, i), rec, rec, n, &t);
      tags.push_back(t);
    }
    if (st.ok()) {
      counters_->bytes_sealed.fetch_add(h.length, std::memory_order_relaxed);
    } else {
      OPENSSL_cleanse(data, h.length);
    }
  }
  if (st.code() == absl::StatusCode::kDataLoss) {
    counters_->refused.fetch_add(1, std::memory_order_relaxed);
  } else {
    counters_->units.fetch_add(1, std::memory_order_relaxed);
  }
  if (!st.ok()) tags.clear();
  WriteReceipt(s, h.seq, st, tags);
}

void SealedRegion::WriteReceipt(Slot& s, uint64_t seq, const absl::Status& st, const std::vector<Tag>& tags) {
  char* const r = s.bytes.get();
  std::memset(r, 0, kReceiptBytes);
  const std::string message(st.message().substr(0, kMaxReceiptMessage));
  Put(r, kReceiptMagic, 4);
  Put(r + 4, static_cast<uint32_t>(st.code()), 4);
  Put(r + 8, seq, 8);
  Put(r + 16, message.size(), 2);
  for (size_t i = 0; i < tags.size(); ++i) std::memcpy(r + kTagsAt + i * kTagBytes, tags[i].data(), kTagBytes);
  std::string aad(r, kHeaderBytes);
  aad.append(r + kReceiptBytes, kHeaderBytes);  // the request it answers
  Tag t;
  if (!GcmSeal(keys_.to_importer, Nonce(seq, kReceiptRecord), aad, message.data(), r + kMessageAt, message.size(), &t)
           .ok()) {
    std::memset(r, 0, kReceiptBytes);  // no receipt: the importer's check fails
    return;
  }
  std::memcpy(r + kTagAt, t.data(), kTagBytes);
}

// --- importer ------------------------------------------------------------------

struct SealedLinks::Op {
  LinkOp op;
  absl::Mutex mu;
  size_t remaining ABSL_GUARDED_BY(mu) = 0;
  absl::Status first ABSL_GUARDED_BY(mu);
};

struct SealedLinks::Unit {
  std::shared_ptr<Op> op;
  Kind kind = Kind::kWrite;
  uint64_t offset = 0;  // in the export (kNotify: the value)
  uint64_t length = 0;
  char* local = nullptr;
  uint64_t seq = 0;
  uint32_t slot = 0;
  std::string header;
  std::unique_ptr<char[]> buf;
};

SealedLinks::SealedLinks(SealKeys keys, uint64_t grant, uint64_t export_size, Carrier carrier, Defer defer)
    : keys_(keys), grant_(grant), export_size_(export_size), carrier_(std::move(carrier)), defer_(std::move(defer)) {}

SealedLinks::~SealedLinks() { OPENSSL_cleanse(const_cast<SealKeys*>(&keys_), sizeof(keys_)); }

uint64_t SealedLinks::instance() const {
  std::shared_ptr<DataLinks> c = carrier_();
  return c == nullptr ? 0 : c->instance();
}

size_t SealedLinks::live() const {
  std::shared_ptr<DataLinks> c = carrier_();
  return c == nullptr ? 0 : c->live();
}

LinkStats SealedLinks::Stats() const {
  std::shared_ptr<DataLinks> c = carrier_();
  return c == nullptr ? LinkStats{} : c->Stats();
}

std::vector<std::tuple<std::string, bool, uint64_t>> SealedLinks::Connections() const {
  std::shared_ptr<DataLinks> c = carrier_();
  return c == nullptr ? std::vector<std::tuple<std::string, bool, uint64_t>>{} : c->Connections();
}

size_t SealedLinks::pending() const {
  absl::MutexLock l(&mu_);
  return waiting_.size() + in_flight_;
}

absl::Status SealedLinks::Submit(LinkOp op) {
  std::shared_ptr<DataLinks> c = carrier_();
  if (c == nullptr || c->live() == 0) return absl::UnavailableError("no link of the sealed route is up");
  std::vector<std::shared_ptr<Unit>> units;
  auto whole = std::make_shared<Op>();
  if (op.type == FrameType::kNotify) {
    auto u = std::make_shared<Unit>();
    u->kind = Kind::kNotify;
    u->offset = op.offset;
    units.push_back(std::move(u));
  } else if (op.type == FrameType::kWrite || op.type == FrameType::kRead) {
    PODLINK_RETURN_IF_ERROR((ByteRange{op.offset, op.length}.CheckNonEmptyIn(export_size_)));
    for (uint64_t at = 0; at < op.length; at += kSlotDataBytes) {
      auto u = std::make_shared<Unit>();
      u->kind = op.type == FrameType::kWrite ? Kind::kWrite : Kind::kRead;
      u->offset = op.offset + at;
      u->length = std::min(kSlotDataBytes, op.length - at);
      u->local = op.local + at;
      units.push_back(std::move(u));
    }
  } else {
    return absl::InvalidArgumentError("a sealed route carries writes, reads and notifications");
  }
  {
    absl::MutexLock l(&whole->mu);
    whole->remaining = units.size();
  }
  whole->op = std::move(op);
  {
    absl::MutexLock l(&mu_);
    for (auto& u : units) {
      u->op = whole;
      waiting_.push_back(std::move(u));
    }
  }
  Pump();
  return absl::OkStatus();
}

void SealedLinks::Pump() {
  for (;;) {
    std::shared_ptr<Unit> u;
    {
      absl::MutexLock l(&mu_);
      if (waiting_.empty() || busy_[next_seq_ % kSlots]) return;
      u = std::move(waiting_.front());
      waiting_.pop_front();
      u->seq = next_seq_++;
      u->slot = static_cast<uint32_t>(u->seq % kSlots);
      busy_[u->slot] = true;
      ++in_flight_;
    }
    Send(std::move(u));
  }
}

absl::Status SealedLinks::SubmitToCarrier(LinkOp op) {
  std::shared_ptr<DataLinks> c = carrier_();
  if (c == nullptr) return absl::UnavailableError("no link of the sealed route is up");
  return c->Submit(std::move(op));
}

void SealedLinks::Later(std::function<void()> task) {
  if (defer_ != nullptr && defer_(task)) return;
  task();
}

void SealedLinks::Send(std::shared_ptr<Unit> u) {
  RequestHeader h;
  h.kind = u->kind;
  h.seq = u->seq;
  h.offset = u->offset;
  h.length = u->length;
  u->header = h.Encode();
  const uint64_t payload = u->kind == Kind::kWrite ? u->length : 0;
  // The same buffer takes the answer: receipt, request, data.
  const uint64_t answer = u->kind == Kind::kRead ? kDataAt + u->length : kReceiptBytes;
  // Only the request area needs zeroing (its unused tags go on the wire);
  // the rest is ciphertext or the answer, written whole before it is read.
  u->buf.reset(new char[std::max(kRequestBytes + payload, answer)]);
  char* request = u->buf.get();
  std::memset(request, 0, kRequestBytes);
  std::memcpy(request, u->header.data(), kHeaderBytes);
  Tag t;
  absl::Status st =
      GcmSeal(keys_.to_owner, Nonce(u->seq, kHeaderRecord), u->header, nullptr, nullptr, 0, &t);
  std::memcpy(request + kTagAt, t.data(), kTagBytes);
  for (uint32_t i = 0; st.ok() && i < Records(payload); ++i) {
    const uint64_t n = std::min(kRecordBytes, payload - uint64_t{i} * kRecordBytes);
    st = GcmSeal(keys_.to_owner, Nonce(u->seq, i), RecordAad(u->header, i), u->local + uint64_t{i} * kRecordBytes,
                 request + kRequestBytes + uint64_t{i} * kRecordBytes, n, &t);
    std::memcpy(request + kTagsAt + i * kTagBytes, t.data(), kTagBytes);
  }
  if (!st.ok()) return Finish(std::move(u), st);
  Step(std::move(u), FrameType::kWrite, kReceiptBytes, kRequestBytes + payload, &SealedLinks::Sent);
}

void SealedLinks::Step(std::shared_ptr<Unit> u, FrameType type, uint64_t at, uint64_t length,
                       void (SealedLinks::*next)(std::shared_ptr<Unit>, const absl::Status&)) {
  LinkOp op;
  op.type = type;
  op.grant = grant_;
  op.offset = u->slot * kSlotStride + at;
  op.length = length;
  op.local = u->buf.get();
  op.keep = std::shared_ptr<const void>(u, u->buf.get());
  op.prefer = u->op->op.prefer;
  op.done = [self = shared_from_this(), u, next](const absl::Status& result) {
    self->Later([self, u, result, next] { ((*self).*next)(u, result); });
  };
  if (absl::Status submitted = SubmitToCarrier(std::move(op)); !submitted.ok()) Finish(std::move(u), submitted);
}

void SealedLinks::Sent(std::shared_ptr<Unit> u, const absl::Status& st) {
  if (!st.ok()) return Finish(std::move(u), st);
  const uint64_t answer = u->kind == Kind::kRead ? kDataAt + u->length : kReceiptBytes;
  Step(std::move(u), FrameType::kRead, 0, answer, &SealedLinks::Answered);
}

void SealedLinks::Answered(std::shared_ptr<Unit> u, const absl::Status& st) {
  if (!st.ok()) return Finish(std::move(u), st);
  const char* r = u->buf.get();
  const uint64_t seq = Get(r + 8, 8);
  const uint64_t code = Get(r + 4, 4);
  const uint64_t message_len = Get(r + 16, 2);
  if (Get(r, 4) != kReceiptMagic || seq != u->seq || message_len > kMaxReceiptMessage) {
    return Finish(std::move(u), absl::DataLossError("the owner's receipt is missing or answers another request: "
                                                    "a relay on the route altered or replayed it"));
  }
  std::string aad(r, kHeaderBytes);
  aad.append(u->header);
  std::string message(message_len, '\0');
  if (!GcmOpen(keys_.to_importer, Nonce(seq, kReceiptRecord), aad, r + kMessageAt, message.data(), message_len,
               TagAt(r + kTagAt))
           .ok()) {
    return Finish(std::move(u), absl::DataLossError("the owner's receipt does not verify: a relay on the route "
                                                    "altered it"));
  }
  if (code != 0) {
    const auto c = code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
    return Finish(std::move(u), absl::Status(c, message));
  }
  if (u->kind == Kind::kRead) {
    char* data = u->buf.get() + kDataAt;
    for (uint32_t i = 0; i < Records(u->length); ++i) {
      const uint64_t n = std::min(kRecordBytes, u->length - uint64_t{i} * kRecordBytes);
      char* rec = data + uint64_t{i} * kRecordBytes;
      if (!GcmOpen(keys_.to_importer, Nonce(seq, i), RecordAad(u->header, i), rec, rec, n,
                   TagAt(r + kTagsAt + i * kTagBytes))
               .ok()) {
        return Finish(std::move(u), absl::DataLossError(absl::StrCat(
                                        "record ", i, " of the read does not verify: a relay on the route altered "
                                        "it; none of this unit was handed on")));
      }
    }
    std::memcpy(u->local, data, u->length);  // only verified bytes reach the caller's memory
  }
  Finish(std::move(u), absl::OkStatus());
}

void SealedLinks::Finish(std::shared_ptr<Unit> u, const absl::Status& st) {
  {
    absl::MutexLock l(&mu_);
    busy_[u->slot] = false;
    --in_flight_;
  }
  std::shared_ptr<Op> whole = u->op;
  u.reset();
  std::function<void(const absl::Status&)> done;
  absl::Status result;
  {
    absl::MutexLock l(&whole->mu);
    if (!st.ok() && whole->first.ok()) whole->first = st;
    if (--whole->remaining == 0) {
      done = std::move(whole->op.done);
      result = whole->first;
    }
  }
  if (done) done(result);
  Pump();
}

}  // namespace podlink::mesh::seal
