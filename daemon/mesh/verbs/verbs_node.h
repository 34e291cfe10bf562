// This node's verbs side, both ends of the transport as the engine uses them:
// - its RDMA devices (Nics, opened once each);
// - the serving side peers' queue pairs land on (VerbsServer), made on first
//   use; its notifications and staged slices go to the owner's sinks;
// - registering or staging an export it grants for a peer's queue pairs
//   (Register), or saying why the grant goes over TCP instead;
// - making this node's own verbs links to a peer (Connect), path by path
//   (ConnectPath, also a repair's).
// Its lock (mu_) guards the devices, the server and why it could not be
// made; it is held while libibverbs loads, the server is made and a
// registration is dropped (ibv_dereg_mr), never while calling the owner or a
// peer (docs/architecture.md, the lock order).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/links/log_limit.h"
#include "daemon/mesh/verbs/verbs_link.h"
#include "daemon/registry/registry.h"
#include "podlink/mesh/v1/mesh.pb.h"

namespace podlink::mesh::verbs {

class VerbsNode {
 public:
  struct Options {
    std::string node_name;  // this node's (a peer presenting it is refused)
    VerbsOptions verbs;     // mesh.verbs
    // This node's links: mesh.connections_per_path queue pairs per path, and
    // the slicing (the server's bounce slots are slices too).
    uint32_t qps_per_path = 4;
    uint64_t slice_bytes = 512 << 10;
    uint32_t slices_in_flight = 4;
    absl::Duration answer_timeout = absl::Seconds(30);
    bool staged_only = false;  // mesh.verbs_staged_only: no export is registered for peers
  };
  // What the serving side's notifications and staged slices do to grants
  // (the owner's: RegionOwner::DeliverVerbsNotify and StagedSlice).
  struct Sinks {
    VerbsServer::NotifySink notify;
    VerbsServer::StageSink stage;
  };

  VerbsNode(Options options, Sinks sinks) : options_(std::move(options)), sinks_(std::move(sinks)) {}
  VerbsNode(const VerbsNode&) = delete;
  VerbsNode& operator=(const VerbsNode&) = delete;

  // The serving side, made on first use (FAILED_PRECONDITION without
  // libibverbs, said again each time; UNAVAILABLE once stopping).
  absl::StatusOr<VerbsServer*> Serving() ABSL_LOCKS_EXCLUDED(mu_);
  // A peer's queue pairs for one path to `mine` (one of this node's
  // advertised addresses): this node's side of them.
  absl::StatusOr<podlink::mesh::v1::OpenVerbsResponse> Accept(const std::string& node,
                                                              const podlink::mesh::v1::OpenVerbsRequest& req,
                                                              const std::vector<IpPrefix>& advertised);
  // Registers `rec` for `node`'s verbs links (resp's verbs_keys); where it
  // cannot be (or staged_only) and the caller `staged_ok`, stages it over the
  // caller's queue pairs through this node's bounce pool (resp's
  // staged_reason); failing that, where the caller `over_tcp_ok`, grants it
  // over TCP (resp's over_tcp_reason). Errors: the export cannot be served.
  // `may_register` false (a sealed route): staged or over TCP only.
  absl::Status Register(const std::string& node, uint64_t grant, const std::shared_ptr<const ExportRecord>& rec,
                        bool over_tcp_ok, bool staged_ok, bool may_register,
                        podlink::mesh::v1::OpenRegionResponse* resp);
  // A bounce pool for `caller`'s queue pairs (a relay's grant is staged); its slot size.
  absl::StatusOr<uint64_t> PrepareStaging(const std::string& caller);
  // The registration of a grant that closed, if any.
  void Unregister(const std::string& node, uint64_t grant) ABSL_LOCKS_EXCLUDED(mu_);
  // Registrations whose grant is gone (`granted` false) are dropped; for the
  // others `check` runs (it closes a grant whose export went away, and so
  // its registration). Neither is called with mu_ held.
  void Sweep(const std::function<bool(uint64_t grant)>& granted,
             const std::function<void(const std::string& node, uint64_t grant)>& check) ABSL_LOCKS_EXCLUDED(mu_);

  // This node's verbs links to `node` over `paths`, each path's queue pairs
  // accepted by the peer through `open` (its OpenVerbs); UNAVAILABLE when no
  // path came up.
  using OpenVerbsCall = std::function<absl::StatusOr<podlink::mesh::v1::OpenVerbsResponse>(
      const podlink::mesh::v1::OpenVerbsRequest&)>;
  absl::StatusOr<std::shared_ptr<VerbsLinks>> Connect(const std::string& node, const std::vector<Path>& paths,
                                                      const OpenVerbsCall& open) ABSL_LOCKS_EXCLUDED(mu_);
  // Queue pairs for one path of `links` (a repair names the owner's failed
  // ones in `replaces`).
  absl::Status ConnectPath(VerbsLinks& links, const Path& path, const OpenVerbsCall& open,
                           const std::vector<uint32_t>& replaces) ABSL_LOCKS_EXCLUDED(mu_);

  // The mesh stopping: no server is made from now on.
  void BeginStop() { stopping_.store(true, std::memory_order_release); }
  // The server goes: other nodes' RDMA access to this node's exports ends.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // For status and metrics.
  struct ServerCounts {
    bool serving = false;  // the server was made
    uint64_t qps = 0, registrations = 0, notifies = 0, staged_slices = 0, staged_refused = 0,
             staged_late_dropped = 0, staged_done = 0;
  };
  ServerCounts server_counts() const ABSL_LOCKS_EXCLUDED(mu_);
  // Grants given over TCP though RDMA was asked for, and grants staged
  // through a bounce pool (both logged at most every 10 s).
  uint64_t grants_over_tcp() const { return grants_over_tcp_.load(std::memory_order_relaxed); }
  uint64_t grants_staged() const { return grants_staged_.load(std::memory_order_relaxed); }

 private:
  const Options options_;
  const Sinks sinks_;
  std::atomic<bool> stopping_{false};
  mutable absl::Mutex mu_;  // device calls can be slow: apart from every other mesh lock
  std::unique_ptr<Nics> nics_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<VerbsServer> server_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> grants_over_tcp_{0};
  LogLimit over_tcp_log_;
  std::atomic<uint64_t> grants_staged_{0};
  LogLimit staged_log_;
};

}  // namespace podlink::mesh::verbs
