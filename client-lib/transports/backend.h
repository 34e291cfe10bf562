// How TransferEngine moves bytes: one TransportBackend per transport
// (podlink::Transport names them). The engine resolves each op to a Copy,
// hands it to the backend of the remote region's transport, and tracks a
// batch as done once every backend it touched says its part is done.
//
//   host memcpy   mapped_backend.*  the peer's memfd mapped in this process
//   direct        mapped_backend.*  the peer's GPU memory mapped, copied by this process's GPU
//   relay         relay_backend.*   podlinkd's copy engines, through the session's relay ring
//
// select.* (Transports) is the one place that makes the backends, picks the
// transport of an opened region and maps a transport to its backend. Adding
// one (the inter-node mesh is next): a backend here, a podlink::Transport
// value, and Transports. Backends are called with the engine's lock held and
// never block longer than their own timeout.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "podlink/transfer.h"

namespace podlink {

// One op of a batch, resolved by the engine (ranges already checked).
struct Copy {
  bool write = true;  // local -> remote; false: remote -> local
  const TransferOp* op = nullptr;
  // In-process addresses, for backends that copy through a mapping: the
  // local region's (host pointer or device pointer) and the mapped remote's.
  uint64_t local_addr = 0;
  bool local_is_host = false;
  uint64_t remote_addr = 0;
  bool remote_is_host = false;
  int device = 0;  // in-process copies: the CUDA ordinal whose stream runs it
};

class TransportBackend {
 public:
  virtual ~TransportBackend() = default;
  virtual Transport id() const = 0;

  // Starts `copy` as part of `batch`. An error means this copy was not
  // started (those before it were and still complete).
  virtual absl::Status Submit(uint64_t batch, const Copy& copy) = 0;
  // Called once after the batch's copies were submitted.
  virtual void Flush(uint64_t batch) = 0;
  // Whether this backend's part of `batch` is done (true for a batch it
  // holds nothing of). Once done, `*result` gets the part's outcome and the
  // backend forgets the batch. An error means the backend cannot tell (its
  // channel to podlinkd is gone).
  virtual absl::StatusOr<bool> Poll(uint64_t batch, absl::Status* result) = 0;
  // Blocks until every copy submitted so far is visible at its destination
  // (notifications are ordered after it).
  virtual absl::Status Fence() = 0;
  // Drops whatever it holds of `batch` without waiting (engine teardown, after
  // a bounded wait).
  virtual void Abandon(uint64_t batch) = 0;
};

}  // namespace podlink
