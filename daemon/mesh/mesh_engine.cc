// The mesh engine: the rooms made and wired, started and stopped, and the
// housekeeping thread; the entry points the relay and the broker call
// (mesh_engine.h). The rooms: control/, owner/, routing/, importer/, links/,
// tcp/, verbs/, seal/, status/.
#include "daemon/mesh/mesh_engine.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/links/random.h"
#include "daemon/mesh/verbs/verbs_api.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

namespace {
const ComponentLog EngineLog("mesh");
}  // namespace

// ---------------------------------------------------------------------------

MeshEngine::MeshEngine(MeshOptions options, std::string node_name, MeshHost* host)
    : options_(std::move(options)), node_name_(std::move(node_name)), host_(host), instance_(RandomU64()) {
  // The owner's room reaches the others through these: the importer opens a relay's next hop, the routing
  // room knows relays' addresses, the verbs server registers and stages grants (verbs/verbs_node.h).
  RegionOwner::Rooms rooms;
  rooms.open_through = [this](const RemoteTarget& hop, pb::OpenRegionRequest req, const std::string& destination,
                              size_t relays, std::function<void(absl::StatusOr<Carried>)> got) {
    opener_->OpenThrough(hop, std::move(req), destination, relays, std::move(got));
  };
  rooms.known = [this](const std::string& node) { return known_.Find(node); };
  rooms.register_for_verbs = [this](const std::string& node, uint64_t grant,
                                    const std::shared_ptr<const ExportRecord>& rec, bool over_tcp_ok, bool staged_ok,
                                    bool may_register, pb::OpenRegionResponse* resp) {
    return verbs_->Register(node, grant, rec, over_tcp_ok, staged_ok, may_register, resp);
  };
  rooms.prepare_staging = [this](const std::string& caller) { return verbs_->PrepareStaging(caller); };
  rooms.unregister_verbs = [this](const std::string& node, uint64_t grant) { verbs_->Unregister(node, grant); };
  transfers_ = std::make_unique<RemoteTransfers>(
      RemoteTransfers::Options{.io_timeout = options_.io_timeout, .sysfs = options_.sysfs}, host_, &handles_);
  // The verbs server's notifications and staged slices are the owner's (owner/frames.cc).
  verbs_ = std::make_unique<verbs::VerbsNode>(
      verbs::VerbsNode::Options{.node_name = node_name_,
                                .verbs = options_.verbs,
                                .qps_per_path = options_.connections_per_path,
                                .slice_bytes = options_.slice_bytes,
                                .slices_in_flight = options_.slices_in_flight,
                                .answer_timeout = options_.answer_timeout,
                                .staged_only = options_.verbs_staged_only},
      verbs::VerbsNode::Sinks{
          .notify = [this](const std::string& node, uint64_t grant,
                           uint64_t value) { owner_->DeliverVerbsNotify(node, grant, value); },
          .stage = [this](const std::string& node, uint64_t grant, bool write, uint64_t offset, char* buf,
                          uint64_t length, std::shared_ptr<const void> keep, std::function<void(absl::Status)> done) {
            owner_->StagedSlice(node, grant, write, offset, buf, length, std::move(keep), std::move(done));
          }});
  owner_ = std::make_unique<RegionOwner>(
      RegionOwner::Options{.node_name = node_name_,
                           .instance = instance_,
                           .io_timeout = options_.io_timeout,
                           .answer_timeout = options_.answer_timeout,
                           .limits = {options_.max_grants_per_peer, options_.max_grants_per_pod,
                                      options_.max_grants_per_tenant},
                           .relay_staging_bytes = options_.relay_staging_bytes,
                           .sealed_window_bytes = options_.sealed_window_bytes,
                           .grant_idle_timeout = options_.grant_idle_timeout},
      host_, &credentials_, &liveness_, &late_copies_, std::move(rooms));
  // What the data server's frames do to grants is the owner's (owner/frames.cc); a connection's end is a sign
  // of life for the idle-importer sweep.
  TcpDataServer::Owner owner;
  owner.serve = [this](const std::shared_ptr<ConnWriter>& writer, int fd, const FrameHeader& h,
                       const std::string& node, uint64_t link_instance) {
    return owner_->ServeGrantFrame(writer, fd, h, node, link_instance);
  };
  owner.ended = [this](const std::string& node) { liveness_.Seen(node); };
  data_server_ = std::make_unique<TcpDataServer>(
      TcpDataServer::Options{.io_timeout = options_.io_timeout, .idle_timeout = options_.data_idle_timeout},
      admission_, late_copies_, std::move(owner));
  AdvertTrader::Options advertising{.node_name = node_name_,
                                    .interval = options_.advert_interval,
                                    .connect_timeout = options_.connect_timeout};
  for (const PeerEntry& p : options_.peers) advertising.configured[p.node] = ParsePrefixes(p.addresses);
  adverts_ = std::make_unique<AdvertTrader>(
      std::move(advertising),
      AdvertTrader::Rooms{.local = [this] { return LocalForPaths(); },
                          .new_stub = [this](const std::string& node,
                                             const std::string& endpoint) {
                            return NewMeshStub(cert_files_, node, endpoint);
                          },
                          .hello = [this] { return OwnHello(); }},
      &credentials_, &known_);
  tcp_links_ = std::make_unique<TcpLinkMaker>(TcpLinkMaker::Options{.connections_per_path = options_.connections_per_path,
                                                                    .slice_bytes = options_.slice_bytes,
                                                                    .slices_in_flight = options_.slices_in_flight,
                                                                    .answer_timeout = options_.answer_timeout,
                                                                    .zero_copy = options_.tcp_zero_copy,
                                                                    .connect_timeout = options_.connect_timeout,
                                                                    .io_timeout = options_.io_timeout},
                                              &repairs_);
  UseTransport(tcp_links_.get());
}

void MeshEngine::UseTransport(LinkMaker* links) {
  Connector::Rooms rooms;
  rooms.local = [this] { return LocalForPaths(); };
  rooms.new_stub = [this](const std::string& node, const std::string& endpoint) {
    return NewMeshStub(cert_files_, node, endpoint);
  };
  rooms.hello = [this] { return OwnHello(); };
  rooms.heard = [this](const std::string& node, const pb::HelloResponse& hello) {
    // Said by the node itself (its certificate names it): routes may go
    // through it to the nodes it is cabled to.
    Learn(node, {hello.addresses().begin(), hello.addresses().end()}, hello.control_port());
    adverts_->Accept(node, hello.adverts());
  };
  // A full peer table forgets a peer only if no handle and no relay's grant goes through it.
  rooms.in_use = [this] {
    std::vector<std::shared_ptr<Peer>> used = handles_.Peers();
    for (const auto& f : owner_->grants().Forwards()) used.push_back(f->peer);
    return used;
  };
  connector_ = std::make_unique<Connector>(
      Connector::Options{.fallback = options_.fallback,
                         .verbs_tcp_fallback = options_.verbs_tcp_fallback,
                         .connect_timeout = options_.connect_timeout},
      std::move(rooms), &peers_, &stopping_, links, tcp_links_.get());
  opener_ = std::make_unique<Opener>(
      Opener::Options{.node_name = node_name_,
                      .instance = instance_,
                      .fallback = options_.fallback,
                      .two_hop_stripe = options_.two_hop_stripe && links->stripes_two_hop(),
                      .open_per_hop = options_.open_per_hop},
      Opener::Routing{.local = [this] { return LocalForPaths(); }, .trust = [this] { return adverts_->Trust(); }},
      connector_.get(), &handles_, transfers_.get(), &route_signer_, &known_, &stopping_);
}

pb::HelloRequest MeshEngine::KeepaliveHello() const {
  pb::HelloRequest req;
  req.set_version(PODLINK_VERSION);
  req.set_instance(instance_);
  return req;
}

pb::HelloRequest MeshEngine::OwnHello() const {
  pb::HelloRequest req;
  req.set_version(PODLINK_VERSION);
  req.set_instance(instance_);
  adverts_->AddTo(req.mutable_adverts());
  return req;
}

std::unique_ptr<MeshEngine> MeshEngine::ForTesting(MeshOptions options, std::string node_name, MeshHost* host) {
  return std::unique_ptr<MeshEngine>(new MeshEngine(std::move(options), std::move(node_name), host));
}

absl::StatusOr<std::unique_ptr<MeshEngine>> MeshEngine::Start(MeshOptions options, std::string node_name,
                                                              MeshHost* host) {
  if (node_name.empty()) return absl::InvalidArgumentError("the mesh needs this node's name (--node-name or $NODE_NAME)");
  if (options.connections_per_path == 0 || options.connections_per_path > 16) {
    return absl::InvalidArgumentError("mesh.connections_per_path must be 1 to 16");
  }
  std::unique_ptr<MeshEngine> e(new MeshEngine(std::move(options), std::move(node_name), host));
  const MeshOptions& o = e->options_;
  // The one place that reads mesh.transport: how this node's own links to a
  // peer are made and what they can do (a LinkMaker). The TCP links are the
  // default.
  if (o.transport == "verbs") {
    // Said at start, not at the first pod's open: this node cannot use verbs.
    absl::StatusOr<const verbs::VerbsApi*> api = verbs::LoadVerbs();
    if (!api.ok()) return api.status();
    e->verbs_links_ = std::make_unique<verbs::VerbsLinkMaker>(o.connect_timeout, e->verbs_.get(), &e->repairs_);
    e->UseTransport(e->verbs_links_.get());
  } else if (o.transport != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat("mesh.transport '", o.transport, "': tcp or verbs"));
  }
  PODLINK_RETURN_IF_ERROR(e->credentials_.Load());
  if (!o.addresses.empty()) {
    for (const std::string& a : o.addresses) {
      PODLINK_ASSIGN_OR_RETURN(IpPrefix p, IpPrefix::Parse(a));
      // The netdev that holds the address, if one does (its NIC is ranked
      // and shown); an address no interface holds stays without.
      for (const IpPrefix& mine : LocalAddresses({})) {
        if (mine.family == p.family && mine.addr == p.addr) p.netdev = mine.netdev;
      }
      e->advertised_.push_back(p);
    }
  } else {
    e->advertised_ = LocalAddresses(o.interfaces);
  }
  if (e->advertised_.empty()) {
    return absl::FailedPreconditionError("the mesh has no address to advertise (no interface is up, or "
                                         "mesh.interfaces names none that has an address)");
  }
  e->local_nics_.Read(e->advertised_);  // before the first Hello is answered

  // Data port: plain TCP, every connection authenticated by its first frame.
  PODLINK_RETURN_IF_ERROR(e->data_server_->Listen(o.data_port));
  e->data_port_ = e->data_server_->port();

  // Control plane: gRPC over mutual TLS. The files are watched (a
  // cert-manager secret rotated in place, or a new CA bundle, takes effect
  // for new connections within cert_refresh, without a restart).
  e->cert_files_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.cert_dir + "/tls.key", o.cert_dir + "/tls.crt", o.cert_dir + "/ca.crt",
      static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(o.cert_refresh))));
  grpc::experimental::TlsServerCredentialsOptions tls(e->cert_files_);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ControlService::Rooms rooms{.owner = e->owner_.get(),
                              .admission = &e->admission_,
                              .verbs = e->verbs_.get(),
                              .liveness = &e->liveness_,
                              .adverts = e->adverts_.get(),
                              .describe = [p = e.get()](pb::HelloResponse* resp) {
                                for (const std::string& a : p->AdvertisedAddresses()) resp->add_addresses(a);
                                resp->set_control_port(p->control_port_);
                                for (pb::LinkInfo& l : p->LocalLinks()) *resp->add_links() = std::move(l);
                              }};
  e->service_ = std::make_unique<ControlService>(
      ControlService::Options{.node_name = e->node_name_,
                              .instance = e->instance_,
                              .data_port = e->data_port_,
                              .advertised = e->advertised_},
      std::move(rooms));
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(o.listen, grpc::experimental::TlsServerCredentials(tls), &port);
  b.RegisterService(e->service_.get());
  b.AddChannelArgument(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 1 << 20);
  b.AddChannelArgument("grpc.server_handshake_timeout_ms", 5000);
  e->server_ = b.BuildAndStart();
  if (e->server_ == nullptr || port == 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot serve the mesh control plane on ", o.listen,
                                                      " (address in use, or the certificates do not load)"));
  }
  e->control_port_ = static_cast<uint32_t>(port);
  e->data_server_->Start();
  e->adverts_->RefreshOwn(e->AdvertisedAddresses(), e->control_port_);  // before the first Hello it could be asked for
  e->repairs_.Start();
  e->housekeeping_thread_ = std::thread([p = e.get()] { p->HousekeepingLoop(); });
  if (e->options_.two_hop_stripe) e->transfers_->StartTwoHopThread();
  for (const PeerEntry& peer : o.peers) e->Learn(peer.node, peer.addresses, peer.port);
  std::vector<std::string> adv;
  for (const IpPrefix& a : e->advertised_) adv.push_back(a.ToString());
  EngineLog()->info("event=mesh_ready node={} control={} data_port={} addresses={} transport={}", e->node_name_, o.listen,
                    e->data_port_, absl::StrJoin(adv, ","), o.transport);
  return e;
}

MeshEngine::~MeshEngine() {
  Stop();
  // The two-hop thread outlives Stop: a striped transfer started meanwhile
  // still ends on it, never inside its Start. Nothing is queued after this.
  transfers_->StopTwoHopThread();
}

void MeshEngine::Stop() {
  if (stopped_.exchange(true, std::memory_order_acq_rel)) return;
  stopping_.store(true, std::memory_order_release);
  repairs_.Stop();  // no repair starts from now on (one running ends before Join below returns)
  owner_->BeginStop();  // serving threads waiting for relay staging go on (and end)
  transfers_->BeginStop();
  verbs_->BeginStop();  // no verbs server is made from now on
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  data_server_->Stop();  // no data connection is accepted from now on
  {
    absl::MutexLock l(&mu_);  // wakes HousekeepingLoop, which sees stopping_
  }
  repairs_.Join();
  if (housekeeping_thread_.joinable()) housekeeping_thread_.join();
  {
    // Advert trades still in flight (started by the housekeeping thread, now gone).
    adverts_->Stop();
  }
  admission_.ShutdownAndWait();
  std::map<std::string, std::shared_ptr<Peer>> peers = peers_.Close();
  // Workers first (a queued open finds the engine stopping and answers so; one
  // dropped is answered as its holder goes), then the links, which fail what
  // is in flight into the relay, still alive.
  for (auto& [node, p] : peers) p->Stop();
  for (auto& [node, p] : peers) p->set_links(nullptr);
  // Striped transfers still waiting for submissions find no links now and
  // end (on the two-hop thread, which the destructor stops).
  peers.clear();
  // Relay grants hold their next node; it was one of the peers above. Pods'
  // handles go too (an open finishing meanwhile was refused: stopping).
  std::map<uint64_t, Grant> grants = owner_->CloseAll();
  std::map<uint64_t, Handle> handles = handles_.Close();
  handles.clear();
  grants.clear();
  // Other nodes' access to this node's memory ends now, not when the daemon
  // object goes: the exports are withdrawn next (sessions closing).
  verbs_->Stop();
}

void MeshEngine::Learn(const std::string& node, const std::vector<std::string>& addresses, uint32_t port) {
  (void)known_.Learn(node, addresses, port);  // refused when not well formed, or the book is full
}

std::vector<IpPrefix> MeshEngine::LocalForPaths() const {
  return options_.addresses.empty() ? LocalAddresses(options_.interfaces) : advertised_;
}

MeshView MeshEngine::View() const {
  return MeshView{.node_name = node_name_,
                  .addresses = AdvertisedAddresses(),
                  .control_port = control_port_,
                  .data_port = data_port_,
                  .local_links = LocalLinks(),
                  .peers = &peers_,
                  .handles = &handles_,
                  .owner = owner_.get(),
                  .known = &known_,
                  .adverts = &adverts_->book(),
                  .admission = &admission_,
                  .data_server = data_server_.get(),
                  .repairs = &repairs_,
                  .late_copies = &late_copies_,
                  .liveness = &liveness_,
                  .transfers = transfers_.get(),
                  .opener = opener_.get(),
                  .connector = connector_.get(),
                  .verbs = verbs_.get()};
}

std::vector<std::string> MeshEngine::AdvertisedAddresses() const {
  std::vector<std::string> out;
  for (const IpPrefix& a : advertised_) out.push_back(a.ToString());
  return out;
}

void MeshEngine::SweepIdleImporters() {
  owner_->SweepIdleImporters([this](const std::string& node) { return admission_.Connected(node); });
}

void MeshEngine::SweepLinks() {
  for (const auto& p : peers_.All()) {
    if (std::shared_ptr<DataLinks> l = p->links()) l->Sweep();
  }
}

// Every 200 ms, on a thread of its own: a repair can wait seconds on a dial
// or an OpenVerbs call, and none of this may wait behind it (the sweep ends
// RDMA access to a withdrawn export; keepalives and adverts keep this node's
// grants and routes alive elsewhere).
void MeshEngine::HousekeepingLoop() {
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      auto stop = [this] { return stopping_.load(std::memory_order_acquire); };
      mu_.AwaitWithTimeout(absl::Condition(&stop), kHousekeepingPeriod);
      if (stop()) return;
    }
    // Registrations whose grant closed or whose export went away are dropped.
    verbs_->Sweep([this](uint64_t grant) { return owner_->grants().Contains(grant); },
                  [this](const std::string& node, uint64_t grant) { (void)owner_->GrantedExport(node, grant); });
    SweepLinks();
    local_nics_.RefreshIfDue(advertised_);
    credentials_.Refresh();
    SweepIdleImporters();
    owner_->DropGrantsOfGonePods();
    connector_->KeepAlive(options_.keepalive, KeepaliveHello());
    adverts_->RefreshOwn(AdvertisedAddresses(), control_port_);
    adverts_->Trade();
  }
}

}  // namespace podlink::mesh
