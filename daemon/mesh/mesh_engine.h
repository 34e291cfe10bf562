// The inter-node mesh: podlinkd talking to the podlinkd of other nodes.
//
// Control plane: the Mesh gRPC service (proto/podlink/mesh/v1/mesh.proto)
// over mutual TLS; the peer's node name is its certificate's identity.
// Data plane: plain TCP connections to the data port, each authenticated by
// a one-use cookie from OpenLink (wire.h), one or more per direct path
// (addresses.h), striped by PeerLinks (tcp/tcp_link.h).
//
// Importing side: a pod asks its own daemon to open a region of another node
// (Broker::OpenRemote). The daemon dials that node on the peer's own worker
// thread (never on a gRPC or relay thread), forwards the pod's kernel-derived
// identity, and gets a grant; the pod gets a remote handle (bit 63) that its
// relay ring uses like an export id. Exporting side: the same policy as a
// local import decides (MeshHost, implemented by the broker); grants are
// bound to the requesting node and die with the export.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/identity/pod_source.h"
#include "daemon/mesh/routing/routes.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/mesh_host.h"
#include "daemon/mesh/control/connector.h"
#include "daemon/mesh/control/control_service.h"
#include "daemon/mesh/control/credentials.h"
#include "daemon/mesh/control/liveness.h"
#include "daemon/mesh/control/peer_table.h"
#include "daemon/mesh/control/repairs.h"
#include "daemon/mesh/importer/handle_table.h"
#include "daemon/mesh/importer/opener.h"
#include "daemon/mesh/importer/routed.h"
#include "daemon/mesh/importer/transfer.h"
#include "daemon/mesh/owner/region_owner.h"
#include "daemon/mesh/routing/advert_trader.h"
#include "daemon/mesh/routing/known_nodes.h"
#include "daemon/mesh/routing/local_nics.h"
#include "daemon/mesh/links/late_copies.h"
#include "daemon/mesh/status/mesh_status.h"
#include "daemon/mesh/tcp/admission.h"
#include "daemon/mesh/tcp/data_server.h"
#include "daemon/mesh/tcp/tcp_connect.h"
#include "daemon/mesh/verbs/verbs_connect.h"
#include "daemon/mesh/verbs/verbs_node.h"
#include "daemon/relay/mesh_port.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"
#include "podlink/v1/podlink.pb.h"

namespace grpc {
class Server;
namespace experimental {
class CertificateProviderInterface;
}
}  // namespace grpc

namespace podlink::mesh {

// Another node as configuration names it (mesh.peers): what routes through
// relays are computed from, besides what peers say of themselves.
struct PeerEntry {
  std::string node;
  std::vector<std::string> addresses;  // "addr/prefix"
  uint32_t port = 7446;                // its control port
};

struct MeshOptions {
  bool enabled = false;
  std::string listen = "0.0.0.0:7446";  // control plane (gRPC, mutual TLS)
  uint32_t data_port = 7447;             // data connections
  // ca.crt, tls.crt, tls.key (a cert-manager Certificate secret's names).
  std::string cert_dir = "/etc/podlink/mesh";
  std::vector<std::string> interfaces;   // netdevs to advertise; empty: all but loopback
  std::vector<std::string> addresses;    // explicit "addr/prefix" list (overrides interfaces)
  bool fallback = false;                 // no direct subnet: let the kernel route to the first address
  // transport "verbs": a node no RDMA path to comes up is reached over TCP
  // (said and counted) instead of failing the open.
  bool verbs_tcp_fallback = true;
  // transport "verbs": no export is registered for peers' RDMA access; every
  // grant is staged through this node's bounce pools (the pods' memory is
  // never remotely addressable; each slice costs a copy here).
  bool verbs_staged_only = false;
  // TCP: a write's slices of the writing pod's own host export go to the
  // kernel without a copy (MSG_ZEROCOPY) on each connection while the kernel
  // can (wire.h ZeroCopySends).
  bool tcp_zero_copy = true;
  // TCP: a transfer of at least kTwoHopMinBytes to a node cabled to this one
  // also goes through a relay cabled to both (a second route, opened in the
  // background after the region), in 4 MiB chunks each route pulls while it
  // has fewer than 4 in flight. It uses the relay's cables and staging, so it
  // is off by default. A chunk the relay's route fails goes again on the
  // direct links once the owner has fenced that route (FenceRoute).
  bool two_hop_stripe = false;
  uint32_t connections_per_path = 4;
  uint64_t slice_bytes = 512 << 10;
  uint32_t slices_in_flight = 4;         // per connection
  uint32_t max_grants_per_peer = 4096;
  uint32_t max_grants_per_pod = 1024;    // per importing pod (node and identity key)
  // Per importing tenant (node and namespace): below max_grants_per_peer, so
  // one tenant's pods cannot take all of their node's grants here.
  uint32_t max_grants_per_tenant = 2048;
  uint32_t max_handles_per_session = 1024;
  // Authenticated data connections, all peers together; a peer holding
  // fewer than kGuaranteedConnections is admitted even when they are taken.
  uint32_t max_data_connections = 256;
  uint32_t max_data_connections_per_peer = 64;
  // A data connection that brings no frame for this long is closed (the
  // importer's repair dials it again when it is next needed).
  absl::Duration data_idle_timeout = absl::Minutes(10);
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration io_timeout = absl::Seconds(5);  // TCP_USER_TIMEOUT and keepalive on data connections
  // How long opening another node's region may take per node still ahead on
  // its route (each relay may first set up its own link to the next node;
  // each relay waits less than its caller).
  absl::Duration open_per_hop = absl::Seconds(10);
  // A request the peer leaves unanswered this long fails its connection (its
  // slices go elsewhere, or fail UNAVAILABLE).
  absl::Duration answer_timeout = absl::Seconds(30);
  // "tcp": data connections (tcp/tcp_link.h). "verbs": RC queue pairs on the RDMA
  // device of each path's local address (verbs/verbs_link.h). Either way the
  // daemon serves both to its peers.
  std::string transport = "tcp";
  verbs::VerbsOptions verbs;
  // Nodes known before any has been talked to (routes through relays).
  std::vector<PeerEntry> peers;
  // Relaying for other nodes: bytes of forwarded requests held in this
  // daemon at once (one upstream node at most half of it).
  uint64_t relay_staging_bytes = 64ull << 20;
  // Owning regions opened through relays (sealed, seal/window.h): the
  // windows' memory at once (one peer node at most half of it), taken a
  // slot at a time as importers first write it.
  uint64_t sealed_window_bytes = 512ull << 20;
  // Where the host's sysfs is (its NICs and GPUs: nic_rank.h).
  std::string sysfs = "/sys";
  // Grants of a node that has had no data connection and no control call
  // here for this long are dropped (an importing daemon that died and never
  // came back); importers say hello every `keepalive` while they hold
  // handles, so a live one keeps its grants even without traffic.
  absl::Duration grant_idle_timeout = absl::Minutes(10);
  absl::Duration keepalive = absl::Seconds(60);
  // How often the certificate files are looked at again (rotation).
  absl::Duration cert_refresh = absl::Seconds(60);
  // Node adverts (mesh.proto NodeAdvert): this node re-signs its own and
  // trades adverts with every node it is cabled to this often; an advert
  // older than ten of these is dropped.
  absl::Duration advert_interval = absl::Seconds(60);
};

class MeshEngine final : public MeshPort {
 public:
  using OpenDone = Opener::OpenDone;

  // Loads the certificates, binds the control and data ports and starts
  // serving. `node_name` must be this daemon's certificate identity.
  static absl::StatusOr<std::unique_ptr<MeshEngine>> Start(MeshOptions options, std::string node_name,
                                                           MeshHost* host);
  ~MeshEngine() override;  // Stop()s
  // Stops serving and talking to other nodes: what waits on another node is
  // answered (UNAVAILABLE, the daemon stopping) before this returns, while
  // the daemon's own RPC server can still finish those calls; other nodes'
  // RDMA access to this node's exports ends. Afterwards calls fail
  // UNAVAILABLE or find nothing; idempotent.
  void Stop();

  // For tests and fuzzers (tests/fuzz/mesh_frame_fuzz.cc): an engine with no
  // listener, TLS or threads of its own; ServeFramesForTesting serves a data
  // connection as if it had authenticated for `node`, until EOF or a
  // protocol error, on the caller's thread.
  static std::unique_ptr<MeshEngine> ForTesting(MeshOptions options, std::string node_name, MeshHost* host);
  uint64_t GrantForTesting(const std::string& node, std::shared_ptr<const ExportRecord> rec) {
    return owner_->GrantForTesting(node, std::move(rec));
  }
  void ServeFramesForTesting(int fd, const std::string& node, uint64_t link_instance) {
    data_server_->ServeFrames(fd, node, link_instance);
  }
  // One pass of the idle-importer sweep the housekeeping thread makes.
  void SweepIdleImportersForTesting() { SweepIdleImporters(); }
  void DropGrantsOfGonePodsForTesting() { owner_->DropGrantsOfGonePods(); }
  // Opens a region on behalf of `node` (a relayed request goes on toward its
  // destination on a mesh thread); `done` runs once, on some thread.
  using RegionDone = RegionOwner::RegionDone;
  void OpenRegionFor(const std::string& node, const podlink::mesh::v1::OpenRegionRequest& req, RegionDone done) {
    owner_->OpenRegionFor(node, req, std::move(done));
  }

  // --- importing side --------------------------------------------------
  // Opens `target` for `pod` (session `session`) in the background; `done`
  // runs on a mesh thread.
  void OpenRemote(uint64_t session, const PodInfo& pod, RemoteTarget target, OpenDone done) {
    opener_->OpenRemote(session, pod, std::move(target), std::move(done));
  }
  // Drops a handle the session holds (NOT_FOUND: none such).
  absl::Status DropHandle(uint64_t session, uint64_t handle) { return opener_->DropHandle(session, handle); }
  void DropSession(uint64_t session) { opener_->DropSession(session); }
  // MeshPort: transfers and notifications through the relay ring (the importer's, importer/transfer.h).
  absl::Status Start(MeshTransfer t, Done done) override { return transfers_->Transfer(std::move(t), std::move(done)); }
  absl::Status Notify(uint64_t session, uint64_t handle, uint64_t value, Done done) override {
    return transfers_->Notify(session, handle, value, std::move(done));
  }

  // --- what this node advertises ----------------------------------------
  std::vector<std::string> AdvertisedAddresses() const;
  uint32_t control_port() const { return control_port_; }
  uint32_t data_port() const { return data_port_; }
  // The status and metrics (status/mesh_status.h), read from the rooms.
  std::string RenderMetrics() const { return RenderMeshMetrics(View()); }
  podlink::v1::MeshStatus Status() const { return MeshStatusOf(View()); }
  // This node's links as last read from sysfs (at start, then every minute).
  std::vector<podlink::mesh::v1::LinkInfo> LocalLinks() const { return local_nics_.Current(); }

  using Peer = ::podlink::mesh::Peer;  // control/peer.h

 private:
  MeshEngine(MeshOptions options, std::string node_name, MeshHost* host);

  // This node's addresses for choosing paths.
  std::vector<IpPrefix> LocalForPaths() const;
  // The rooms as the status reads them.
  MeshView View() const;
  // What this node knows of others' addresses (routes), from configuration
  // and from their own Hello answers.
  void Learn(const std::string& node, const std::vector<std::string>& addresses, uint32_t port);
  // Each peer's link set drops what it holds for local memory gone (DataLinks::Sweep).
  void SweepLinks();
  // The grants of nodes idle longer than grant_idle_timeout are dropped (RegionOwner::SweepIdleImporters).
  void SweepIdleImporters();
  // Transfers a sender's link instance finished (DONE) or notified: late
  // copies of their slices are dropped, a NOTIFY is delivered once
  // (links/late_copies.h; its own lock, taken alone).
  LateCopies late_copies_;
  // The configured transport's links (made in Start, the one place that reads
  // mesh.transport; TCP links until then) and the importing side over them:
  // the connector (peers, Hellos, links, the fallback to TCP) and the opener.
  void UseTransport(LinkMaker* links);
  // The Hello this node says: its version, instance and adverts.
  podlink::mesh::v1::HelloRequest OwnHello() const;
  // A keepalive's Hello: its version and instance (no adverts: those are traded every advert_interval).
  podlink::mesh::v1::HelloRequest KeepaliveHello() const;
  void HousekeepingLoop();

  const MeshOptions options_;
  const std::string node_name_;
  MeshHost* const host_;
  const uint64_t instance_;
  std::vector<IpPrefix> advertised_;
  // The NICs under them (sysfs), as last read (every minute, by the
  // housekeeping thread: routing/local_nics.h).
  LocalNics local_nics_{options_.sysfs, options_.verbs.sysfs};
  // The certificate files: gRPC watches them for its TLS (cert_files_);
  // the node key and CA for signing and checking claims are read again
  // every cert_refresh (control/credentials.h).
  NodeCredentials credentials_{options_.cert_dir, options_.cert_refresh};
  // A routed open's claim signed, and the owner's answer checked before its sealed route is made
  // (importer/routed.h). After node_name_ and credentials_, which it is made from.
  RouteSigner route_signer_{node_name_, &credentials_};
  // Other nodes' control endpoints (the routing room's book; its own lock, a leaf). After node_name_.
  KnownNodes known_{node_name_};
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> cert_files_;
  uint32_t control_port_ = 0, data_port_ = 0;
  std::unique_ptr<ControlService> service_;  // the Mesh gRPC service (control/control_service.h)
  std::unique_ptr<grpc::Server> server_;
  std::thread housekeeping_thread_;  // sweeps, keepalives, adverts, certificate reloads (HousekeepingLoop)
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};  // Stop() ran

  // The housekeeping thread waits on this for stopping_ (Stop wakes it); it guards nothing: every room below has
  // its own lock, and the counters are atomic.
  mutable absl::Mutex mu_;
  // Which importing nodes are alive (the control room's; its own lock, above the gate's and the grant table's).
  Liveness liveness_{options_.grant_idle_timeout, kHousekeepingPeriod, kPauseSlack};
  // Who may hold a data connection (the TCP data server's gate, tcp/admission.h; its own lock, a leaf).
  DataAdmission admission_{DataAdmission::Limits{options_.max_data_connections,
                                                  options_.max_data_connections_per_peer}};
  // What this node's pods opened of other nodes (the importer's room; its own lock, a leaf).
  HandleTable handles_{options_.max_handles_per_session};
  // Transfers on those handles, striped over two routes where one was joined (the importer's room; its two-hop
  // thread started in Start with mesh.two_hop_stripe, stopped by the destructor). Made in the constructor.
  std::unique_ptr<RemoteTransfers> transfers_;
  // What this node gives other nodes: opens, relays, grants and what requests do to them (the owner's room,
  // owner/region_owner.h; its locks are leaves). Made in the constructor.
  std::unique_ptr<RegionOwner> owner_;
  // The TCP data port (tcp/data_server.h): its gate is admission_, its late-copy guard late_copies_, and
  // what its frames do to grants the owner's. Made in the constructor, its thread started in Start.
  std::unique_ptr<TcpDataServer> data_server_;
  // The other nodes this one talks to (the control room's table; its own lock, control/peer_table.h).
  PeerTable peers_;
  Repairs repairs_;  // the control room's (its own thread and lock, a leaf)
  // Node adverts: the book, this node's own, their trade (the routing room's, routing/advert_trader.h; its locks
  // are leaves). Made in the constructor.
  std::unique_ptr<AdvertTrader> adverts_;
  // This node's verbs side: its devices, the server peers' queue pairs land on, registrations, and how its own
  // verbs links are made (verbs/verbs_node.h; its own lock, device calls being slow). Made in the
  // constructor.
  std::unique_ptr<verbs::VerbsNode> verbs_;
  // How this node's own links to a peer are made (control/link_maker.h): TCP always (a relay's hop, the fallback),
  // verbs with mesh.transport "verbs". Made in the constructor and Start.
  std::unique_ptr<TcpLinkMaker> tcp_links_;
  std::unique_ptr<verbs::VerbsLinkMaker> verbs_links_;
  // The importing side (control/connector.h, importer/opener.h): made by UseTransport, before any thread.
  std::unique_ptr<Connector> connector_;
  std::unique_ptr<Opener> opener_;
};

}  // namespace podlink::mesh
