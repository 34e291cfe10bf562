// The relay: podlinkd moves bytes between exports of pods that cannot map
// each other. Worker threads (by default one per GPU) serve the sessions'
// rings; each ring belongs to one worker, which consumes its requests in
// round-robin batches (no session can starve another on that worker),
// validates each one against the registry, copies with the GPUs' copy engines
// (cuMemcpyAsync on the worker's own non-blocking streams, several per GPU;
// never a kernel) or with memcpy for host memory, and posts completions as
// soon as the copy engine reports them: copies on a stream share a
// completion event only until they add up to bytes_per_event, so large
// copies complete one by one and small ones in bulk.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_driver.h"
#include "common/relay_ring.h"
#include "common/unique_fd.h"
#include "daemon/gpu/gpu_inventory.h"
#include "daemon/metrics/metrics.h"
#include "daemon/registry/registry.h"

namespace podlink {

struct RelayOptions {
  uint32_t batch_per_ring = 64;      // SQEs taken from one ring per round
  uint32_t inflight_per_ring = 512;  // copies in flight per ring
  uint32_t streams_per_gpu = 4;      // per worker
  // Threads serving rings. 0: one per GPU (at most 8); 1 without GPUs.
  uint32_t workers = 0;
  // Copies on one stream share one completion event until their bytes reach
  // this; the next copy starts a new event.
  uint64_t bytes_per_event = uint64_t{1} << 20;
  uint64_t spin_before_sleep_us = 100;
  // Host-to-host copies are done by the worker thread in slices: each ring
  // gets at most this many bytes of memcpy per round, so one pod's 2 GiB copy
  // delays another pod's 4 KiB request by one slice, not by the whole copy.
  uint64_t host_bytes_per_round = uint64_t{1} << 20;
};

struct RelayCounters {
  uint64_t ops = 0, bytes = 0, failed = 0, notifies = 0, rings = 0, broken_rings = 0;
  uint32_t workers = 0;
};

class RelayEngine {
 public:
  // Returns the export if `session` may use it (owns it or imported it).
  using Resolver =
      std::function<absl::StatusOr<std::shared_ptr<const ExportRecord>>(uint64_t session, uint64_t export_id)>;

  RelayEngine(Resolver resolve, const GpuInventory& inventory, RelayOptions options = {});
  ~RelayEngine();  // stops the workers after in-flight copies finish

  // Serves `ring` (the daemon's validated mapping of the session's sealed
  // memfd) for `session` on the worker with the fewest rings; `doorbell` is
  // an eventfd the client writes when the daemon sleeps. FAILED_PRECONDITION
  // if the session already has a ring.
  absl::Status AddRing(uint64_t session, std::shared_ptr<MemoryObject> ring, const RingLayout& layout,
                       UniqueFd doorbell) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops serving the session's ring (idempotent). Copies in flight finish first.
  void RemoveRing(uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);

  RelayCounters Counters() const;
  // Time from a request being taken off its ring to its completion.
  const LatencyHistogram& latency() const { return latency_; }

 private:
  // Copies on one stream of one ring, completed by one event.
  struct Group {
    uint64_t first_seq = 0;
    uint64_t start_ns = 0;
    uint64_t bytes = 0;
    cu::Event event = nullptr;
    std::vector<uint64_t> user_data;
    std::vector<std::shared_ptr<const ExportRecord>> keep;  // memory stays alive while copying
  };
  // A ring's copies on one stream: sealed groups complete in order (a stream
  // is FIFO), so only the oldest event is ever queried.
  struct StreamQueue {
    std::deque<Group> sealed;
    Group building;  // copies of the current round not yet under an event
  };
  // A host-to-host copy in progress, done a slice per round.
  struct HostJob {
    uint64_t seq = 0;
    uint64_t user_data = 0;
    uint64_t start_ns = 0;
    std::shared_ptr<const ExportRecord> src, dst;  // memory stays alive while copying
    uint64_t src_off = 0, dst_off = 0;             // next byte, within the exports
    const char* src_base = nullptr;                // the daemon's mappings
    char* dst_base = nullptr;
    uint64_t left = 0;
  };
  struct PendingNotify {
    uint64_t after_seq = 0;  // every op with seq <= after_seq must be complete
    RelaySqe sqe{};
  };
  struct Ring {
    uint64_t session = 0;
    size_t worker = 0;
    std::shared_ptr<MemoryObject> memory;
    RingLayout layout;
    RingHeader* hdr = nullptr;
    const volatile RelaySqe* sq = nullptr;
    RelayCqe* cq = nullptr;
    RelayNqe* nq = nullptr;
    UniqueFd doorbell;
    std::atomic<bool> broken{false};  // read by other workers delivering notifications
    // Owned by the ring's worker; daemon positions are never read back from
    // shared memory.
    uint32_t sq_head = 0, cq_tail = 0;
    uint64_t next_seq = 1;
    uint64_t copies_pending = 0;  // taken off the SQ, completion not yet posted
    std::map<std::pair<int, uint32_t>, StreamQueue> streams;  // (gpu, stream index)
    std::deque<PendingNotify> notifies;
    std::deque<HostJob> host_jobs;  // in submission order
    // Notifications come from any worker.
    absl::Mutex nq_mu;
    uint32_t nq_tail ABSL_GUARDED_BY(nq_mu) = 0;
  };
  struct Worker {
    size_t index = 0;
    UniqueFd epoll, wake;
    std::thread thread;
    std::vector<std::vector<cu::Stream>> streams;  // [gpu][i], created for this worker
    std::vector<uint32_t> next_stream;
    std::vector<std::vector<cu::Event>> free_events;  // [gpu]: an event works only in its GPU's context
    bool warned_sync = false;
    absl::Mutex mu;  // protects the change lists
    // Rings to start serving (ring set) or to stop serving (session id
    // only), applied by the worker in the order they were asked for.
    struct Change {
      uint64_t session = 0;
      std::shared_ptr<Ring> ring;  // null: remove
    };
    std::vector<Change> changes ABSL_GUARDED_BY(mu);
    // Thread-owned from here on.
    std::map<uint64_t, std::shared_ptr<Ring>> rings;
    uint64_t round = 0;
    uint64_t round_start_ns = 0;
  };

  void Run(Worker& w);
  void ApplyChanges(Worker& w);
  bool ServeRing(Worker& w, Ring& r);
  bool PollInflight(Worker& w, Ring& r);
  void Seal(Worker& w, Ring& r, int gpu, uint32_t stream, StreamQueue& q);
  void SealRound(Worker& w, Ring& r);  // puts every copy of this round under an event
  bool RunHostJobs(Ring& r);           // one round's slice of r's host copies
  bool FlushNotifies(Ring& r);
  void Process(Worker& w, Ring& r, const RelaySqe& e);
  absl::Status Copy(Worker& w, Ring& r, const RelaySqe& e, bool* async);
  absl::Status DeliverNotify(Ring& from, const RelaySqe& e) ABSL_LOCKS_EXCLUDED(mu_);
  void Complete(Ring& r, uint64_t user_data, const absl::Status& st);
  void Break(Ring& r, const std::string& why);
  void Drain(Worker& w, Ring& r);  // waits for r's copies
  cu::Event TakeEvent(Worker& w, int gpu);
  void Sleep(Worker& w);
  static void Wake(Worker& w);

  const Resolver resolve_;
  const GpuInventory& inventory_;
  const RelayOptions options_;
  const cu::Driver* cuda_ = nullptr;   // null without CUDA
  std::vector<cu::Context> contexts_;  // per daemon ordinal, retained
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> stop_{false};

  absl::Mutex mu_;  // protects the session index
  std::map<uint64_t, std::shared_ptr<Ring>> sessions_ ABSL_GUARDED_BY(mu_);  // rings being served
  std::vector<size_t> load_ ABSL_GUARDED_BY(mu_);                            // rings per worker

  std::atomic<uint64_t> ops_{0}, bytes_{0}, failed_{0}, notifies_{0}, broken_{0}, rings_count_{0};
  LatencyHistogram latency_;
};

}  // namespace podlink
