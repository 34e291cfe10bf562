// The relay: podlinkd moves bytes between exports of pods that cannot map
// each other. This is the ring server: worker threads (by default one per
// GPU) serve the sessions' rings; each ring belongs to one worker, which
// consumes its requests in round-robin batches (no session can starve
// another on that worker), copies each request out of shared memory once,
// validates it against the registry and hands the resolved copy to the
// worker's CopyExecutor (copy_executor.h: streams, events, host copies),
// then posts completions and delivers notifications in order.
#pragma once

#include <atomic>
#include <new>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
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
#include "daemon/relay/copy_executor.h"
#include "daemon/relay/mesh_port.h"
#include "daemon/relay/mesh_stager.h"
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
  // GPU copies: contiguous requests of one ring merge into copies of up to
  // this many bytes (0: none merge). While a ring has at least
  // inflight_gpu_bytes of GPU copies running, its further requests wait in
  // its queue, where they can merge once taken (the copy engines stay busy:
  // that much is tens of microseconds of copying).
  uint64_t merge_bytes = uint64_t{64} << 20;
  // GPU memory to or from other nodes goes through host staging in podlinkd:
  // at most this many bytes per transfer and per ring at a time.
  uint64_t mesh_staging_bytes = uint64_t{256} << 20;
  // Threads copying between GPUs and that staging (mesh_stager.h).
  uint32_t mesh_staging_threads = 4;
  uint64_t inflight_gpu_bytes = uint64_t{32} << 20;
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

  // Requests naming a remote handle (mesh_port.h) go to `mesh`; without one
  // they fail UNAVAILABLE. Set once, before rings are served; `mesh` must
  // outlive the engine's use of it (the broker stops it first).
  // set_mesh(nullptr) returns once no worker is inside a call to the old one.
  void set_mesh(MeshPort* mesh) ABSL_LOCKS_EXCLUDED(mesh_port_mu_) {
    absl::WriterMutexLock l(&mesh_port_mu_);
    mesh_ = mesh;
  }
  // Queues a notification for `owner_session`'s ring (from another node:
  // from_session 0). FAILED_PRECONDITION without a ring, RESOURCE_EXHAUSTED
  // when its queue is full.
  // With `message`, its bytes too (at most kRingMessageBytes; FAILED_PRECONDITION
  // when the owner's ring is version 1).
  absl::Status PostNotification(uint64_t owner_session, uint64_t export_id, uint64_t value, uint64_t from_session,
                                const std::string* message = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  RelayCounters Counters() const;
  // The relay's metric families, Prometheus text (the daemon's /metrics).
  std::string RenderMetrics() const;
  // Time from a request being taken off its ring to its completion.
  const LatencyHistogram& latency() const { return latency_; }
  // Copies between GPUs and their staging for other nodes (nullptr without CUDA).
  MeshStager* stager() const { return stager_.get(); }

 private:
  struct PendingNotify {
    uint64_t after_seq = 0;   // every op with seq <= after_seq must be complete
    uint64_t after_mesh = 0;  // and every mesh op with mesh seq <= after_mesh
    RelaySqe sqe{};
    bool has_message = false;  // kNotifyMessage: its bytes, copied out of the ring
    std::string message;
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
    char* in = nullptr;                  // version 2: the IN message slots (one per NQ entry)
    const volatile char* out = nullptr;  // and the OUT slots
    UniqueFd doorbell;
    std::atomic<bool> broken{false};  // read by other workers delivering notifications
    // Owned by the ring's worker; daemon positions are never read back from
    // shared memory.
    uint32_t sq_head = 0, cq_tail = 0;
    uint64_t fail_logged_ns = 0;   // when a failed op of this ring was last logged (at most one a second)
    uint64_t fails_unlogged = 0;   // failed ops since then, logged at debug only
    CopyQueue copies;  // taken off the SQ, completion not yet posted
    std::deque<PendingNotify> notifies;
    uint64_t mesh_seq = 0;             // mesh ops started (their sequence numbers)
    // Host staging of this ring's GPU transfers to other nodes in flight
    // (bounded: RelayOptions::mesh_staging_bytes); released on mesh threads.
    std::atomic<uint64_t> mesh_staged{0};
    std::set<uint64_t> mesh_running;   // started, completion not yet posted
    // Mesh completions arrive on the mesh's threads; the worker posts them.
    struct MeshDone {
      uint64_t seq = 0, tag = 0;
      absl::Status status;
    };
    absl::Mutex mesh_mu;
    std::vector<MeshDone> mesh_done ABSL_GUARDED_BY(mesh_mu);
    std::weak_ptr<Ring> self;
    // Notifications come from any worker.
    absl::Mutex nq_mu;
    uint32_t nq_tail ABSL_GUARDED_BY(nq_mu) = 0;
  };
  struct Worker {
    size_t index = 0;
    UniqueFd epoll, wake;
    std::thread thread;
    std::unique_ptr<CopyExecutor> exec;  // this worker's streams and events
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
  bool FlushNotifies(Ring& r);
  void Process(Worker& w, Ring& r, const RelaySqe& e);
  // Validates a write or read and hands it to the worker's executor.
  absl::Status Copy(Worker& w, Ring& r, const RelaySqe& e);
  absl::Status DeliverNotify(Ring& from, const PendingNotify& p) ABSL_LOCKS_EXCLUDED(mu_);
  // A write or read whose remote side is another node's region.
  absl::Status MeshCopy(Worker& w, Ring& r, const RelaySqe& e);
  absl::Status MeshCopyGpu(Ring& r, const RelaySqe& e, std::shared_ptr<const ExportRecord> local, MeshTransfer t,
                           uint64_t seq, MeshPort::Done done);
  // A ring's mesh request `seq` counts as running (a later notify waits for it).
  void MeshStarted(Ring& r, uint64_t seq, uint64_t length);
  // Between `rec` (GPU memory) at `offset` and `buf`, on a stager thread, timed.
  absl::Status StagingCopy(bool to_gpu, const ExportRecord& rec, uint64_t offset, char* buf, uint64_t length);
  // The completion callback of a mesh op of ring r.
  MeshPort::Done MeshCompleter(Ring& r, uint64_t seq, uint64_t tag);
  bool DrainMesh(Ring& r);
  void Complete(Ring& r, uint64_t user_data, const absl::Status& st);
  // The executor's completion callback for ring r.
  auto Completer(Ring& r) {
    return [this, &r](uint64_t tag, const absl::Status& st, double seconds) {
      if (st.ok()) latency_.Observe(seconds);
      Complete(r, tag, st);
    };
  }
  void Break(Ring& r, const std::string& why);
  void Sleep(Worker& w);
  static void Wake(Worker& w);

  const Resolver resolve_;
  const GpuInventory& inventory_;
  const RelayOptions options_;
  const cu::Driver* cuda_ = nullptr;   // null without CUDA
  std::vector<cu::Context> contexts_;  // per daemon ordinal, retained
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> stop_{false};
  absl::Mutex mesh_port_mu_;  // readers: workers calling into mesh_; writer: set_mesh
  MeshPort* mesh_ ABSL_GUARDED_BY(mesh_port_mu_) = nullptr;

  absl::Mutex mu_;  // protects the session index
  std::map<uint64_t, std::shared_ptr<Ring>> sessions_ ABSL_GUARDED_BY(mu_);  // rings being served
  std::vector<size_t> load_ ABSL_GUARDED_BY(mu_);                            // rings per worker

  std::atomic<uint64_t> ops_{0}, bytes_{0}, failed_{0}, notifies_{0}, broken_{0}, rings_count_{0};
  LatencyHistogram latency_;
  std::unique_ptr<MeshStager> stager_;  // with CUDA only
};

}  // namespace podlink
