// One client connection: its kernel-derived identity, its descriptor
// channel, descriptors it offered but has not yet exported, and its Watch
// streams.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/identity/peer_identity.h"
#include "daemon/identity/pod_source.h"
#include "podlink/v1/podlink.pb.h"

namespace podlink {

// A Watch stream. Push never blocks; Close ends the stream after the queued
// events (the last being `final_event`).
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void Push(const v1::Event& e) = 0;
  virtual void Close(const v1::Event& final_event) = 0;
  virtual bool done() const = 0;
};

struct Session {
  Session(uint64_t id_, std::array<uint64_t, 2> token_, PeerIdentity peer_, PodInfo pod_, UniqueFd sock_)
      : id(id_), token(token_), peer(std::move(peer_)), pod(std::move(pod_)), sock(std::move(sock_)) {}

  const uint64_t id;
  const std::array<uint64_t, 2> token;
  const PeerIdentity peer;
  const PodInfo pod;
  const UniqueFd sock;  // SOCK_SEQPACKET descriptor channel; shut down on close

  absl::Mutex send_mu;  // serializes messages written to `sock`

  absl::Mutex mu;  // protects the members below
  bool closed ABSL_GUARDED_BY(mu) = false;
  struct Offer {
    UniqueFd fd;
    absl::Time at;  // offers unused for BrokerOptions::offer_ttl are closed
  };
  std::map<uint64_t, Offer> offers ABSL_GUARDED_BY(mu);  // slot -> offered descriptor
  uint64_t next_delivery ABSL_GUARDED_BY(mu) = 1;
  std::vector<std::shared_ptr<EventSink>> watchers ABSL_GUARDED_BY(mu);
};

}  // namespace podlink
