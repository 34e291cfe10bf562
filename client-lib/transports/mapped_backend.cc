#include "client-lib/transports/mapped_backend.h"

#include <cstring>

#include "common/status_util.h"

namespace podlink {

InProcessStream::~InProcessStream() {
  if (stream_ != nullptr) cuda_->StreamDestroy(stream_);
  if (ctx_ != nullptr) cuda_->DevicePrimaryCtxRelease(device_);
}

absl::Status InProcessStream::Ensure() {
  if (stream_ != nullptr) return absl::OkStatus();
  if (cuda_ == nullptr) {
    PODLINK_ASSIGN_OR_RETURN(cuda_, cu::LoadDriver());
  }
  if (ctx_ == nullptr) {
    PODLINK_RETURN_IF_ERROR(
        cu::CuStatus(cuda_->DevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain"));
  }
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(cuda_->CtxSetCurrent(ctx_), "cuCtxSetCurrent"));
  return cu::CuStatus(cuda_->StreamCreate(&stream_, cu::kStreamNonBlocking), "cuStreamCreate");
}

MappedBackend::~MappedBackend() {
  for (auto& [batch, e] : events_) stream_.cuda()->EventDestroy(e);
}

absl::Status MappedBackend::Submit(uint64_t batch, const Copy& c) {
  uint64_t local = c.local_addr + c.op->local_offset;
  uint64_t remote = c.remote_addr + c.op->remote_offset;
  uint64_t dst = c.write ? remote : local, src = c.write ? local : remote;
  if (c.local_is_host && c.remote_is_host) {
    std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), c.op->length);
    return absl::OkStatus();
  }
  PODLINK_RETURN_IF_ERROR(stream_.Ensure());
  PODLINK_RETURN_IF_ERROR(
      cu::CuStatus(stream_.cuda()->MemcpyAsync(dst, src, c.op->length, stream_.stream()), "cuMemcpyAsync"));
  queued_[batch] = true;
  return absl::OkStatus();
}

void MappedBackend::Flush(uint64_t batch) {
  if (queued_.erase(batch) == 0) return;
  const cu::Driver* cuda = stream_.cuda();
  cu::Event e = nullptr;
  if (cuda->EventCreate(&e, cu::kEventDisableTiming) != cu::kSuccess ||
      cuda->EventRecord(e, stream_.stream()) != cu::kSuccess) {
    // No event: wait for the copies now; the batch is then complete (and
    // fails if they did).
    cu::Result r = cuda->StreamSynchronize(stream_.stream());
    if (e != nullptr) cuda->EventDestroy(e);
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
  cu::Result q = stream_.cuda()->EventQuery(it->second);
  if (q == cu::kErrorNotReady) return false;
  if (q != cu::kSuccess) *result = cu::CuStatus(q, "in-process copy");
  stream_.cuda()->EventDestroy(it->second);
  events_.erase(it);
  return true;
}

absl::Status MappedBackend::Fence() {
  for (auto& [batch, e] : events_) {
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(stream_.cuda()->EventSynchronize(e), "cuEventSynchronize"));
  }
  return absl::OkStatus();
}

void MappedBackend::Abandon(uint64_t batch) {
  queued_.erase(batch);
  failed_.erase(batch);
  auto it = events_.find(batch);
  if (it == events_.end()) return;
  stream_.cuda()->EventDestroy(it->second);
  events_.erase(it);
}

}  // namespace podlink
