// The relay: podlinkd moves bytes between exports of pods that cannot map
// each other. One thread owns every session's ring; it consumes requests in
// round-robin batches (no session can starve another), validates each one
// against the registry, copies with the GPUs' copy engines (cuMemcpyAsync on
// non-blocking streams, several in flight per GPU; never a kernel) or with
// memcpy for host memory, polls completion events and posts completions.
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
  uint32_t streams_per_gpu = 4;
  uint64_t spin_before_sleep_us = 100;
};

struct RelayCounters {
  uint64_t ops = 0, bytes = 0, failed = 0, notifies = 0, rings = 0, broken_rings = 0;
};

class RelayEngine {
 public:
  // Returns the export if `session` may use it (owns it or imported it).
  using Resolver =
      std::function<absl::StatusOr<std::shared_ptr<const ExportRecord>>(uint64_t session, uint64_t export_id)>;

  RelayEngine(Resolver resolve, const GpuInventory& inventory, RelayOptions options = {});
  ~RelayEngine();  // stops the thread after in-flight copies finish

  // Serves `ring` (the daemon's validated mapping of the session's sealed
  // memfd) for `session`; `doorbell` is an eventfd the client writes when the
  // daemon sleeps. FAILED_PRECONDITION if the session already has a ring.
  absl::Status AddRing(uint64_t session, std::shared_ptr<MemoryObject> ring, const RingLayout& layout,
                       UniqueFd doorbell) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops serving the session's ring (idempotent). Copies in flight finish first.
  void RemoveRing(uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);

  RelayCounters Counters() const;
  // Time from a request being taken off its ring to its completion.
  const LatencyHistogram& latency() const { return latency_; }

 private:
  // Copies issued on one stream in one round, completed by one event.
  struct Inflight {
    uint64_t first_seq = 0;
    uint64_t start_ns = 0;
    cu::Event event = nullptr;
    bool done = false;
    std::vector<uint64_t> user_data;
    std::vector<std::shared_ptr<const ExportRecord>> keep;  // memory stays alive while copying
  };
  struct PendingNotify {
    uint64_t after_seq = 0;  // every op with seq <= after_seq must be complete
    RelaySqe sqe{};
  };
  struct Ring {
    uint64_t session = 0;
    std::shared_ptr<MemoryObject> memory;
    RingLayout layout;
    RingHeader* hdr = nullptr;
    const volatile RelaySqe* sq = nullptr;
    RelayCqe* cq = nullptr;
    RelayNqe* nq = nullptr;
    UniqueFd doorbell;
    // Daemon-owned positions: never read back from shared memory.
    uint32_t sq_head = 0, cq_tail = 0, nq_tail = 0;
    uint64_t next_seq = 1;
    std::deque<Inflight> inflight;  // issue order
    std::map<std::pair<int, uint32_t>, Inflight> building;  // (gpu, stream) -> copies of this round
    std::deque<PendingNotify> notifies;
    bool broken = false;
  };

  void Run();
  void ApplyChanges();
  bool ServeRing(Ring& r);
  bool PollInflight(Ring& r);
  void SealRound(Ring& r);  // one event per stream used this round
  bool FlushNotifies(Ring& r);
  void Process(Ring& r, const RelaySqe& e);
  absl::Status Copy(Ring& r, const RelaySqe& e, bool* async);
  absl::Status DeliverNotify(Ring& from, const RelaySqe& e);
  void Complete(Ring& r, uint64_t user_data, const absl::Status& st);
  void Break(Ring& r, const std::string& why);
  void Drain(Ring& r);  // waits for r's copies
  cu::Event TakeEvent();
  void Sleep();

  const Resolver resolve_;
  const GpuInventory& inventory_;
  const RelayOptions options_;
  const cu::Driver* cuda_ = nullptr;  // null without CUDA
  std::vector<cu::Context> contexts_;  // per daemon ordinal, retained
  std::vector<std::vector<cu::Stream>> streams_;
  std::vector<uint32_t> next_stream_;
  std::vector<cu::Event> free_events_;

  UniqueFd epoll_, wake_;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  absl::Mutex mu_;  // protects the change lists; the rings themselves belong to the thread
  std::vector<std::pair<uint64_t, std::unique_ptr<Ring>>> to_add_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> to_remove_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, bool> registered_ ABSL_GUARDED_BY(mu_);

  std::map<uint64_t, std::unique_ptr<Ring>> rings_;  // thread-owned
  uint64_t round_ = 0;

  std::atomic<uint64_t> ops_{0}, bytes_{0}, failed_{0}, notifies_{0}, broken_{0}, rings_count_{0};
  uint64_t round_start_ns_ = 0;
  LatencyHistogram latency_;
};

}  // namespace podlink
