// The broker: sessions, export/import/release/list with policy, and events.
// Both transports (the descriptor channel server and the gRPC service) call
// into it; it holds all logic, they only translate.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/broker/session.h"
#include "daemon/gpu/gpu_inventory.h"
#include "daemon/gpu/memory_object.h"
#include "daemon/identity/kube_pods.h"
#include "daemon/identity/pod_source.h"
#include "daemon/mesh/mesh_engine.h"
#include "daemon/ncclipc/bridge.h"
#include "daemon/mesh/mesh_host.h"
#include "daemon/metrics/metrics.h"
#include "common/metadata_keys.h"
#include "daemon/registry/registry.h"
#include "daemon/relay/relay_engine.h"
#include "podlink/v1/podlink.pb.h"

namespace podlink {

// NCCL native mode (docs/nccl.md): pods of one peer group that may open every
// GPU share a /dev/shm and reach each other's NCCL IPC sockets.
struct NcclNativeOptions {
  bool enabled = true;
  // Each group's tmpfs is mounted in a directory under this one.
  std::string shm_dir = "/run/podlink/nccl-shm";
  uint64_t shm_size_bytes = uint64_t{1} << 30;
  ncclipc::BridgeOptions bridge;
};

struct BrokerOptions {
  size_t max_sessions = 1024;
  size_t max_sessions_per_pod = 64;     // per identity key: one pod cannot take every session
  CgroupLayout cgroup_layout;           // where the kubelet's pod cgroups live
  // Offered but not yet exported, per session: a GPU export of torch's expandable segments offers one
  // descriptor per allocation (max_export_chunks) before it names them.
  size_t max_pending_offers = 1024;
  // ...and across all of a pod's sessions, and the node's: each offer is a descriptor podlinkd holds, and a pod's 64
  // sessions could otherwise hold 65536 (podlinkd's own descriptor limit is often 20000 or less).
  size_t max_pending_offers_per_pod = 2048;
  size_t max_pending_offers_total = 16384;
  size_t max_export_chunks = 1024;  // cuMem allocations in one export: 20 GiB of torch's 20 MiB chunks
  absl::Duration offer_ttl = absl::Seconds(30);  // an offer unused this long is closed
  size_t max_watchers_per_session = 4;
  size_t max_allowed_importers = 64;
  uint64_t max_export_size = uint64_t{1} << 40;  // 1 TiB
  RegistryLimits registry;
  RelayOptions relay;
  std::string node_name;  // reported by GetNodeInfo: the Kubernetes node's name, else the host name
  std::string node_id;    // empty: the boot id (set for emulated nodes sharing one kernel)
  mesh::MeshOptions mesh;
  NcclNativeOptions nccl_native;
};

struct BrokerStats {
  size_t sessions = 0;
  size_t exports = 0;
  uint64_t imports_total = 0;
  uint64_t denials_total = 0;
};

class Broker final : public mesh::MeshHost {
 public:
  Broker(BrokerOptions options, std::unique_ptr<PodSource> pods, GpuInventory inventory,
         std::vector<std::unique_ptr<MemoryBackend>> backends);
  ~Broker() override;

  // Pods of other nodes are believed only as `directory` confirms them (with
  // the API server); null: as their daemons forward them. Not owned; call
  // before the mesh starts.
  void ConfirmRemotePodsWith(PodDirectory* directory) { remote_pods_ = directory; }

  // The engines the daemon wires to the broker (daemon/main.cc): the relay,
  // which serves sessions' rings, and the mesh (null without it). Not owned.
  // Attach before serving; the engines must outlive every session, so close
  // them (CloseAllSessions) and detach the mesh (Attach(relay, nullptr))
  // before the mesh goes.
  void Attach(RelayEngine* relay, mesh::MeshEngine* mesh) {
    relay_ = relay;
    mesh_ = mesh;
  }
  // What the relay asks before each copy: the export, if `session` may use
  // it (its owner or an importer).
  RelayEngine::Resolver RelayResolver() {
    return [this](uint64_t session, uint64_t export_id) { return registry_.GetUsable(export_id, session); };
  }
  const GpuInventory& inventory() const { return inventory_; }

  // --- descriptor channel side -------------------------------------------
  // Identifies the peer of a freshly accepted descriptor channel, resolves
  // its pod, creates the session and sends HELLO; a refusal sends GOODBYE
  // with the code and the reason. One call; the FdServer uses the parts below
  // so that a pod source waiting for the runtime never holds up its thread.
  absl::StatusOr<std::shared_ptr<Session>> OpenSession(UniqueFd sock);
  // The parts: the peer's kernel facts (fast); the pod when known without
  // waiting (nullopt: only ResolvePod can tell, perhaps after a while); then
  // the session, or GOODBYE for a refusal in `peer` or `pod`.
  absl::StatusOr<PeerIdentity> IdentifyClient(int sock) const;
  std::optional<absl::StatusOr<PodInfo>> ResolvePodCached(const PeerIdentity& peer);
  absl::StatusOr<PodInfo> ResolvePod(const PeerIdentity& peer);
  absl::StatusOr<std::shared_ptr<Session>> FinishOpen(UniqueFd sock, absl::StatusOr<PeerIdentity> peer,
                                                      absl::StatusOr<PodInfo> pod);
  // OK while the pod source can identify new pods (the runtime answers).
  absl::Status PodSourceReady() const { return pods_->Ready(); }
  // A descriptor offered on the channel; answered with OFFER_ACK.
  void OnOffer(Session& s, uint64_t slot, UniqueFd fd);
  // Closes offers older than offer_ttl in every session (called periodically).
  void ExpireOffers() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a session: drops its exports (telling their importers), its offers
  // and ends its Watch streams. Idempotent.
  void CloseSession(uint64_t session_id, const std::string& reason);
  void CloseAllSessions(const std::string& reason);

  // --- RPC side -------------------------------------------------------------
  // Parses "<id>.<token hex>" and returns the live session it names.
  absl::StatusOr<std::shared_ptr<Session>> Authenticate(absl::string_view credential);

  v1::NodeInfo GetNodeInfo() const;
  v1::WhoAmIResponse WhoAmI(const Session& s) const;
  absl::StatusOr<v1::ExportResponse> Export(Session& s, const v1::ExportRequest& req);
  absl::StatusOr<v1::ImportResponse> Import(Session& s, const v1::ImportRequest& req);
  absl::StatusOr<v1::ReleaseResponse> Release(Session& s, const v1::ReleaseRequest& req);
  absl::StatusOr<v1::ListResponse> List(const Session& s, const v1::ListRequest& req) const;
  absl::StatusOr<v1::Stats> GetStats(const Session& s) const;
  absl::StatusOr<v1::MeshStatus> GetMeshStatus(const Session& s) const;
  // NCCL native mode for the session's pod (podlink.io/nccl-native).
  absl::StatusOr<v1::JoinNcclNativeResponse> JoinNcclNative(Session& s);
  absl::StatusOr<v1::SyncNcclIpcResponse> SyncNcclIpc(Session& s);
  // Root on the host, outside any container.
  static absl::Status CheckAdmin(const Session& s);
  absl::Status AddWatcher(Session& s, std::shared_ptr<EventSink> sink);
  absl::StatusOr<v1::OpenRelayResponse> OpenRelay(Session& s, const v1::OpenRelayRequest& req);
  // Opens another node's region through the mesh; `done` runs on a mesh
  // thread (never the caller's).
  void OpenRemote(Session& s, const v1::OpenRemoteRequest& req,
                  std::function<void(absl::StatusOr<v1::OpenRemoteResponse>)> done);

  // mesh::MeshHost (the exporting side of the mesh).
  absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(
      const PodInfo& importer, const podlink::mesh::v1::OpenRegionRequest& req) override;
  bool ExportLive(const ExportRecord& rec) const override;
  bool TracksRemotePods() const override { return remote_pods_ != nullptr; }
  bool RemotePodGone(const std::string& pod_uid) const override {
    return remote_pods_ != nullptr && remote_pods_->Gone(pod_uid);
  }
  absl::Status NotifyOwner(const ExportRecord& rec, uint64_t value) override;
  std::string GpuBusId(const ExportRecord& rec) const override;

  BrokerStats Stats() const;
  // Prometheus text: sessions, exports, imports, denials by reason, relay.
  std::string RenderMetrics() const;
  void set_ready(bool r) { ready_.store(r, std::memory_order_release); }
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  const std::string& node_id() const { return node_id_; }

 private:
  std::shared_ptr<Session> FindSession(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  void ExpireOffersLocked(Session& s, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  void NotifyGone(const RemovedExport& removed, const std::string& reason);
  void LeaveNcclNative(uint64_t session_id) ABSL_LOCKS_EXCLUDED(nccl_mu_);
  v1::ExportInfo Describe(const ExportRecord& rec, size_t import_count, uint64_t imports_total,
                          uint64_t caller) const;
  MemoryBackend* BackendFor(HandleKind kind) const;
  // The export named by id or name if `importer` may import it (denials
  // counted and logged with `who`; another namespace gets NOT_FOUND).
  absl::StatusOr<std::shared_ptr<const ExportRecord>> FindAuthorized(const PodInfo& importer, bool by_id, uint64_t id,
                                                                     const std::string& name, const std::string& who);
  // Sends `fd` to the session's client in a fresh delivery slot (an import's descriptor), and returns the slot.
  absl::StatusOr<uint64_t> Deliver(Session& s, uint64_t export_id, int fd);
  // Removes the descriptor offered in `slot` from the session.
  absl::StatusOr<UniqueFd> TakeOffer(Session& s, uint64_t slot, const char* what);

  const BrokerOptions options_;
  std::unique_ptr<PodSource> pods_;
  PodDirectory* remote_pods_ = nullptr;  // confirms other nodes' pods; null: believed as forwarded
  const GpuInventory inventory_;
  std::vector<std::unique_ptr<MemoryBackend>> backends_;
  Registry registry_;
  RelayEngine* relay_ = nullptr;     // Attach; resolves through registry_
  mesh::MeshEngine* mesh_ = nullptr;  // Attach; null without the mesh
  std::string node_id_;
  // NCCL native mode: the bridge (null when off or it could not start) and
  // each group's native sessions (the group's tmpfs goes with the last).
  std::unique_ptr<ncclipc::Bridge> nccl_bridge_;
  mutable absl::Mutex nccl_mu_;
  std::map<std::string, std::set<uint64_t>> nccl_groups_ ABSL_GUARDED_BY(nccl_mu_);

  mutable absl::Mutex mu_;  // protects sessions_, next_session_ and sessions_per_pod_
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, size_t> sessions_per_pod_ ABSL_GUARDED_BY(mu_);  // identity key -> sessions
  // Offers held in every session, by identity key and in all (taken after a session's mu, never before).
  absl::Mutex offers_mu_;
  absl::flat_hash_map<std::string, size_t> offers_per_pod_ ABSL_GUARDED_BY(offers_mu_);
  size_t offers_total_ ABSL_GUARDED_BY(offers_mu_) = 0;
  // Counts `n` more offers of `s`'s pod; false (nothing counted) past a bound.
  bool CountOffers(const Session& s, size_t n) ABSL_LOCKS_EXCLUDED(offers_mu_);
  void UncountOffers(const Session& s, size_t n) ABSL_LOCKS_EXCLUDED(offers_mu_);

  std::atomic<uint64_t> imports_total_{0};
  std::atomic<uint64_t> denials_total_{0};
  std::atomic<uint64_t> exports_total_{0};
  std::atomic<uint64_t> sessions_total_{0};
  LabeledCounter denials_;
  std::atomic<bool> ready_{false};
};

}  // namespace podlink
