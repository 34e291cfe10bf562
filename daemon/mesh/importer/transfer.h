// The importer's transfers: what the relay hands over (MeshPort) on a remote
// handle a pod opened — a write, a read or a notification — checked against
// the handle (this session's, its owner daemon not restarted, the range
// inside the region) and submitted to the links that carry it: the handle's
// sealed route, or its peer's links, with the paths ranked for the memory's
// place (nic_rank.h). A large transfer on a handle with a second route
// (mesh.two_hop_stripe) is striped over both (TwoRoutes), on the two-hop
// thread; a chunk the relay's route fails goes again on the direct links
// once the owner has fenced that route.
//
// It reads the handle table and the host (a transfer's GPU), and calls the
// peers' links and, for a fence, the direct peer's control stub on its
// worker. Its lock: none of its own but each striped transfer's (taken
// alone), and the two-hop thread's queue (importer/task_thread.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/mesh/control/peer.h"
#include "daemon/mesh/importer/handle_table.h"
#include "daemon/mesh/importer/task_thread.h"
#include "daemon/mesh/links/stopping.h"
#include "daemon/mesh/mesh_host.h"
#include "daemon/mesh/links/nic_rank.h"
#include "daemon/relay/mesh_port.h"

namespace podlink::mesh {

// Two-hop striping (mesh.two_hop_stripe): transfers from this size, in
// chunks of this size, at most this many in flight per route.
constexpr uint64_t kTwoHopMinBytes = 8 << 20;
constexpr uint64_t kTwoHopChunk = 4 << 20;
constexpr uint32_t kTwoHopWindow = 4;

class RemoteTransfers {
 public:
  struct Options {
    absl::Duration io_timeout = absl::Seconds(5);  // a fence is given twice this, and 5 s more
    std::string sysfs = "/sys";                    // the NICs and GPUs paths are ranked by
  };
  struct Counters {
    std::atomic<uint64_t> two_hop_routes{0};  // second routes joined to handles (the opener counts them)
    std::atomic<uint64_t> two_hop_bytes{0};
    std::atomic<uint64_t> two_hop_transfers{0};
    std::atomic<uint64_t> two_hop_failovers{0};
    std::atomic<uint64_t> two_hop_fences{0};
  };

  // `handles` outlives this (the engine's).
  RemoteTransfers(Options options, MeshHost* host, const HandleTable* handles);
  RemoteTransfers(const RemoteTransfers&) = delete;
  RemoteTransfers& operator=(const RemoteTransfers&) = delete;
  ~RemoteTransfers();  // stops the two-hop thread (a striped transfer still in flight ends on it first)

  // With mesh.two_hop_stripe: the two-hop thread runs from now on.
  void StartTwoHopThread() { two_hop_thread_.Start(); }
  // Once the links are gone (the engine stopped): what was queued runs, then the thread ends.
  void StopTwoHopThread() { two_hop_thread_.Stop(); }
  // Where a striped transfer's next submissions and its end run, and a
  // sealed route's completions (never a link's own thread); false without
  // striping, or once stopping.
  bool PostTwoHop(std::function<void()> task) { return two_hop_thread_.Post(std::move(task)); }
  // The mesh stopping: a handle not found, or a fence not queued, says so.
  void BeginStop() { stopping_.store(true, std::memory_order_release); }

  // MeshPort::Start and Notify.
  absl::Status Transfer(MeshTransfer t, MeshPort::Done done);
  absl::Status Notify(uint64_t session, uint64_t handle, uint64_t value, MeshPort::Done done);

  Counters& counters() { return counters_; }
  const Counters& counters() const { return counters_; }

 private:
  // A transfer striped over the direct links and a TwoHop.
  class TwoRoutes;
  absl::StatusOr<Handle> FindHandle(uint64_t session, uint64_t handle) const;
  // UNAVAILABLE when the owner daemon restarted since it gave the grant.
  static absl::Status CheckInstance(const Handle& h);
  // The link set an operation of `h` goes to: its sealed route's, or the peer's.
  static std::shared_ptr<DataLinks> LinksOf(const Handle& h);
  // Which of `paths` a transfer of memory on GPU `gpu_bus_id` (empty: host
  // memory) uses (nic_rank.h).
  PathPreference RankFor(const std::vector<Path>& paths, const std::string& gpu_bus_id) const;
  // Why a fence for `node` could not be queued on its peer's worker.
  absl::Status NotQueued(const std::string& node) const;

  const Options options_;
  MeshHost* const host_;
  const HandleTable& handles_;
  std::atomic<bool> stopping_{false};
  Counters counters_;
  TaskThread two_hop_thread_;
};

}  // namespace podlink::mesh
