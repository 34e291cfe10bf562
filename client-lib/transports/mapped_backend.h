// Copies through a mapping of the peer's memory in this process: the host
// memcpy transport (a peer's memfd) and the direct transport (a peer's GPU
// memory this container can open). Host to host is a memcpy on the caller's
// thread; anything touching a GPU is a cuMemcpyAsync on the backend's own
// stream, completed per batch by an event.
#pragma once

#include <cstdint>
#include <map>

#include "client-lib/transports/backend.h"
#include "common/cuda_driver.h"

namespace podlink {

// The one stream of this process's in-process GPU copies (both mapped
// transports), created on first use in the primary context of `device`.
class InProcessStream {
 public:
  explicit InProcessStream(int device) : device_(device) {}
  ~InProcessStream();
  InProcessStream(const InProcessStream&) = delete;
  InProcessStream& operator=(const InProcessStream&) = delete;
  absl::Status Ensure();
  const cu::Driver* cuda() const { return cuda_; }
  cu::Stream stream() const { return stream_; }

 private:
  const int device_;
  const cu::Driver* cuda_ = nullptr;
  cu::Context ctx_ = nullptr;  // retained primary context
  cu::Stream stream_ = nullptr;
};

class MappedBackend final : public TransportBackend {
 public:
  // `stream` must outlive the backend.
  MappedBackend(Transport id, InProcessStream& stream) : id_(id), stream_(stream) {}
  ~MappedBackend() override;

  Transport id() const override { return id_; }
  absl::Status Submit(uint64_t batch, const Copy& copy) override;
  void Flush(uint64_t batch) override;
  absl::StatusOr<bool> Poll(uint64_t batch, absl::Status* result) override;
  absl::Status Fence() override;
  void Abandon(uint64_t batch) override;

 private:
  const Transport id_;
  InProcessStream& stream_;
  std::map<uint64_t, bool> queued_;         // batches with GPU copies not yet covered by an event
  std::map<uint64_t, cu::Event> events_;    // batch -> event after its GPU copies
  std::map<uint64_t, absl::Status> failed_;  // batches whose event could not be recorded (waited for instead)
};

}  // namespace podlink
