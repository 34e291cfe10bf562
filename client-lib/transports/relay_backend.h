// The relay transport: podlinkd copies with the GPUs' copy engines. This
// process owns the session's relay ring (common/relay_ring.h), a sealed
// memfd shared with podlinkd: requests go into the SQ, one completion per
// request comes back in the CQ, and notifications other sessions send to
// this session's exports arrive in the NQ.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client-lib/transports/backend.h"
#include "common/relay_ring.h"
#include "common/unique_fd.h"
#include "podlink/client.h"

namespace podlink {

class RelayBackend final : public TransportBackend {
 public:
  // Creates the ring (`entries` per queue, a power of two) and hands it to
  // podlinkd. `timeout` bounds waiting for room in the SQ.
  static absl::StatusOr<std::unique_ptr<RelayBackend>> Create(Client& client, uint32_t entries,
                                                              absl::Duration timeout);
  ~RelayBackend() override;

  Transport id() const override { return Transport::kRelay; }
  absl::Status Submit(uint64_t batch, const Copy& copy) override;
  void Flush(uint64_t batch) override;
  absl::StatusOr<bool> Poll(uint64_t batch, absl::Status* result) override;
  absl::Status Fence() override { return absl::OkStatus(); }  // the daemon orders NOTIFY after earlier ops
  void Abandon(uint64_t batch) override;

  // Queues a notification of `value` to the owner of `export_id` as part of
  // `batch` (completed like a copy), after every earlier op of the ring.
  absl::Status Notify(uint64_t batch, uint64_t export_id, uint64_t value);
  // The same with bytes (at most kRingMessageBytes), through an OUT slot of
  // the ring that is free again once the request's completion came back.
  absl::Status NotifyMessage(uint64_t batch, uint64_t export_id, uint64_t value, absl::string_view message);
  std::vector<Notification> PollNotifications();
  // Wakes podlinkd if it sleeps (waiters call this while they spin).
  void RingDoorbell();

 private:
  struct Pending {
    uint32_t remaining = 0;  // completions still due
    absl::Status status;     // the first failure reported
    std::vector<uint32_t> slots;  // OUT message slots its notifications hold
  };
  RelayBackend(absl::Duration timeout) : timeout_(timeout) {}
  absl::Status Init(Client& client, uint32_t entries);
  absl::Status Push(const RelaySqe& e);
  void Reap();
  // Drops a finished batch, giving back its message slots.
  void Forget(std::map<uint64_t, Pending>::iterator it);
  // OUT message slots of the ring: notifications with bytes in flight at once.
  static constexpr uint32_t kMessageSlots = 64;
  // OK while podlinkd serves the ring.
  absl::Status CheckServed();

  const absl::Duration timeout_;
  RingLayout layout_;
  void* ring_ = nullptr;
  RingHeader* hdr_ = nullptr;
  RelaySqe* sq_ = nullptr;
  const RelayCqe* cq_ = nullptr;
  const RelayNqe* nq_ = nullptr;
  const char* in_ = nullptr;  // the message areas (common/relay_ring.h)
  char* out_ = nullptr;
  UniqueFd bell_;
  uint32_t sq_tail_ = 0;
  uint32_t cq_head_ = 0;
  uint32_t nq_head_ = 0;
  std::map<uint64_t, Pending> pending_;  // batch -> its relay part
  std::vector<uint32_t> free_slots_;     // OUT message slots not in use
};

}  // namespace podlink
