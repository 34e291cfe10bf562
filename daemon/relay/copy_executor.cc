#include "daemon/relay/copy_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/gpu/process_memory.h"

namespace podlink {
namespace {

const ComponentLog CopyLog("relay");

// Process memory to process memory goes through this much of the executor's
// memory at a time (small enough to stay in cache between the two copies).
constexpr uint64_t kBounceBytes = 256 << 10;

}  // namespace

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool CopyQueue::HasRunningUpTo(uint64_t seq) const {
  for (const Merged& m : unissued_) {
    if (m.first_seq <= seq) return true;
  }
  for (const auto& [key, q] : streams_) {
    if (!q.sealed.empty() && q.sealed.front().first_seq <= seq) return true;
  }
  return !host_jobs_.empty() && host_jobs_.front().seq <= seq;
}

CopyExecutor::CopyExecutor(size_t index, const cu::Driver* cuda, std::vector<cu::Context> contexts,
                           uint32_t streams_per_gpu, uint64_t bytes_per_event, uint64_t host_bytes_per_round,
                           uint64_t max_merge)
    : index_(index),
      cuda_(cuda),
      contexts_(std::move(contexts)),
      bytes_per_event_(bytes_per_event),
      host_bytes_per_round_(host_bytes_per_round),
      max_merge_(max_merge) {
  size_t ngpu = cuda_ != nullptr ? contexts_.size() : 0;
  streams_.assign(ngpu, {});
  next_stream_.assign(ngpu, 0);
  free_events_.assign(ngpu, {});
  for (size_t g = 0; g < ngpu; ++g) {
    if (contexts_[g] == nullptr) continue;
    cuda_->CtxSetCurrent(contexts_[g]);
    for (uint32_t k = 0; k < streams_per_gpu; ++k) {
      cu::Stream s = nullptr;
      if (cuda_->StreamCreate(&s, cu::kStreamNonBlocking) == cu::kSuccess) streams_[g].push_back(s);
    }
  }
}

CopyExecutor::~CopyExecutor() {
  if (cuda_ == nullptr) return;
  for (auto& per_gpu : free_events_) {
    for (cu::Event e : per_gpu) cuda_->EventDestroy(e);
  }
  for (auto& per_gpu : streams_) {
    for (cu::Stream s : per_gpu) cuda_->StreamDestroy(s);
  }
}

absl::Status CopyExecutor::Submit(CopyQueue& q, CopyRequest c) {
  const uint64_t src_addr = c.src_view.address + c.src_off;
  const uint64_t dst_addr = c.dst_view.address + c.dst_off;
  if ((c.src_view.mem_fd >= 0 && c.dst_view.on_gpu) || (c.dst_view.mem_fd >= 0 && c.src_view.on_gpu)) {
    return absl::UnimplementedError(
        "podlinkd's relay does not copy between GPU memory and process memory (malloc'd, numpy) yet: use "
        "podlink host memory (alloc_host, AllocateHost) on the host side");
  }
  if (!c.src_view.on_gpu && !c.dst_view.on_gpu) {
    CopyQueue::HostJob j;
    j.seq = q.next_seq_++;
    j.tag = c.tag;
    j.start_ns = c.start_ns;
    j.src_off = c.src_off;
    j.dst_off = c.dst_off;
    j.src_base = reinterpret_cast<const char*>(c.src_view.address);
    j.dst_base = reinterpret_cast<char*>(c.dst_view.address);
    j.src_fd = c.src_view.mem_fd;
    j.dst_fd = c.dst_view.mem_fd;
    j.left = c.length;
    j.src = std::move(c.src);
    j.dst = std::move(c.dst);
    q.host_jobs_.push_back(std::move(j));
    ++q.pending_;
    return absl::OkStatus();
  }
  if (cuda_ == nullptr) return absl::FailedPreconditionError("GPU relay needs CUDA in podlinkd");
  // The copy engine of the GPU that holds the source (or the destination
  // when the source is host memory) does the work.
  int gpu = c.src_view.on_gpu ? c.src_view.gpu : c.dst_view.gpu;
  if (gpu < 0 || gpu >= static_cast<int>(streams_.size()) || streams_[gpu].empty()) {
    return absl::InternalError(absl::StrCat("no relay stream on GPU ", gpu));
  }
  uint64_t seq = q.next_seq_++;
  ++q.pending_;
  q.gpu_bytes_ += c.length;
  for (CopyQueue::Merged& m : q.unissued_) {
    if (m.gpu == gpu && m.src + m.length == src_addr && m.dst + m.length == dst_addr &&
        m.length + c.length <= max_merge_) {
      m.length += c.length;
      m.tags.push_back(c.tag);
      m.keep.push_back(std::move(c.src));
      m.keep.push_back(std::move(c.dst));
      return absl::OkStatus();
    }
  }
  CopyQueue::Merged& m = q.unissued_.emplace_back();
  m.gpu = gpu;
  m.first_seq = seq;
  m.start_ns = c.start_ns;
  m.src = src_addr;
  m.dst = dst_addr;
  m.length = c.length;
  m.tags.push_back(c.tag);
  m.keep.push_back(std::move(c.src));
  m.keep.push_back(std::move(c.dst));
  return absl::OkStatus();
}

void CopyExecutor::Issue(CopyQueue& q, CopyQueue::Merged& m, OnDone done) {
  uint32_t si = next_stream_[m.gpu]++ % streams_[m.gpu].size();
  cuda_->CtxSetCurrent(contexts_[m.gpu]);
  cu::Result r = cuda_->MemcpyAsync(m.dst, m.src, m.length, streams_[m.gpu][si]);
  if (r != cu::kSuccess) {
    absl::Status st = cu::CuStatus(r, "cuMemcpyAsync");
    for (uint64_t t : m.tags) done(t, st, 0);
    q.pending_ -= m.tags.size();
    q.gpu_bytes_ -= m.length;
    return;
  }
  CopyQueue::StreamQueue& sq = q.streams_[{m.gpu, si}];
  CopyQueue::Group& g = sq.building;
  if (g.tags.empty()) {
    g.first_seq = m.first_seq;
    g.start_ns = m.start_ns;
  }
  g.tags.insert(g.tags.end(), m.tags.begin(), m.tags.end());
  g.bytes += m.length;
  for (auto& k : m.keep) g.keep.push_back(std::move(k));
  if (g.bytes >= bytes_per_event_) Seal(q, m.gpu, si, sq, done);
}

void CopyExecutor::SealFull(CopyQueue& q, OnDone done) {
  // Without merging, a copy starts as soon as it is taken.
  if (max_merge_ == 0) {
    for (CopyQueue::Merged& m : q.unissued_) Issue(q, m, done);
    q.unissued_.clear();
  }
  for (auto& [key, sq] : q.streams_) {
    if (sq.building.bytes >= bytes_per_event_) Seal(q, key.first, key.second, sq, done);
  }
}

cu::Event CopyExecutor::TakeEvent(int gpu) {
  std::vector<cu::Event>& pool = free_events_[gpu];
  if (!pool.empty()) {
    cu::Event e = pool.back();
    pool.pop_back();
    return e;
  }
  // Created in the current context, which the caller set to the GPU's.
  cu::Event e = nullptr;
  if (cuda_->EventCreate(&e, cu::kEventDisableTiming) != cu::kSuccess) return nullptr;
  return e;
}

void CopyExecutor::Seal(CopyQueue& q, int gpu, uint32_t si, CopyQueue::StreamQueue& sq, OnDone done) {
  CopyQueue::Group g = std::move(sq.building);
  sq.building = CopyQueue::Group();
  if (g.tags.empty()) return;
  cu::Stream stream = streams_[gpu][si];
  // One round may copy on several GPUs: events are made and recorded in the
  // context of the GPU whose stream they follow.
  cuda_->CtxSetCurrent(contexts_[gpu]);
  g.event = TakeEvent(gpu);
  cu::Result rec = g.event == nullptr ? cu::kErrorNotReady : cuda_->EventRecord(g.event, stream);
  if (rec != cu::kSuccess) {
    // No event to poll: finish synchronously (slow: this thread waits).
    if (!warned_sync_) {
      warned_sync_ = true;
      CopyLog()->warn("event=relay_sync_fallback worker={} gpu={} error={}", index_, gpu,
                  LogQuoted(g.event == nullptr ? std::string("cuEventCreate failed")
                                               : std::string(cu::CuStatus(rec, "cuEventRecord").message())));
    }
    absl::Status st = cu::CuStatus(cuda_->StreamSynchronize(stream), "relay copy");
    double secs = (NowNs() - g.start_ns) * 1e-9;
    for (uint64_t t : g.tags) done(t, st, secs);
    q.pending_ -= g.tags.size();
    q.gpu_bytes_ -= g.bytes;
    // An event that failed to record is not trusted again.
    if (g.event != nullptr) cuda_->EventDestroy(g.event);
    return;
  }
  sq.sealed.push_back(std::move(g));
}

void CopyExecutor::SealRound(CopyQueue& q, OnDone done) {
  for (CopyQueue::Merged& m : q.unissued_) Issue(q, m, done);
  q.unissued_.clear();
  for (auto& [key, sq] : q.streams_) {
    if (!sq.building.tags.empty()) Seal(q, key.first, key.second, sq, done);
  }
}

bool CopyExecutor::PollGpu(CopyQueue& q, OnDone done) {
  bool progress = false;
  for (auto& [key, sq] : q.streams_) {
    while (!sq.sealed.empty()) {
      CopyQueue::Group& g = sq.sealed.front();
      cu::Result res = cuda_->EventQuery(g.event);
      if (res == cu::kErrorNotReady) break;
      progress = true;
      absl::Status st = cu::CuStatus(res, "relay copy");
      double secs = (NowNs() - g.start_ns) * 1e-9;
      for (uint64_t t : g.tags) done(t, st, secs);
      q.pending_ -= g.tags.size();
      q.gpu_bytes_ -= g.bytes;
      free_events_[key.first].push_back(g.event);
      sq.sealed.pop_front();
    }
  }
  return progress;
}

bool CopyExecutor::RunHost(CopyQueue& q, OnDone done) {
  uint64_t budget = host_bytes_per_round_;
  bool progress = false;
  while (!q.host_jobs_.empty() && budget > 0) {
    CopyQueue::HostJob& j = q.host_jobs_.front();
    uint64_t n = std::min(j.left, budget);
    // Checked slice by slice: a page the client punched out since the last
    // slice would be allocated on podlinkd's account by the copy.
    absl::Status st = j.src->memory->CheckPopulated(j.src_off, n);
    if (st.ok()) st = j.dst->memory->CheckPopulated(j.dst_off, n);
    if (st.ok() && (j.src_fd >= 0 || j.dst_fd >= 0)) {
      st = CopyProcessSlice(j, n);
    } else if (st.ok()) {
      std::memcpy(j.dst_base + j.dst_off, j.src_base + j.src_off, n);
    }
    if (st.ok()) {
      j.src_off += n;
      j.dst_off += n;
      j.left -= n;
      budget -= n;
    }
    progress = true;
    if (st.ok() && j.left > 0) break;  // budget spent; the rest next round
    done(j.tag, st, (NowNs() - j.start_ns) * 1e-9);
    --q.pending_;
    q.host_jobs_.pop_front();
  }
  return progress;
}

absl::Status CopyExecutor::CopyProcessSlice(const CopyQueue::HostJob& j, uint64_t n) {
  const uint64_t src = reinterpret_cast<uint64_t>(j.src_base) + j.src_off;
  const uint64_t dst = reinterpret_cast<uint64_t>(j.dst_base) + j.dst_off;
  // The export is named only in a failure (no formatting per slice).
  auto named = [](absl::Status st, const ExportRecord& r) {
    return st.ok() ? st : absl::Status(st.code(), absl::StrCat("export ", r.id, ": ", st.message()));
  };
  if (j.dst_fd < 0) return named(ProcessRead(j.src_fd, src, j.dst_base + j.dst_off, n, ""), *j.src);
  if (j.src_fd < 0) return named(ProcessWrite(j.dst_fd, dst, j.src_base + j.src_off, n, ""), *j.dst);
  if (bounce_ == nullptr) bounce_ = std::make_unique<char[]>(kBounceBytes);
  for (uint64_t at = 0; at < n; at += kBounceBytes) {
    uint64_t len = std::min(kBounceBytes, n - at);
    if (absl::Status st = ProcessRead(j.src_fd, src + at, bounce_.get(), len, ""); !st.ok()) return named(st, *j.src);
    if (absl::Status st = ProcessWrite(j.dst_fd, dst + at, bounce_.get(), len, ""); !st.ok()) return named(st, *j.dst);
  }
  return absl::OkStatus();
}

void CopyExecutor::Drain(CopyQueue& q) {
  for (auto& [key, sq] : q.streams_) {
    for (CopyQueue::Group& g : sq.sealed) {
      cuda_->EventSynchronize(g.event);
      free_events_[key.first].push_back(g.event);
    }
    sq.sealed.clear();
  }
  q.streams_.clear();
  q.host_jobs_.clear();
  q.unissued_.clear();
  q.pending_ = 0;
  q.gpu_bytes_ = 0;
}

}  // namespace podlink
