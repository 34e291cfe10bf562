#include "client-lib/transports/mapped_backend.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace podlink {

InProcessStream::~InProcessStream() {
  for (cu::Event e : free_events_) cuda_->EventDestroy(e);
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
  cu::ScopedContext in(*cuda_, ctx_);  // the caller's context is current again after
  PODLINK_RETURN_IF_ERROR(in.status());
  return cu::CuStatus(cuda_->StreamCreate(&stream_, cu::kStreamNonBlocking), "cuStreamCreate");
}

cu::Event InProcessStream::TakeEvent() {
  if (!free_events_.empty()) {
    cu::Event e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cu::Event e = nullptr;
  return cuda_->EventCreate(&e, cu::kEventDisableTiming) == cu::kSuccess ? e : nullptr;
}

absl::StatusOr<InProcessStream*> InProcessStreams::For(int device) {
  if (device < 0) return absl::InvalidArgumentError("no GPU to run an in-process copy on");
  std::unique_ptr<InProcessStream>& s = streams_[device];
  if (s == nullptr) s = std::make_unique<InProcessStream>(device);
  PODLINK_RETURN_IF_ERROR(s->Ensure());
  return s.get();
}

MappedBackend::~MappedBackend() {
  for (auto& [batch, events] : events_) {
    for (auto& [s, e] : events) s->cuda()->EventDestroy(e);
  }
}

absl::Status MappedBackend::Submit(uint64_t batch, const Copy& c) {
  uint64_t local = c.local_addr + c.op->local_offset;
  uint64_t remote = c.remote_addr + c.op->remote_offset;
  uint64_t dst = c.write ? remote : local, src = c.write ? local : remote;
  if (c.local_is_host && c.remote_is_host) {
    std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), c.op->length);
    return absl::OkStatus();
  }
  PODLINK_ASSIGN_OR_RETURN(InProcessStream * s, streams_.For(c.device));
  // In the stream's context, and the caller's (NCCL's proxy thread's) after:
  // a copy issued in another context than its stream's fails INVALID_VALUE.
  cu::ScopedContext in(*s->cuda(), s->context());
  PODLINK_RETURN_IF_ERROR(in.status());
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(s->cuda()->MemcpyAsync(dst, src, c.op->length, s->stream()),
                                       absl::StrCat("cuMemcpyAsync on GPU ", c.device).c_str()));
  queued_[batch].insert(s);
  return absl::OkStatus();
}

void MappedBackend::Flush(uint64_t batch) {
  auto it = queued_.find(batch);
  if (it == queued_.end()) return;
  std::set<InProcessStream*> used = std::move(it->second);
  queued_.erase(it);
  for (InProcessStream* s : used) {
    const cu::Driver* cuda = s->cuda();
    cu::ScopedContext in(*cuda, s->context());  // events belong to the stream's context
    cu::Event e = s->TakeEvent();
    if (e == nullptr || cuda->EventRecord(e, s->stream()) != cu::kSuccess) {
      // No event: wait for the copies now; this part is then complete (and
      // the batch fails if they did).
      cu::Result r = cuda->StreamSynchronize(s->stream());
      if (e != nullptr) cuda->EventDestroy(e);
      if (r != cu::kSuccess && !failed_.contains(batch)) failed_[batch] = cu::CuStatus(r, "in-process copy");
      continue;
    }
    events_[batch].push_back({s, e});
  }
}

absl::StatusOr<bool> MappedBackend::Poll(uint64_t batch, absl::Status* result) {
  auto it = events_.find(batch);
  if (it != events_.end()) {
    auto& events = it->second;
    while (!events.empty()) {
      auto [s, e] = events.back();
      cu::Result q = s->cuda()->EventQuery(e);
      if (q == cu::kErrorNotReady) return false;
      if (q == cu::kSuccess) {
        s->GiveEvent(e);
      } else {
        if (!failed_.contains(batch)) failed_[batch] = cu::CuStatus(q, "in-process copy");
        s->cuda()->EventDestroy(e);  // not trusted again
      }
      events.pop_back();
    }
    events_.erase(it);
  }
  if (auto f = failed_.find(batch); f != failed_.end()) {
    *result = f->second;
    failed_.erase(f);
  }
  return true;
}

absl::Status MappedBackend::Fence() {
  for (auto& [batch, events] : events_) {
    for (auto& [s, e] : events) {
      PODLINK_RETURN_IF_ERROR(cu::CuStatus(s->cuda()->EventSynchronize(e), "cuEventSynchronize"));
    }
  }
  return absl::OkStatus();
}

void MappedBackend::Abandon(uint64_t batch) {
  queued_.erase(batch);
  failed_.erase(batch);
  auto it = events_.find(batch);
  if (it == events_.end()) return;
  for (auto& [s, e] : it->second) s->cuda()->EventDestroy(e);
  events_.erase(it);
}

}  // namespace podlink
