// GPU copies of the NCCL net plugin. Every copy runs in a CUDA context of
// the plugin's own (CopyContext, see the .cc for why) on one stream per
// comm (CopyStream): bounce-buffer copies that wait for that stream only,
// and the TCP transport's page-locked staging buffers with asynchronous
// copies and completion events (StagingPool).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda_driver.h"

namespace podlink::ncclnet {

// The comm's copy stream, created on first use in the plugin's copy context
// of device `dev`. Destruction waits for copies still running on it.
class CopyStream {
 public:
  explicit CopyStream(int dev) : dev_(dev) {}
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // Copies on this stream and waits for it (NCCL's kernels keep running).
  absl::Status CopyAndWait(uint64_t dst, uint64_t src, size_t n);
  // Host <-> any copy for memory NCCL registered as `type` (a plain memcpy
  // for host memory).
  absl::Status CopyFor(int type, void* dst, const void* src, size_t n);
  // Waits for every copy queued so far; nothing when the stream was never used.
  void Synchronize();

  // For its lifetime: the copy context is current on this thread and the
  // stream exists (status() says whether both worked).
  class Scope;

 private:
  friend class Scope;
  friend class StagingPool;
  int dev_;
  cu::Stream stream_ = nullptr;
  cu::Context ctx_ = nullptr;
};

// A page-locked host buffer.
struct HostStage {
  char* p = nullptr;
  size_t cap = 0;
};

// Page-locked buffers and completion events of one comm, reused: NCCL keeps
// at most 8 operations in flight per connection. The owner synchronizes the
// stream before the pool goes.
class StagingPool {
 public:
  explicit StagingPool(CopyStream& stream) : stream_(stream) {}
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  absl::StatusOr<HostStage> Take(size_t n);
  // Back to the pool (or freed). A copy still running into or out of it
  // stays ordered before any later use: the comm has one stream.
  void Give(HostStage st);
  // Queues the copies {dst, src, bytes}, then records `*event` (taken from
  // the pool when null) after them.
  absl::Status StartCopies(const std::vector<std::array<uint64_t, 3>>& copies, cu::Event* event);
  // Whether the copies before `event` are done (true for a null event).
  absl::StatusOr<bool> Done(cu::Event event);
  void GiveEvent(cu::Event event);

 private:
  void Free(HostStage st);
  CopyStream& stream_;
  std::vector<HostStage> stages_;
  std::vector<cu::Event> events_;
};

}  // namespace podlink::ncclnet
