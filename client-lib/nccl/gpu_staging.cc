#include "client-lib/nccl/gpu_staging.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>

#include "client-lib/nccl/plugin.h"
#include "common/status_util.h"

namespace podlink::ncclnet {
namespace {

// Copies run in a CUDA context of the plugin's own, never in the
// application's. With lazy module loading (CUDA's default) an application
// thread that launches a kernel for the first time loads its module and
// synchronizes the context while holding it; that waits for NCCL's running
// kernel, which waits for the proxy thread, whose copy issued in the same
// context waits for the loader: a deadlock (docs/nccl.md has the case). A
// second context on the device does not take part in that synchronization.
// Created once per device, destroyed at the last finalize.
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

constexpr size_t kStageRound = 64 << 10;
constexpr size_t kStagePoolMax = 8;  // NCCL keeps at most NCCL_STEPS (8) operations in flight per connection

}  // namespace

class CopyStream::Scope {
 public:
  explicit Scope(CopyStream& cs) {
    State& s = S();
    d_ = s.cuda;
    if (d_ == nullptr) {
      status_ = absl::FailedPreconditionError("GPU memory without a CUDA driver");
      return;
    }
    if (cs.stream_ != nullptr) {  // the usual case (every test() of a staged request): no lookup
      use_.emplace(*d_, cs.ctx_);
      status_ = use_->status();
      return;
    }
    auto ctx = CopyContext(s, cs.dev_);
    if (!ctx.ok()) {
      status_ = ctx.status();
      return;
    }
    use_.emplace(*d_, *ctx);
    status_ = use_->status();
    if (status_.ok()) {
      status_ = cu::CuStatus(d_->StreamCreate(&cs.stream_, cu::kStreamNonBlocking), "cuStreamCreate");
      if (status_.ok()) cs.ctx_ = *ctx;
    }
  }
  const absl::Status& status() const { return status_; }
  const cu::Driver& d() const { return *d_; }

 private:
  const cu::Driver* d_ = nullptr;
  std::optional<cu::ScopedContext> use_;
  absl::Status status_;
};

CopyStream::~CopyStream() {
  const cu::Driver* d = S().cuda;
  if (stream_ == nullptr || d == nullptr) return;
  cu::ScopedContext use(*d, ctx_);
  (void)d->StreamSynchronize(stream_);
  d->StreamDestroy(stream_);
}

void CopyStream::Synchronize() {
  const cu::Driver* d = S().cuda;
  if (stream_ == nullptr || d == nullptr) return;
  cu::ScopedContext use(*d, ctx_);
  (void)d->StreamSynchronize(stream_);
}

absl::Status CopyStream::CopyAndWait(uint64_t dst, uint64_t src, size_t n) {
  Scope scope(*this);
  PODLINK_RETURN_IF_ERROR(scope.status());
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(scope.d().MemcpyAsync(dst, src, n, stream_), "cuMemcpyAsync"));
  return cu::CuStatus(scope.d().StreamSynchronize(stream_), "cuStreamSynchronize");
}

absl::Status CopyStream::CopyFor(int type, void* dst, const void* src, size_t n) {
  if (n == 0) return absl::OkStatus();
  if (type == nccl_abi::kPtrHost) {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  return CopyAndWait(reinterpret_cast<uint64_t>(dst), reinterpret_cast<uint64_t>(src), n);
}

StagingPool::~StagingPool() {
  if (stages_.empty() && events_.empty()) return;
  CopyStream::Scope scope(stream_);
  if (!scope.status().ok()) return;
  for (HostStage& st : stages_) (void)scope.d().MemFreeHost(st.p);
  for (cu::Event e : events_) scope.d().EventDestroy(e);
}

absl::StatusOr<HostStage> StagingPool::Take(size_t n) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (stages_[i].cap >= n) {
      HostStage st = stages_[i];
      stages_[i] = stages_.back();
      stages_.pop_back();
      return st;
    }
  }
  CopyStream::Scope scope(stream_);
  PODLINK_RETURN_IF_ERROR(scope.status());
  HostStage st;
  st.cap = std::max(kStageRound, (n + kStageRound - 1) / kStageRound * kStageRound);
  void* p = nullptr;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(scope.d().MemHostAlloc(&p, st.cap, 0), "cuMemHostAlloc"));
  st.p = static_cast<char*>(p);
  return st;
}

void StagingPool::Free(HostStage st) {
  CopyStream::Scope scope(stream_);
  if (scope.status().ok()) (void)scope.d().MemFreeHost(st.p);
}

void StagingPool::Give(HostStage st) {
  if (st.p == nullptr) return;
  if (stages_.size() < kStagePoolMax) {
    stages_.push_back(st);
  } else {
    Free(st);
  }
}

absl::Status StagingPool::StartCopies(const std::vector<std::array<uint64_t, 3>>& copies, cu::Event* event) {
  CopyStream::Scope scope(stream_);
  PODLINK_RETURN_IF_ERROR(scope.status());
  const cu::Driver& d = scope.d();
  for (const auto& [dst, src, n] : copies) {
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.MemcpyAsync(dst, src, n, stream_.stream_), "cuMemcpyAsync"));
  }
  if (*event == nullptr) {
    if (!events_.empty()) {
      *event = events_.back();
      events_.pop_back();
    } else {
      PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.EventCreate(event, cu::kEventDisableTiming), "cuEventCreate"));
    }
  }
  return cu::CuStatus(d.EventRecord(*event, stream_.stream_), "cuEventRecord");
}

absl::StatusOr<bool> StagingPool::Done(cu::Event event) {
  if (event == nullptr) return true;
  CopyStream::Scope scope(stream_);
  PODLINK_RETURN_IF_ERROR(scope.status());
  cu::Result q = scope.d().EventQuery(event);
  if (q == cu::kErrorNotReady) return false;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(q, "cuEventQuery"));
  return true;
}

void StagingPool::GiveEvent(cu::Event event) {
  if (event != nullptr) events_.push_back(event);
}

}  // namespace podlink::ncclnet
