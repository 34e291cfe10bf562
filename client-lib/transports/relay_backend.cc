#include "client-lib/transports/relay_backend.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace podlink {

absl::StatusOr<std::unique_ptr<RelayBackend>> RelayBackend::Create(Client& client, uint32_t entries,
                                                                   absl::Duration timeout) {
  std::unique_ptr<RelayBackend> b(new RelayBackend(timeout));
  PODLINK_RETURN_IF_ERROR(b->Init(client, entries));
  return b;
}

RelayBackend::~RelayBackend() {
  if (ring_ != nullptr) ::munmap(ring_, layout_.total);
}

absl::Status RelayBackend::Init(Client& client, uint32_t n) {
  PODLINK_ASSIGN_OR_RETURN(layout_, RingLayout::Make(n, n, n, kMessageSlots));
  UniqueFd fd(::memfd_create("podlink-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return ErrnoStatus(errno, "memfd_create (relay ring)");
  if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(layout_.total)); err != 0) {
    return ErrnoStatus(err, "fallocate ring");
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoStatus(errno, "seal ring");
  }
  void* p = ::mmap(nullptr, layout_.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap ring");
  ring_ = p;
  auto* base = static_cast<char*>(p);
  hdr_ = reinterpret_cast<RingHeader*>(base);
  hdr_->magic = kRingMagic;
  hdr_->version = layout_.version();
  hdr_->sq_entries = hdr_->cq_entries = hdr_->nq_entries = n;
  sq_ = reinterpret_cast<RelaySqe*>(base + layout_.sq_offset);
  cq_ = reinterpret_cast<const RelayCqe*>(base + layout_.cq_offset);
  nq_ = reinterpret_cast<const RelayNqe*>(base + layout_.nq_offset);
  in_ = base + layout_.in_offset;
  out_ = base + layout_.out_offset;
  for (uint32_t i = layout_.message_slots; i > 0; --i) free_slots_.push_back(i - 1);
  bell_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!bell_) return ErrnoStatus(errno, "eventfd (relay doorbell)");
  return client.OpenRelayRing(fd.get(), bell_.get(), n, n, n, layout_.message_slots);
}

absl::Status RelayBackend::Submit(uint64_t batch, const Copy& c) {
  RelaySqe e{};
  e.user_data = batch;
  e.opcode = static_cast<uint32_t>(c.write ? RelayOp::kWrite : RelayOp::kRead);
  e.local_export = c.op->local->export_id;
  e.local_offset = c.op->local_offset;
  e.remote_export = c.op->remote->export_id;
  e.remote_offset = c.op->remote_offset;
  e.length = c.op->length;
  PODLINK_RETURN_IF_ERROR(Push(e));
  ++pending_[batch].remaining;
  return absl::OkStatus();
}

absl::Status RelayBackend::Notify(uint64_t batch, uint64_t export_id, uint64_t value) {
  RelaySqe e{};
  e.user_data = batch;
  e.opcode = static_cast<uint32_t>(RelayOp::kNotify);
  e.remote_export = export_id;
  e.length = value;
  PODLINK_RETURN_IF_ERROR(Push(e));
  ++pending_[batch].remaining;
  RingDoorbell();
  return absl::OkStatus();
}

absl::Status RelayBackend::NotifyMessage(uint64_t batch, uint64_t export_id, uint64_t value,
                                         absl::string_view message) {
  if (message.size() > kRingMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a notification carries at most ", kRingMessageBytes, " bytes, not ", message.size()));
  }
  // A slot frees when the completion of the notification that held it comes back.
  absl::Time deadline = absl::Now() + timeout_;
  while (free_slots_.empty()) {
    Reap();
    PODLINK_RETURN_IF_ERROR(CheckServed());
    RingDoorbell();
    if (absl::Now() > deadline) return absl::DeadlineExceededError("every notification message slot stayed in use");
    sched_yield();
  }
  uint32_t slot = free_slots_.back();
  std::memcpy(out_ + size_t{slot} * kRingMessageBytes, message.data(), message.size());
  RelaySqe e{};
  e.user_data = batch;
  e.opcode = static_cast<uint32_t>(RelayOp::kNotifyMessage);
  e.remote_export = export_id;
  e.remote_offset = value;
  e.local_offset = slot;
  e.length = message.size();
  PODLINK_RETURN_IF_ERROR(Push(e));
  free_slots_.pop_back();
  Pending& p = pending_[batch];
  ++p.remaining;
  p.slots.push_back(slot);
  RingDoorbell();
  return absl::OkStatus();
}

void RelayBackend::Flush(uint64_t /*batch*/) { RingDoorbell(); }

absl::StatusOr<bool> RelayBackend::Poll(uint64_t batch, absl::Status* result) {
  auto it = pending_.find(batch);
  if (it == pending_.end()) return true;
  Reap();
  if (it->second.remaining > 0) {
    PODLINK_RETURN_IF_ERROR(CheckServed());
    return false;
  }
  *result = it->second.status;
  Forget(it);
  return true;
}

void RelayBackend::Forget(std::map<uint64_t, Pending>::iterator it) {
  for (uint32_t slot : it->second.slots) free_slots_.push_back(slot);
  pending_.erase(it);
}

void RelayBackend::Abandon(uint64_t batch) {
  // The daemon may still read an abandoned notification's slot: it stays taken.
  pending_.erase(batch);
}

std::vector<Notification> RelayBackend::PollNotifications() {
  std::vector<Notification> out;
  uint32_t tail = hdr_->nq_tail.value.load(std::memory_order_acquire);
  while (nq_head_ != tail) {
    const uint32_t slot = nq_head_ & (layout_.nq_entries - 1);
    const RelayNqe& n = nq_[slot];
    Notification got;
    got.export_id = n.export_id;
    got.value = n.value;
    got.from_session = n.from_session;
    if ((n.message & kNqeHasMessage) != 0) {
      got.has_message = true;
      uint64_t len = std::min<uint64_t>(n.message & ~kNqeHasMessage, kRingMessageBytes);
      got.message.assign(in_ + size_t{slot} * kRingMessageBytes, len);
    }
    out.push_back(std::move(got));
    ++nq_head_;
  }
  hdr_->nq_head.value.store(nq_head_, std::memory_order_release);
  return out;
}

absl::Status RelayBackend::CheckServed() {
  uint32_t st = hdr_->daemon_status.value.load(std::memory_order_acquire);
  if (st == 0) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(st);
  return absl::Status(code, code == absl::StatusCode::kUnavailable
                                ? "podlinkd stopped serving this relay ring: the session closed (reconnect)"
                                : "podlinkd stopped serving this relay ring (its indices were corrupted)");
}

absl::Status RelayBackend::Push(const RelaySqe& e) {
  absl::Time deadline = absl::Now() + timeout_;
  while (sq_tail_ - hdr_->sq_head.value.load(std::memory_order_acquire) >= layout_.sq_entries) {
    Reap();
    PODLINK_RETURN_IF_ERROR(CheckServed());
    RingDoorbell();
    if (absl::Now() > deadline) return absl::DeadlineExceededError("relay queue stayed full");
    sched_yield();
  }
  sq_[sq_tail_ & (layout_.sq_entries - 1)] = e;
  ++sq_tail_;
  hdr_->sq_tail.value.store(sq_tail_, std::memory_order_release);
  return absl::OkStatus();
}

void RelayBackend::RingDoorbell() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (hdr_->daemon_idle.value.load(std::memory_order_seq_cst) != 0) {
    uint64_t one = 1;
    (void)!::write(bell_.get(), &one, sizeof(one));
  }
}

void RelayBackend::Reap() {
  uint32_t tail = hdr_->cq_tail.value.load(std::memory_order_acquire);
  while (cq_head_ != tail) {
    RelayCqe c = cq_[cq_head_ & (layout_.cq_entries - 1)];
    ++cq_head_;
    auto it = pending_.find(c.user_data);
    if (it == pending_.end()) continue;
    if (it->second.remaining > 0) --it->second.remaining;
    if (it->second.remaining == 0) {
      // The daemon copied the messages out when it took them: their slots are free now, whenever the
      // batch itself is polled.
      for (uint32_t slot : it->second.slots) free_slots_.push_back(slot);
      it->second.slots.clear();
    }
    if (c.status != 0 && it->second.status.ok()) {
      it->second.status = absl::Status(
          static_cast<absl::StatusCode>(c.status),
          "podlinkd refused or failed a relay transfer of this batch (its log says why: event=relay_op_failed)");
    }
  }
  hdr_->cq_head.value.store(cq_head_, std::memory_order_release);
}

}  // namespace podlink
