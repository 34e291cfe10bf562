#include "client-lib/transports/mapped_backend.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<InProcessStream*> InProcessStreams::For(int device) {
  if (device < 0) return absl::InvalidArgumentError("no GPU to run an in-process copy on");
  std::unique_ptr<InProcessStream>& s = streams_[device];
  if (s == nullptr) s = std::make_unique<InProcessStream>(device);
  PODLINK_RETURN_IF_ERROR(s->Ensure());
  return s.get();
}

const cu::Driver* InProcessStreams::cuda() const {
  for (const auto& [device, s] : streams_) {
    if (s->cuda() != nullptr) return s->cuda();
  }
  return nullptr;
}

MappedBackend::~MappedBackend() {
  const cu::Driver* cuda = streams_.cuda();
  for (auto& [batch, events] : events_) {
    for (cu::Event e : events) cuda->EventDestroy(e);
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
    cu::Event e = nullptr;
    if (cuda->EventCreate(&e, cu::kEventDisableTiming) != cu::kSuccess ||
        cuda->EventRecord(e, s->stream()) != cu::kSuccess) {
      // No event: wait for the copies now; this part is then complete (and
      // the batch fails if they did).
      cu::Result r = cuda->StreamSynchronize(s->stream());
      if (e != nullptr) cuda->EventDestroy(e);
      if (r != cu::kSuccess && !failed_.contains(batch)) failed_[batch] = cu::CuStatus(r, "in-process copy");
      continue;
    }
    events_[batch].push_back(e);
  }
}

absl::StatusOr<bool> MappedBackend::Poll(uint64_t batch, absl::Status* result) {
  auto it = events_.find(batch);
  if (it != events_.end()) {
    const cu::Driver* cuda = streams_.cuda();
    std::vector<cu::Event>& events = it->second;
    while (!events.empty()) {
      cu::Result q = cuda->EventQuery(events.back());
      if (q == cu::kErrorNotReady) return false;
      if (q != cu::kSuccess && !failed_.contains(batch)) failed_[batch] = cu::CuStatus(q, "in-process copy");
      cuda->EventDestroy(events.back());
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
  const cu::Driver* cuda = streams_.cuda();
  for (auto& [batch, events] : events_) {
    for (cu::Event e : events) PODLINK_RETURN_IF_ERROR(cu::CuStatus(cuda->EventSynchronize(e), "cuEventSynchronize"));
  }
  return absl::OkStatus();
}

void MappedBackend::Abandon(uint64_t batch) {
  queued_.erase(batch);
  failed_.erase(batch);
  auto it = events_.find(batch);
  if (it == events_.end()) return;
  for (cu::Event e : it->second) streams_.cuda()->EventDestroy(e);
  events_.erase(it);
}

}  // namespace podlink
