// Copies through a mapping of the peer's memory in this process: the host
// memcpy transport (a peer's memfd) and the direct transport (a peer's GPU
// memory this container can open). Host to host is a memcpy on the caller's
// thread; anything touching a GPU is a cuMemcpyAsync on the backend's own
// stream, completed per batch by an event.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "client-lib/transports/backend.h"
#include "common/cuda_driver.h"

namespace podlink {

// The one stream of this process's in-process GPU copies (both mapped
// transports), created on first use in the primary context of `device`.
// One non-blocking stream in a GPU's primary context, made on first use.
class InProcessStream {
 public:
  explicit InProcessStream(int device) : device_(device) {}
  ~InProcessStream();
  InProcessStream(const InProcessStream&) = delete;
  InProcessStream& operator=(const InProcessStream&) = delete;
  absl::Status Ensure();
  const cu::Driver* cuda() const { return cuda_; }
  cu::Stream stream() const { return stream_; }
  cu::Context context() const { return ctx_; }
  // An event of this stream's context, from a pool (call with that context
  // current); null if none can be made. Give it back once it has passed.
  cu::Event TakeEvent();
  void GiveEvent(cu::Event e) { free_events_.push_back(e); }

 private:
  const int device_;
  const cu::Driver* cuda_ = nullptr;
  cu::Context ctx_ = nullptr;  // retained primary context
  cu::Stream stream_ = nullptr;
  std::vector<cu::Event> free_events_;
};

// The in-process streams, one per GPU of this process that copies.
class InProcessStreams {
 public:
  // The stream of CUDA ordinal `device`, made on first use.
  absl::StatusOr<InProcessStream*> For(int device);

 private:
  std::map<int, std::unique_ptr<InProcessStream>> streams_;
};

class MappedBackend final : public TransportBackend {
 public:
  // `streams` must outlive the backend.
  MappedBackend(Transport id, InProcessStreams& streams) : id_(id), streams_(streams) {}
  ~MappedBackend() override;

  Transport id() const override { return id_; }
  absl::Status Submit(uint64_t batch, const Copy& copy) override;
  void Flush(uint64_t batch) override;
  absl::StatusOr<bool> Poll(uint64_t batch, absl::Status* result) override;
  absl::Status Fence() override;
  void Abandon(uint64_t batch) override;

 private:
  const Transport id_;
  InProcessStreams& streams_;
  std::map<uint64_t, std::set<InProcessStream*>> queued_;  // batch -> streams with its copies, no event yet
  // batch -> per stream with its copies, an event recorded after them
  std::map<uint64_t, std::vector<std::pair<InProcessStream*, cu::Event>>> events_;
  std::map<uint64_t, absl::Status> failed_;  // batches whose event could not be recorded (waited for instead)
};

}  // namespace podlink
