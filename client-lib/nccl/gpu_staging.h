// GPU copies of the NCCL net plugin, all in CUDA contexts of the plugin's
// own (see CopyContext in gpu_staging.cc), on one stream per comm: bounce
// buffer copies that wait, and the TCP transport's page-locked staging with
// asynchronous copies and completion events.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda_driver.h"

namespace podlink::ncclnet {

class State;
struct Comm;
struct Request;

// A page-locked host buffer.
struct HostStage {
  char* p = nullptr;
  size_t cap = 0;
};

absl::StatusOr<cu::Context> CopyContext(State& s, int dev);

// Copies on the comm's stream and waits for that stream only.
absl::Status CopyAndWait(Comm& c, uint64_t dst, uint64_t src, size_t n);
// Host <-> any copy for memory NCCL registered as `type`.
absl::Status CopyFor(Comm& c, int type, void* dst, const void* src, size_t n);

absl::StatusOr<HostStage> TakeStage(Comm& c, size_t n);
void FreeStage(Comm& c, HostStage st);
void GiveStage(Comm& c, HostStage st);
// Queues the copies {dst, src, bytes}, then the request's completion event.
absl::Status StartCopies(Comm& c, Request& r, const std::vector<std::array<uint64_t, 3>>& copies);
absl::StatusOr<bool> CopiesDone(Comm& c, Request& r);

}  // namespace podlink::ncclnet
