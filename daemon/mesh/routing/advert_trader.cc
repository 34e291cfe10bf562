// Node adverts: this node's, peers', and their trade.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

// --- node adverts ------------------------------------------------------------

void MeshEngine::SawNeighbour(const std::string& node, const std::string& address) {
  absl::StatusOr<IpPrefix> far = IpPrefix::Parse(address);
  if (!far.ok() || !ValidNodeName(node) || node == node_name_) return;
  bool direct = false;
  for (const IpPrefix& l : LocalForPaths()) direct = direct || (l.SameNetwork(*far) && !(l.addr == far->addr));
  if (!direct) return;
  adverts_.SawNeighbour(node, address);
}

CableTrust MeshEngine::Trust() const {
  CableTrust t;
  for (const PeerEntry& p : options_.peers) t.configured[p.node] = ParsePrefixes(p.addresses);
  t.confirmed = adverts_.Confirmed();
  return t;
}

std::shared_ptr<pb::Mesh::Stub> MeshEngine::NewStub(const std::string& node, const std::string& endpoint) const {
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(cert_files_);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  // The certificate must name the node we mean (the target name below).
  tls.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(node);
  return pb::Mesh::NewStub(grpc::CreateCustomChannel(endpoint, grpc::experimental::TlsCredentials(tls), args));
}

void MeshEngine::RefreshOwnAdvert() {
  if (!adverts_.OwnDue()) return;
  pb::AdvertEntry entry = adverts_.OwnEntry();
  entry.mutable_node()->set_node(node_name_);
  for (const IpPrefix& a : advertised_) entry.mutable_node()->add_addresses(a.ToString());
  entry.mutable_node()->set_port(control_port_);
  pb::NodeAdvert own;
  entry.SerializeToString(own.mutable_entry());
  const NodeCredentials::Pems pems = credentials_.Current();
  absl::StatusOr<std::string> sig = SignWithKey(pems.key, own.entry());
  if (!sig.ok()) {
    Log()->warn("event=mesh_advert_unsigned why={}", LogQuoted(sig.status().message()));
    return;
  }
  own.set_signature(*std::move(sig));
  own.set_cert(pems.cert);
  adverts_.SetOwn(std::move(own), entry);
}

void MeshEngine::AcceptAdverts(const std::string& from,
                               const google::protobuf::RepeatedPtrField<pb::NodeAdvert>& adverts) {
  if (adverts.empty()) return;
  const std::string ca = credentials_.Current().ca;
  auto verify = [&ca](const pb::NodeAdvert& a, const std::string& node) {
    return VerifyNodeSignature(ca, a.cert(), node, a.entry(), a.signature());
  };
  for (const AdvertBook::Learned& n : adverts_.Accept(from, adverts, verify)) {
    Learn(n.node, n.addresses, n.port);
    if (n.first) {
      Log()->info("event=mesh_node_learned node={} from={} addresses={}", n.node, from,
                  LogQuoted(absl::StrJoin(n.addresses, ",")));
    }
  }
}

void MeshEngine::AddAdverts(google::protobuf::RepeatedPtrField<pb::NodeAdvert>* out) const { adverts_.AddTo(out); }

void MeshEngine::TradeAdverts() {
  if (!adverts_.TradeDue()) return;
  const std::map<std::string, KnownNodes::Known> neighbours = known_.Snapshot();
  const std::vector<IpPrefix> local = LocalForPaths();
  struct Call {
    std::shared_ptr<pb::Mesh::Stub> stub;
    grpc::ClientContext ctx;
    pb::HelloRequest req;
    pb::HelloResponse resp;
  };
  for (const auto& entry : neighbours) {
    const std::string node = entry.first;  // a copy: the callback below keeps it (clang cannot capture a binding)
    const KnownNodes::Known& k = entry.second;
    std::vector<IpPrefix> remote = ParsePrefixes(k.addresses);
    // Cabled to this node (a shared subnet): adverts travel hop by hop.
    std::vector<Path> paths = ChoosePaths(local, remote, false);
    if (paths.empty()) continue;
    std::shared_ptr<pb::Mesh::Stub> stub;
    {
      absl::MutexLock l(&mu_);
      stub = advert_stubs_[node];
    }
    if (stub == nullptr) {
      stub = NewStub(node, HostPort(paths.front().remote, k.port));
      absl::MutexLock l(&mu_);
      advert_stubs_[node] = stub;  // known_ is bounded, so is this
    }
    auto call = std::make_shared<Call>();
    call->stub = stub;
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
    call->req = OwnHello();
    Call* c = call.get();
    {
      // The destructor cancels these and waits for their callbacks, which use the engine.
      absl::MutexLock l(&advert_calls_mu_);
      if (stopping_.load(std::memory_order_acquire)) return;
      advert_calls_.insert(&c->ctx);
    }
    const std::string dialed = paths.front().remote.AddressText();
    stub->async()->Hello(&c->ctx, &c->req, &c->resp, [this, call, node, dialed](grpc::Status st) mutable {
      if (st.ok() && call->resp.node_name() == node && !stopping_.load(std::memory_order_acquire)) {
        // Reached over a shared subnet, its certificate naming it: a neighbour.
        SawNeighbour(node, dialed);
        AcceptAdverts(node, call->resp.adverts());
      }
      absl::MutexLock l(&advert_calls_mu_);
      advert_calls_.erase(&call->ctx);
      call.reset();
    });
  }
}

}  // namespace podlink::mesh
