#include "client-lib/nccl/gpu_staging.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "client-lib/nccl/comm.h"
#include "client-lib/nccl/plugin.h"
#include "common/status_util.h"

namespace podlink::ncclnet {

using nccl_abi::kInternalError;
using nccl_abi::kInvalidArgument;
using nccl_abi::kInvalidUsage;
using nccl_abi::kRemoteError;
using nccl_abi::kSuccess;
using nccl_abi::kSystemError;
using nccl_abi::kUnhandledCudaError;

// Staging copies run in a CUDA context of the plugin's own, never in the
// application's. With lazy module loading (CUDA's default) an application
// thread that launches a kernel for the first time loads its module and
// synchronizes the context while holding it; that waits for NCCL's running
// kernel, which waits for the proxy thread, whose copy issued in the same
// context waits for the loader: a deadlock, seen on the H200 pair with the
// TCP transport (docs/nccl.md). A second context on the device does not take
// part in that synchronization. Created once per device, destroyed at the
// last finalize.
absl::StatusOr<cu::Context> CopyContext(State& s, int dev) {
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.copy_ctx.find(dev);
  if (it != s.copy_ctx.end()) return it->second;
  cu::Device device = 0;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(s.cuda->DeviceGet(&device, dev), "cuDeviceGet"));
  cu::Context ctx = nullptr;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(s.cuda->CtxCreate(&ctx, 0, device), "cuCtxCreate"));
  cu::Context popped = nullptr;
  (void)s.cuda->CtxPopCurrent(&popped);  // cuCtxCreate pushed it; the caller's context is current again
  s.copy_ctx[dev] = ctx;
  return ctx;
}

// For its lifetime: the plugin's copy context is current on this thread and
// the comm has its stream (created in that context on first use).
class CopyScope {
 public:
  explicit CopyScope(Comm& c) {
    State& s = S();
    d_ = s.cuda;
    if (d_ == nullptr) {
      status_ = absl::FailedPreconditionError("GPU memory without a CUDA driver");
      return;
    }
    if (c.stream != nullptr) {  // the usual case (every test() of a staged request): no lookup
      use_.emplace(*d_, c.stream_ctx);
      status_ = use_->status();
      return;
    }
    auto ctx = CopyContext(s, c.dev);
    if (!ctx.ok()) {
      status_ = ctx.status();
      return;
    }
    use_.emplace(*d_, *ctx);
    status_ = use_->status();
    if (status_.ok()) {
      status_ = cu::CuStatus(d_->StreamCreate(&c.stream, cu::kStreamNonBlocking), "cuStreamCreate");
      if (status_.ok()) c.stream_ctx = *ctx;
    }
  }
  const absl::Status& status() const { return status_; }
  const cu::Driver& d() const { return *d_; }

 private:
  const cu::Driver* d_ = nullptr;
  std::optional<cu::ScopedContext> use_;
  absl::Status status_;
};

// Copies on the comm's stream and waits for that stream only (the podlink
// transport's bounce buffers): NCCL's kernels keep running meanwhile.
absl::Status CopyAndWait(Comm& c, uint64_t dst, uint64_t src, size_t n) {
  CopyScope scope(c);
  PODLINK_RETURN_IF_ERROR(scope.status());
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(scope.d().MemcpyAsync(dst, src, n, c.stream), "cuMemcpyAsync"));
  return cu::CuStatus(scope.d().StreamSynchronize(c.stream), "cuStreamSynchronize");
}

// Host <-> any copy for memory NCCL registered as `type`.
absl::Status CopyFor(Comm& c, int type, void* dst, const void* src, size_t n) {
  if (n == 0) return absl::OkStatus();
  if (type == nccl_abi::kPtrHost) {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  return CopyAndWait(c, reinterpret_cast<uint64_t>(dst), reinterpret_cast<uint64_t>(src), n);
}

// The TCP transport stages GPU memory through page-locked host buffers with
// asynchronous copies on the comm's stream, so the proxy thread never waits
// for the GPU: a send's pieces go to the sockets once its event completes, a
// receive reports done once its copies to the GPU have.
constexpr size_t kStageRound = 64 << 10;
constexpr size_t kStagePoolMax = 8;  // NCCL keeps at most NCCL_STEPS (8) operations in flight per connection

absl::StatusOr<HostStage> TakeStage(Comm& c, size_t n) {
  for (size_t i = 0; i < c.stage_pool.size(); ++i) {
    if (c.stage_pool[i].cap >= n) {
      HostStage st = c.stage_pool[i];
      c.stage_pool[i] = c.stage_pool.back();
      c.stage_pool.pop_back();
      return st;
    }
  }
  CopyScope scope(c);
  PODLINK_RETURN_IF_ERROR(scope.status());
  HostStage st;
  st.cap = std::max(kStageRound, (n + kStageRound - 1) / kStageRound * kStageRound);
  void* p = nullptr;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(scope.d().MemHostAlloc(&p, st.cap, 0), "cuMemHostAlloc"));
  st.p = static_cast<char*>(p);
  return st;
}

void FreeStage(Comm& c, HostStage st) {
  CopyScope scope(c);
  if (scope.status().ok()) (void)scope.d().MemFreeHost(st.p);
}

void GiveStage(Comm& c, HostStage st) {
  if (st.p == nullptr) return;
  if (c.stage_pool.size() < kStagePoolMax) {
    c.stage_pool.push_back(st);
  } else {
    FreeStage(c, st);
  }
}

// Queues the copies, then the request's completion event, on the comm's stream.
absl::Status StartCopies(Comm& c, Request& r, const std::vector<std::array<uint64_t, 3>>& copies) {
  CopyScope scope(c);
  PODLINK_RETURN_IF_ERROR(scope.status());
  const cu::Driver& d = scope.d();
  for (const auto& [dst, src, n] : copies) {
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.MemcpyAsync(dst, src, n, c.stream), "cuMemcpyAsync"));
  }
  if (r.copied == nullptr) {
    if (!c.event_pool.empty()) {
      r.copied = c.event_pool.back();
      c.event_pool.pop_back();
    } else {
      PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.EventCreate(&r.copied, cu::kEventDisableTiming), "cuEventCreate"));
    }
  }
  return cu::CuStatus(d.EventRecord(r.copied, c.stream), "cuEventRecord");
}

absl::StatusOr<bool> CopiesDone(Comm& c, Request& r) {
  if (r.copied == nullptr) return true;
  CopyScope scope(c);
  PODLINK_RETURN_IF_ERROR(scope.status());
  cu::Result q = scope.d().EventQuery(r.copied);
  if (q == cu::kErrorNotReady) return false;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(q, "cuEventQuery"));
  return true;
}

}  // namespace podlink::ncclnet
