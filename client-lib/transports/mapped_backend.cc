#include "client-lib/transports/mapped_backend.h"

#include <cstring>

#include "common/status_util.h"

namespace podlink {

MappedBackend::~MappedBackend() {
  if (cuda_ == nullptr) return;
  for (auto& [batch, e] : events_) cuda_->EventDestroy(e);
  if (stream_ != nullptr) cuda_->StreamDestroy(stream_);
}

absl::Status MappedBackend::EnsureStream() {
  if (stream_ != nullptr) return absl::OkStatus();
  PODLINK_ASSIGN_OR_RETURN(cuda_, cu::LoadDriver());
  cu::Context ctx = nullptr;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(cuda_->DevicePrimaryCtxRetain(&ctx, device_), "cuDevicePrimaryCtxRetain"));
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(cuda_->CtxSetCurrent(ctx), "cuCtxSetCurrent"));
  return cu::CuStatus(cuda_->StreamCreate(&stream_, cu::kStreamNonBlocking), "cuStreamCreate");
}

absl::Status MappedBackend::Submit(uint64_t batch, const Copy& c) {
  uint64_t local = c.local_addr + c.op->local_offset;
  uint64_t remote = c.remote_addr + c.op->remote_offset;
  uint64_t dst = c.write ? remote : local, src = c.write ? local : remote;
  if (c.local_is_host && c.remote_is_host) {
    std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), c.op->length);
    return absl::OkStatus();
  }
  PODLINK_RETURN_IF_ERROR(EnsureStream());
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(cuda_->MemcpyAsync(dst, src, c.op->length, stream_), "cuMemcpyAsync"));
  queued_[batch] = true;
  return absl::OkStatus();
}

void MappedBackend::Flush(uint64_t batch) {
  if (queued_.erase(batch) == 0) return;
  cu::Event e = nullptr;
  if (cuda_->EventCreate(&e, cu::kEventDisableTiming) != cu::kSuccess || cuda_->EventRecord(e, stream_) != cu::kSuccess) {
    // No event: wait for the copies now; the batch is then complete.
    cu::Result r = cuda_->StreamSynchronize(stream_);
    if (e != nullptr) cuda_->EventDestroy(e);
    if (r != cu::kSuccess) failed_[batch] = cu::CuStatus(r, "in-process copy");
    return;
  }
  events_[batch] = e;
}

absl::StatusOr<bool> MappedBackend::Poll(uint64_t batch, absl::Status* result) {
  if (auto f = failed_.find(batch); f != failed_.end()) {
    *result = f->second;
    failed_.erase(f);
    return true;
  }
  auto it = events_.find(batch);
  if (it == events_.end()) return true;
  cu::Result q = cuda_->EventQuery(it->second);
  if (q == cu::kErrorNotReady) return false;
  if (q != cu::kSuccess) *result = cu::CuStatus(q, "in-process copy");
  cuda_->EventDestroy(it->second);
  events_.erase(it);
  return true;
}

absl::Status MappedBackend::Fence() {
  for (auto& [batch, e] : events_) {
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(cuda_->EventSynchronize(e), "cuEventSynchronize"));
  }
  return absl::OkStatus();
}

void MappedBackend::Abandon(uint64_t batch) {
  queued_.erase(batch);
  failed_.erase(batch);
  auto it = events_.find(batch);
  if (it == events_.end()) return;
  cuda_->EventDestroy(it->second);
  events_.erase(it);
}

}  // namespace podlink
