// The relay's copy executor: moves bytes for one relay worker, knowing
// nothing of rings, sessions or policy (the ring server, relay_engine.*,
// validates requests and hands over resolved copies; the inter-node path
// can hand over its own).
//
// GPU copies: cuMemcpyAsync on the executor's non-blocking streams of the
// GPU doing the work (several per GPU, round-robin; never a kernel), in that
// GPU's primary context. Copies submitted in one round are issued when the
// round is sealed, and a copy that continues another of the round (the next
// bytes of the same source into the next bytes of the same destination, as
// NCCL's consecutive steps of one channel are) is merged into it, up to
// max_merge bytes: a backlog becomes fewer, larger copies, which the copy
// engines move faster. Copies of one queue on one stream share a
// completion event until they add up to bytes_per_event, so small copies
// complete in bulk and large ones one by one; a stream is FIFO, so only its
// oldest event is ever queried. Events are pooled per GPU (an event works
// only in the context it was created in). Host-to-host copies are memcpy on
// the caller's thread, a budget of bytes per round, so one large copy delays
// others by one slice only. Process memory (a view with mem_fd) is read or
// written with pread/pwrite on the exporter's /proc/<pid>/mem, straight into
// or out of the other side's mapping, or through a bounce buffer of the
// executor's when both sides are process memory; it never meets a GPU copy.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/cuda_driver.h"
#include "daemon/registry/registry.h"

namespace podlink {

// The steady clock in nanoseconds: what the executor and the relay time copies with.
uint64_t NowNs();

// One resolved copy. `src`/`dst` are the exports (kept alive until the copy
// completes); addresses are the daemon's own mappings.
struct CopyRequest {
  uint64_t tag = 0;       // returned in the completion (the ring's user_data)
  uint64_t start_ns = 0;  // for the latency reported at completion
  std::shared_ptr<const ExportRecord> src, dst;
  RelayView src_view, dst_view;
  uint64_t src_off = 0, dst_off = 0;
  uint64_t length = 0;
};

// A client's copies in flight (one per relay ring), completed in order per
// stream. Owned by the client, used only by the executor.
class CopyQueue {
 public:
  // Copies taken and not yet completed.
  uint64_t pending() const { return pending_; }
  // Bytes of GPU copies taken and not yet completed.
  uint64_t gpu_bytes() const { return gpu_bytes_; }
  // Whether a copy with sequence number <= seq is still running.
  bool HasRunningUpTo(uint64_t seq) const;

 private:
  friend class CopyExecutor;
  struct Group {  // copies on one stream, completed by one event
    uint64_t first_seq = 0;
    uint64_t start_ns = 0;
    uint64_t bytes = 0;
    cu::Event event = nullptr;
    std::vector<uint64_t> tags;
    std::vector<std::shared_ptr<const ExportRecord>> keep;  // memory stays alive while copying
  };
  struct StreamQueue {
    std::deque<Group> sealed;
    Group building;  // copies of the current round not yet under an event
  };
  struct Merged {  // GPU copies of this round not yet issued; contiguous ones merged
    int gpu = 0;
    uint64_t first_seq = 0;
    uint64_t start_ns = 0;
    uint64_t src = 0, dst = 0, length = 0;
    std::vector<uint64_t> tags;
    std::vector<std::shared_ptr<const ExportRecord>> keep;
  };
  struct HostJob {  // a host-to-host copy in progress, a slice per round
    uint64_t seq = 0;
    uint64_t tag = 0;
    uint64_t start_ns = 0;
    std::shared_ptr<const ExportRecord> src, dst;
    uint64_t src_off = 0, dst_off = 0;  // next byte, within the exports
    const char* src_base = nullptr;  // the daemon's mapping; with src_fd, the exporter's address (not a pointer)
    char* dst_base = nullptr;
    int src_fd = -1, dst_fd = -1;    // process memory: the exporter's /proc/<pid>/mem
    uint64_t left = 0;
  };
  std::map<std::pair<int, uint32_t>, StreamQueue> streams_;  // (gpu, stream index)
  std::deque<HostJob> host_jobs_;                            // in submission order
  std::vector<Merged> unissued_;                             // this round's GPU copies
  uint64_t next_seq_ = 1;
  uint64_t pending_ = 0;
  uint64_t gpu_bytes_ = 0;
};

class CopyExecutor {
 public:
  // tag, outcome, seconds since the request's start_ns.
  using OnDone = absl::FunctionRef<void(uint64_t tag, const absl::Status& st, double seconds)>;

  // `contexts`: per daemon GPU ordinal, the retained primary context (null:
  // that GPU is unusable). `cuda` null: host copies only.
  // max_merge: the largest copy that merging makes (0: no merging).
  CopyExecutor(size_t index, const cu::Driver* cuda, std::vector<cu::Context> contexts, uint32_t streams_per_gpu,
               uint64_t bytes_per_event, uint64_t host_bytes_per_round, uint64_t max_merge = 0);
  ~CopyExecutor();
  CopyExecutor(const CopyExecutor&) = delete;
  CopyExecutor& operator=(const CopyExecutor&) = delete;

  // Takes a copy (GPU copies start when the round is sealed); an error means
  // it was not taken.
  absl::Status Submit(CopyQueue& q, CopyRequest c);
  // Puts groups that reached bytes_per_event under their event (call after
  // each Submit; `done` runs for copies finished at once when an event
  // cannot be recorded).
  void SealFull(CopyQueue& q, OnDone done);
  // The sequence number of q's latest copy (0: none yet); a fence waits
  // until HasRunningUpTo(that number) is false.
  static uint64_t LastSeq(const CopyQueue& q) { return q.next_seq_ - 1; }
  // Issues this round's GPU copies and puts them under events (or, failing
  // that, waits for them and completes them at once; a copy that cannot be
  // issued completes with its error).
  void SealRound(CopyQueue& q, OnDone done);
  // Completes GPU copies whose events have passed; true if any did.
  bool PollGpu(CopyQueue& q, OnDone done);
  // One round's budget of q's host copies; true on progress.
  bool RunHost(CopyQueue& q, OnDone done);
  // Waits for q's GPU copies and forgets all of q's copies (no completions).
  void Drain(CopyQueue& q);

 private:
  void Seal(CopyQueue& q, int gpu, uint32_t si, CopyQueue::StreamQueue& sq, OnDone done);
  void Issue(CopyQueue& q, CopyQueue::Merged& m, OnDone done);
  cu::Event TakeEvent(int gpu);
  // One slice of a host job touching process memory (pread/pwrite through the
  // exporter's /proc/<pid>/mem; between two processes through bounce_).
  absl::Status CopyProcessSlice(const CopyQueue::HostJob& j, uint64_t n);

  const size_t index_;  // for logs
  const cu::Driver* cuda_;
  const std::vector<cu::Context> contexts_;
  const uint64_t bytes_per_event_;
  const uint64_t host_bytes_per_round_;
  const uint64_t max_merge_;
  std::vector<std::vector<cu::Stream>> streams_;  // [gpu][i]
  std::vector<uint32_t> next_stream_;
  std::vector<std::vector<cu::Event>> free_events_;  // [gpu]
  std::unique_ptr<char[]> bounce_;                   // process memory to process memory, allocated on first use
  bool warned_sync_ = false;
};

}  // namespace podlink
