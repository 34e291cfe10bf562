// NCCL's IPC sockets carried between pods' network namespaces (native mode,
// docs/nccl.md).
//
// NCCL's P2P transport with cuMem hands GPU memory to a peer process as a
// POSIX-FD handle over abstract Unix datagram sockets: each rank's proxy binds
// "\0tmp/nccl-socket-<rank>-<hash>", a rank that maps a peer's buffer binds a
// socket of its own for the answer and sends the proxy a request; the proxy
// sends the descriptor back. Abstract names belong to one network namespace,
// so between pods the request fails with ECONNREFUSED.
//
// The bridge lets the pods of one peer group that joined native mode reach
// each other's NCCL sockets: for every NCCL name bound in one member's
// namespace it binds a mirror of the same name in every other member's
// namespace, and forwards what arrives there to the real socket. A request
// forwarded from a pod whose socket has an NCCL name is sent from a mirror of
// that name in the destination's namespace (made before the request goes on),
// so the answer always has somewhere to land. Only NCCL's names are mirrored,
// only between members of one group, and only memory descriptors (regular
// files such as memfds, character devices such as cuMem handles) travel: a
// socket descriptor (NCCL sends its own socket as a placeholder with each
// request) is replaced by an empty sealed memfd, anything else drops the
// datagram. Each member is bounded in mirrors and in datagrams per second.
//
// All state belongs to one thread; Join, Sync and Leave hand it work and wait.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace podlink::ncclipc {

struct BridgeOptions {
  // NCCL names of one member mirrored into the others (NCCL binds one per
  // process and communicator that does not share its parent's proxy, and one
  // per request while it waits for the answer).
  size_t max_names_per_pod = 1024;
  // Requests of one member waiting for an answer (each holds a mirror of its
  // socket in the destination's namespace until the answer or answer_ttl).
  size_t max_answers_per_pod = 256;
  // Datagrams one member may send through the bridge per second (burst: as
  // many); NCCL sends a few hundred while a communicator connects.
  uint32_t datagrams_per_second = 20000;
  // A mirror made for an answer goes after the answer or after this.
  absl::Duration answer_ttl = absl::Seconds(60);
  // Members' namespaces are scanned this often for names that came or went
  // (Sync scans at once).
  absl::Duration rescan_interval = absl::Milliseconds(200);
  // How long Join, Sync and Leave wait for the bridge's thread.
  absl::Duration call_timeout = absl::Seconds(10);
};

struct BridgeCounters {
  uint64_t mirrors_bound = 0;         // mirrors made, ever
  uint64_t datagrams_forwarded = 0;
  uint64_t descriptors_forwarded = 0;  // memory descriptors passed on
  uint64_t descriptors_replaced = 0;   // sockets replaced by the placeholder
  uint64_t refused_descriptor = 0;     // datagrams dropped: a descriptor that is not memory, or several
  uint64_t refused_malformed = 0;      // datagrams dropped: truncated data or control
  uint64_t dropped_rate = 0;           // datagrams over a member's rate
  uint64_t dropped_undeliverable = 0;  // the real socket was full or gone
  uint64_t mirror_limit = 0;           // names or answers over a member's limit (not mirrored)
  uint64_t name_conflicts = 0;         // mirrors not made: the name is taken in that namespace
  uint64_t syncs_scanned = 0;          // scans that Sync calls asked for
  uint64_t syncs_coalesced = 0;        // Sync calls answered by a scan another call had queued
  uint64_t syncs_refused = 0;          // Sync calls over kMaxSyncWaiters (RESOURCE_EXHAUSTED)
};

class Bridge {
 public:
  static absl::StatusOr<std::unique_ptr<Bridge>> Start(BridgeOptions options = {});
  ~Bridge();
  Bridge(const Bridge&) = delete;
  Bridge& operator=(const Bridge&) = delete;

  struct Member {
    uint64_t session = 0;   // podlinkd's session of the joining process
    std::string group;      // "<namespace>/<peer group>": only members of one group are joined
    std::string pod;        // "namespace/name", for logs
    UniqueFd netns;         // the process's network namespace
  };
  // Adds the member's namespace (once per namespace: more sessions of one pod
  // share it) and mirrors the names of the group's other members into it and
  // its names into theirs. FAILED_PRECONDITION for the host's own network
  // namespace or a namespace already joined to another group.
  absl::Status Join(Member m);
  // Scans the session's namespace now and mirrors every name that is new.
  // Calls of one session coalesce: while a scan of it waits in the bridge's
  // queue, later calls wait for that one (it starts after them, so it sees
  // every name they bound) instead of queuing another, and at most
  // kMaxSyncWaiters wait; more are RESOURCE_EXHAUSTED. A pod calling it in
  // a loop or from many threads thus keeps at most one scan per session
  // queued, and the bridge's thread forwards between them.
  static constexpr int kMaxSyncWaiters = 8;
  absl::Status Sync(uint64_t session);
  // Drops the session; the namespace's last session removes its mirrors and
  // the mirrors of its names. Unknown sessions are ignored.
  void Leave(uint64_t session);

  // Runs `fn` on the bridge's thread and returns its status (tests hold the
  // thread with it to make calls queue deterministically).
  absl::Status RunOnBridgeThread(std::function<absl::Status()> fn);

  BridgeCounters Counters() const;
  size_t members() const;
  size_t mirrors() const;
  // Prometheus text: podlink_nccl_ipc_*.
  std::string RenderMetrics() const;

  class Impl;

 private:
  explicit Bridge(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace podlink::ncclipc
