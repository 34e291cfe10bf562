// The owner's room: what this node gives other nodes.
//
// - Opens of this node's regions for pods of other nodes (OpenRegionFor):
//   the forwarded identity checked, policy asked through MeshHost, a grant
//   given within the limits per node, pod and tenant; a routed open's claim
//   checked (CheckClaim), its answer signed, its window sealed end to end.
// - Relay opens for other nodes: the next hop opened through the importer
//   (Rooms::open_through), then the relay's own grant, forwarding to the next
//   node's (Forward).
// - What the transports' requests do to a grant: a TCP data connection's
//   frames (ServeGrantFrame, for tcp/data_server.h) and the verbs server's
//   staged slices and notifications (StagedSlice, DeliverVerbsNotify).
// - Closing, fencing (FenceRoute) and dropping grants of restarted nodes
//   (SeenInstance).
//
// It reaches the other rooms only through Rooms, which the engine sets: the
// importer's open of a relay's next hop, the routing room's addresses of a
// relay, and the verbs server's registrations and staging. Its locks are
// leaves: the grant table's, the relay staging's and the seal budget's
// (docs/architecture.md, the lock order); nothing is called out of the room
// while one is held.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/control/credentials.h"
#include "daemon/mesh/control/liveness.h"
#include "daemon/mesh/control/peer.h"
#include "daemon/mesh/links/late_copies.h"
#include "daemon/mesh/links/stopping.h"
#include "daemon/mesh/mesh_host.h"
#include "daemon/mesh/links/node_shares.h"
#include "daemon/mesh/owner/grant_table.h"
#include "daemon/mesh/seal/window.h"
#include "daemon/mesh/links/wire.h"
#include "daemon/metrics/metrics.h"
#include "podlink/mesh/v1/mesh.pb.h"

namespace podlink::mesh {

class ConnWriter;  // tcp/conn_writer.h

// GPU exports served to other nodes, and writes on a fenceable route's grant:
// the bytes pass through a host buffer of the connection's thread, a chunk at
// a time (MemoryObject::CopyIn/Out; LandFenceable).
constexpr uint64_t kGpuChunk = uint64_t{4} << 20;
constexpr uint64_t kMaxGpuFrame = uint64_t{64} << 20;
char* ChunkBuffer();

// A relay's grant: requests on it go on to the next node.
struct Forward {
  std::shared_ptr<Peer> peer;  // the next node
  uint64_t grant = 0;          // its grant
  uint64_t size = 0;
  uint64_t instance = 0;  // its daemon instance that issued the grant

  // The links a request on this grant goes on over, or UNAVAILABLE: the next
  // node's daemon restarted since it gave the grant, or no link to it is up.
  absl::StatusOr<std::shared_ptr<DataLinks>> OnwardLinks() const;
};

class RegionOwner {
 public:
  struct Options {
    std::string node_name;  // this node's (its certificate's identity)
    uint64_t instance = 0;  // this daemon's, said in every grant
    absl::Duration io_timeout = absl::Seconds(5);       // a fence waits twice this for chunks landing
    absl::Duration answer_timeout = absl::Seconds(30);  // a relayed frame waits this for staging
    GrantTable::Limits limits;
    // mesh.relay_staging_bytes and mesh.sealed_window_bytes (mesh_engine.h).
    uint64_t relay_staging_bytes = 64ull << 20;
    uint64_t sealed_window_bytes = 512ull << 20;
    // A node silent this long (no data connection, no control call) loses its grants (SweepIdleImporters).
    absl::Duration grant_idle_timeout = absl::Minutes(10);
  };
  // The peer whose links carry a grant the next node gave, and its answer.
  using Carried = ::podlink::mesh::Carried;  // control/peer.h
  using RegionDone = std::function<void(absl::StatusOr<podlink::mesh::v1::OpenRegionResponse>)>;
  // The other rooms, as this one calls them. Each may be left empty: a node
  // that then cannot relay or serve verbs says so.
  struct Rooms {
    // The importer: opens `req` (its route signed by the origin) on `hop`,
    // `relays` nodes still ahead of `destination`; `got` runs once, on a
    // mesh thread, and the grant is then the caller's to keep or give back.
    std::function<void(const RemoteTarget& hop, podlink::mesh::v1::OpenRegionRequest req,
                       const std::string& destination, size_t relays,
                       std::function<void(absl::StatusOr<Carried>)> got)>
        open_through;
    // Routing: the control endpoint of a node this one knows (mesh.peers,
    // adverts, Hellos), or nullopt.
    std::function<std::optional<RemoteTarget>(const std::string& node)> known;
    // Verbs: registers `rec` for `node`'s queue pairs or stages it
    // (verbs::VerbsNode::Register says how).
    std::function<absl::Status(const std::string& node, uint64_t grant, const std::shared_ptr<const ExportRecord>& rec,
                               bool over_tcp_ok, bool staged_ok, bool may_register,
                               podlink::mesh::v1::OpenRegionResponse* resp)>
        register_for_verbs;
    // Verbs: a bounce pool for `caller`'s queue pairs (a relay's grant is
    // staged); its slot size.
    std::function<absl::StatusOr<uint64_t>(const std::string& caller)> prepare_staging;
    // Verbs: the registration of a grant that closes.
    std::function<void(const std::string& node, uint64_t grant)> unregister_verbs;
  };
  struct Counters {
    std::atomic<uint64_t> frames_served{0};     // requests on exports' memory served, either transport
    std::atomic<uint64_t> bytes_written_in{0};  // into exports here
    std::atomic<uint64_t> bytes_read_out{0};
    std::atomic<uint64_t> denials{0};  // opens refused: policy, identity, claims, fences
    std::atomic<uint64_t> relay_forwarded_bytes{0};
    std::atomic<uint64_t> relayed_opens{0};
    std::atomic<uint64_t> refused_notifies{0};  // over verbs (unanswered there: counted here)
    std::atomic<uint64_t> idle_peer_grants_dropped{0};  // SweepIdleImporters
    std::atomic<uint64_t> gone_pod_grants_dropped{0};   // DropGrantsOfGonePods
  };

  // `credentials`, `liveness` and `late_copies` outlive the owner (the
  // engine's, shared with the control room and the TCP data server).
  RegionOwner(Options options, MeshHost* host, const NodeCredentials* credentials, Liveness* liveness,
              LateCopies* late_copies, Rooms rooms);
  RegionOwner(const RegionOwner&) = delete;
  RegionOwner& operator=(const RegionOwner&) = delete;

  // Opens a region on behalf of `node` (its certificate's identity; a
  // relayed request goes on toward its destination on a mesh thread); `done`
  // runs once, on some thread.
  void OpenRegionFor(const std::string& node, const podlink::mesh::v1::OpenRegionRequest& req, RegionDone done);
  // `node`'s daemon said its instance: when it changed (a restart), the
  // grants the old instance held are dropped.
  void SeenInstance(const std::string& node, uint64_t instance);
  void CloseRegion(const std::string& node, uint64_t grant);
  // Closes the grants given relays for `origin`'s fenceable routed opens
  // under claim nonce `nonce`, then waits (2 x io_timeout at most) for the
  // chunks being copied into them; DEADLINE_EXCEEDED when one still is.
  // Returns how many closed. A claim with that nonce is refused for two
  // minutes afterwards (a relay replaying it).
  absl::StatusOr<uint32_t> FenceRoute(const std::string& origin, uint64_t nonce);
  // The export behind `node`'s grant (a relay's grant is NOT_FOUND here, and
  // a grant whose export is gone is closed).
  absl::StatusOr<std::shared_ptr<const ExportRecord>> GrantedExport(const std::string& node, uint64_t grant);

  // A WRITE, READ or NOTIFY on a grant this node gave, from `node`'s data
  // connection (TcpDataServer::Owner::serve): an error ends the connection.
  absl::Status ServeGrantFrame(const std::shared_ptr<ConnWriter>& writer, int fd, const FrameHeader& h,
                               const std::string& node, uint64_t link_instance);
  // A staged slice (verbs::VerbsServer::StageSink): between `buf` and the
  // export of `node`'s grant, or on to the next node for a relay's grant.
  void StagedSlice(const std::string& node, uint64_t grant, bool write, uint64_t offset, char* buf, uint64_t length,
                   std::shared_ptr<const void> keep, std::function<void(absl::Status)> done);
  // A notification over verbs (unanswered: a refusal is logged and counted).
  void DeliverVerbsNotify(const std::string& node, uint64_t grant, uint64_t value);

  // Housekeeping (owner/sweeps.cc). The grants of nodes idle longer than
  // grant_idle_timeout (no control call in flight or lately, and no data
  // connection: `connected`) are dropped.
  void SweepIdleImporters(const std::function<bool(const std::string& node)>& connected);
  // The grants of importing pods the host knows to be gone
  // (MeshHost::RemotePodGone: deleted or finished, per the API server) are dropped.
  void DropGrantsOfGonePods();

  // For tests and fuzzers: a grant of `rec` to `node`, without policy.
  uint64_t GrantForTesting(const std::string& node, std::shared_ptr<const ExportRecord> rec);

  // The engine stopping: serving threads waiting for relay staging go on
  // (and end), and no relay grant is installed from now on.
  void BeginStop();
  // Refuses every grant from now on and gives back what was held (the
  // caller lets them go once the peers they forward to are stopped).
  std::map<uint64_t, Grant> CloseAll();

  // What the sweeps, keepalives and status read.
  const GrantTable& grants() const { return grants_; }
  const Counters& counters() const { return counters_; }
  uint64_t relay_staging_used() const { return relay_staging_.used(); }
  uint64_t seal_budget_used() const { return seal_budget_.used(); }
  const seal::SealCounters& seal_counters() const { return seal_counters_; }
  const LatencyHistogram& gpu_copies() const { return gpu_copies_; }

 private:
  // The tenant a forwarded identity's grants count against: its namespace on its node.
  static std::string TenantOf(const std::string& origin, const std::string& ns) {
    return absl::StrCat("mesh/", origin, "/", ns);
  }
  // A relayed request's signed claim, checked, with this node's place on its
  // route: `next` is the relay after this one, or (this node being the last
  // relay) the destination; empty when this node is the destination. The
  // caller must be the node before this one (PERMISSION_DENIED otherwise).
  struct CheckedClaim {
    podlink::mesh::v1::OriginClaim claim;
    std::string next;
    bool next_is_relay = false;
    int relays_after = 0;  // relays on the route after this node
  };
  absl::StatusOr<CheckedClaim> CheckClaim(const std::string& caller, const podlink::mesh::v1::Route& route) const;
  // `claim`: the checked claim of a relayed request (importer and target are
  // taken from it), or nullptr.
  absl::StatusOr<podlink::mesh::v1::OpenRegionResponse> OpenRegion(
      const std::string& node, const podlink::mesh::v1::OpenRegionRequest& req,
      const podlink::mesh::v1::OriginClaim* claim = nullptr);
  // The owner of a routed open signs what it answers (OwnerAnswer), bound to
  // the claim; the origin checks it (RouteSigner::SealRoute, importer/routed.h).
  absl::Status SignOwnerAnswer(const podlink::mesh::v1::OriginClaim& claim,
                               podlink::mesh::v1::OpenRegionResponse* resp) const;
  // This node relays `req` (its claim checked) to the next node of its route.
  void Relay(const std::string& caller, const CheckedClaim& checked, const podlink::mesh::v1::OpenRegionRequest& req,
             RegionDone done);
  // The relay's own grant for `caller`, forwarding to the next node's grant
  // `resp` on `carrier` (given back where the caller is over its limits).
  void InstallRelayGrant(const std::string& caller, const podlink::mesh::v1::OpenRegionRequest& req,
                         const std::string& pod, const std::string& tenant, const std::string& origin,
                         const std::string& next, uint64_t staged_slice, std::shared_ptr<Peer> carrier,
                         podlink::mesh::v1::OpenRegionResponse resp, const RegionDone& done);

  // What a grant this node gave `node` stands for: an export here, or (on a
  // relay) the next node's grant. NOT_FOUND for no such grant, or one whose
  // export is gone (the grant is closed then).
  using Granted = GrantTable::Found;
  absl::StatusOr<Granted> LookupGrant(const std::string& node, uint64_t grant);
  // Serves one frame on a relay grant; an error ends the connection.
  absl::Status ServeForward(const std::shared_ptr<ConnWriter>& writer, int fd, const FrameHeader& h,
                            const std::string& node, uint64_t link_instance, const Forward& fwd);
  // A sealed grant's frame on a data connection (its window: seal/window.h).
  absl::Status ServeSealed(ConnWriter& writer, int fd, const FrameHeader& h, uint64_t grant, const Granted& g);
  // What a sealed grant's verified requests do to the export (the checks of a
  // staged copy; a fenceable grant's landing stops once fenced). `g` outlives it.
  class GrantLander;
  std::unique_ptr<seal::Lander> LanderFor(uint64_t grant, const Granted& g);
  // Host memory of a fenceable grant: `n` bytes of the frame from `fd`
  // through this thread's 4 MiB buffer into `dst`, a chunk at a time; the
  // rest of the frame is read and dropped once the grant is closed
  // (FAILED_PRECONDITION in *landed, the connection going on).
  absl::Status LandFenceable(int fd, uint64_t grant, char* dst, uint64_t n, absl::Status* landed);
  // Between an export and a buffer, with a TCP frame's checks (the range in
  // the export; host memory's pages still there).
  absl::Status StagedCopy(const ExportRecord& rec, bool write, uint64_t offset, char* buf, uint64_t length);
  // A copy between a GPU export and a connection's buffer, timed.
  absl::Status TimedGpuCopy(const std::function<absl::Status()>& copy);

  const Options options_;
  const std::string& node_name_ = options_.node_name;
  const uint64_t instance_ = options_.instance;
  MeshHost* const host_;
  const NodeCredentials& credentials_;
  Liveness& liveness_;
  // Transfers a sender's link instance finished (DONE) or notified (the TCP
  // data server's guard: links/late_copies.h).
  LateCopies& late_copies_;
  const Rooms rooms_;
  std::atomic<bool> stopping_{false};
  // What this node gave other nodes (its own lock, a leaf).
  GrantTable grants_{options_.limits};
  // Relaying for other nodes: bytes of forwarded requests held here (one
  // upstream node at most half, or one frame; a frame over the cap alone).
  NodeShares relay_staging_{NodeShares::Rules{
      options_.relay_staging_bytes, std::max<uint64_t>(options_.relay_staging_bytes / 2, kMaxFramePayload),
      /*last_quarter_for_small=*/false, /*one_oversized=*/true}};
  // Sealed routes, the owner's side: the windows' memory and what came through them.
  NodeShares seal_budget_{NodeShares::Rules{options_.sealed_window_bytes, options_.sealed_window_bytes / 2,
                                            /*last_quarter_for_small=*/true, /*one_oversized=*/false}};
  seal::SealCounters seal_counters_;
  Counters counters_;
  LatencyHistogram gpu_copies_;  // TimedGpuCopy
};

}  // namespace podlink::mesh
