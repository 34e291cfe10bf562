// Node adverts: this node's, peers', and their trade.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

// --- node adverts ------------------------------------------------------------

namespace {
constexpr size_t kMaxAdvertsPerMessage = 48;
constexpr size_t kMaxAdvertEntry = 4 << 10;
constexpr int kAdvertLifetimes = 10;  // an advert older than this many intervals is stale
constexpr size_t kMaxNeighbours = 64;
}  // namespace

void MeshEngine::SawNeighbour(const std::string& node, const std::string& address) {
  absl::StatusOr<IpPrefix> far = IpPrefix::Parse(address);
  if (!far.ok() || !ValidNodeName(node) || node == node_name_) return;
  bool direct = false;
  for (const IpPrefix& l : LocalForPaths()) direct = direct || (l.SameNetwork(*far) && !(l.addr == far->addr));
  if (!direct) return;
  absl::MutexLock l(&mu_);
  if (!neighbours_.contains(node)) {
    if (neighbours_.size() >= kMaxNeighbours) return;
    Log()->info("event=mesh_neighbour node={} address={}", node, address);
    // Said in this node's advert, and traded, at the next housekeeping.
    own_advert_signed_ = absl::InfinitePast();
    adverts_traded_ = absl::InfinitePast();
  }
  neighbours_[node] = absl::Now();
}

CableTrust MeshEngine::Trust() const {
  CableTrust t;
  for (const PeerEntry& p : options_.peers) t.configured[p.node] = ParsePrefixes(p.addresses);
  absl::MutexLock l(&mu_);
  for (const auto& [node, s] : adverts_) {
    for (const std::string& n : s.neighbours) {
      auto other = adverts_.find(n);
      if (n != node && other != adverts_.end() && other->second.neighbours.contains(node)) {
        t.confirmed.insert(node < n ? std::make_pair(node, n) : std::make_pair(n, node));
      }
    }
  }
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
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() - own_advert_signed_ < options_.advert_interval) return;
    own_advert_signed_ = absl::Now();
  }
  pb::AdvertEntry entry;
  entry.mutable_node()->set_node(node_name_);
  for (const IpPrefix& a : advertised_) entry.mutable_node()->add_addresses(a.ToString());
  entry.mutable_node()->set_port(control_port_);
  {
    absl::MutexLock l(&mu_);
    const absl::Time recent = absl::Now() - kAdvertLifetimes * options_.advert_interval;
    for (auto it = neighbours_.begin(); it != neighbours_.end();) {
      if (it->second < recent) {
        it = neighbours_.erase(it);
        continue;
      }
      if (entry.neighbours_size() < static_cast<int>(kMaxNeighbours)) entry.add_neighbours(it->first);
      ++it;
    }
  }
  const int64_t issued = absl::ToUnixSeconds(absl::Now());
  entry.set_issued_unix_seconds(issued);
  StoredAdvert own;
  own.issued = issued;
  own.neighbours.insert(entry.neighbours().begin(), entry.neighbours().end());
  entry.SerializeToString(own.advert.mutable_entry());
  const Pems pems = CurrentPems();
  absl::StatusOr<std::string> sig = SignWithKey(pems.key, own.advert.entry());
  if (!sig.ok()) {
    Log()->warn("event=mesh_advert_unsigned why={}", LogQuoted(sig.status().message()));
    return;
  }
  own.advert.set_signature(*std::move(sig));
  own.advert.set_cert(pems.cert);
  const int64_t oldest = issued - kAdvertLifetimes * absl::ToInt64Seconds(options_.advert_interval);
  absl::MutexLock l(&mu_);
  adverts_[node_name_] = std::move(own);
  for (auto it = adverts_.begin(); it != adverts_.end();) {
    it = it->second.issued < oldest ? adverts_.erase(it) : std::next(it);  // stale: its node went quiet
  }
}

void MeshEngine::AcceptAdverts(const std::string& from,
                               const google::protobuf::RepeatedPtrField<pb::NodeAdvert>& adverts) {
  if (adverts.empty()) return;
  const absl::Time now = absl::Now();
  const int64_t now_s = absl::ToUnixSeconds(now);
  const int64_t oldest = now_s - kAdvertLifetimes * absl::ToInt64Seconds(options_.advert_interval);
  {
    // Verifying costs a signature check per advert: one batch per sender a second.
    absl::MutexLock l(&mu_);
    auto it = adverts_from_.find(from);
    if (it != adverts_from_.end() && now - it->second < absl::Seconds(1)) return;
    if (it == adverts_from_.end() && adverts_from_.size() >= 4096) return;
    adverts_from_[from] = now;
  }
  const std::string ca = CurrentPems().ca;
  uint64_t refused = 0;
  int n = 0;
  for (const pb::NodeAdvert& a : adverts) {
    if (++n > static_cast<int>(kMaxAdvertsPerMessage)) break;
    pb::AdvertEntry entry;
    if (a.entry().size() > kMaxAdvertEntry || a.cert().size() > kMaxCertPem || a.signature().size() > kMaxSignature ||
        !entry.ParseFromString(a.entry())) {
      ++refused;
      continue;
    }
    const std::string& node = entry.node().node();
    const int64_t issued = entry.issued_unix_seconds();
    if (!ValidNodeName(node) || issued < oldest || issued > now_s + 60) {
      refused += ValidNodeName(node) ? 0 : 1;  // stale or early: simply not new
      continue;
    }
    if (node == node_name_) continue;  // this node's word about itself is its own
    {
      absl::MutexLock l(&mu_);
      auto it = adverts_.find(node);
      if (it != adverts_.end() && it->second.issued >= issued) continue;  // known already: no check again
      if (it == adverts_.end() && adverts_.size() >= 1024) continue;
    }
    if (absl::Status st = VerifyNodeSignature(ca, a.cert(), node, a.entry(), a.signature()); !st.ok()) {
      Log()->warn("event=mesh_advert_refused from={} node={} why={}", from, node, LogQuoted(st.message()));
      ++refused;
      continue;
    }
    std::vector<std::string> addresses(entry.node().addresses().begin(), entry.node().addresses().end());
    bool fresh = false;
    {
      absl::MutexLock l(&mu_);
      StoredAdvert& s = adverts_[node];
      if (s.issued >= issued) continue;  // a newer one came in meanwhile
      fresh = s.issued == 0;
      s.advert = a;
      s.issued = issued;
      std::set<std::string> said;
      for (const std::string& n : entry.neighbours()) {
        if (said.size() >= kMaxNeighbours) break;
        if (ValidNodeName(n)) said.insert(n);
      }
      if (said != s.neighbours) {
        Log()->info("event=mesh_node_neighbours node={} neighbours={}", node, LogQuoted(absl::StrJoin(said, ",")));
        s.neighbours = std::move(said);
      }
    }
    // Said by the node itself, whoever passed it on: routes may go through it.
    Learn(node, addresses, entry.node().port());
    if (fresh) {
      Log()->info("event=mesh_node_learned node={} from={} addresses={}", node, from,
                  LogQuoted(absl::StrJoin(addresses, ",")));
    }
  }
  if (refused > 0) {
    absl::MutexLock l(&mu_);
    adverts_refused_ += refused;
  }
}

void MeshEngine::AddAdverts(google::protobuf::RepeatedPtrField<pb::NodeAdvert>* out) const {
  const int64_t oldest =
      absl::ToUnixSeconds(absl::Now()) - kAdvertLifetimes * absl::ToInt64Seconds(options_.advert_interval);
  absl::MutexLock l(&mu_);
  std::vector<const StoredAdvert*> others;
  for (const auto& [node, s] : adverts_) {
    if (node == node_name_) continue;
    if (s.issued >= oldest) others.push_back(&s);
  }
  std::sort(others.begin(), others.end(),
            [](const StoredAdvert* a, const StoredAdvert* b) { return a->issued > b->issued; });
  if (auto own = adverts_.find(node_name_); own != adverts_.end()) *out->Add() = own->second.advert;
  for (const StoredAdvert* s : others) {
    if (static_cast<size_t>(out->size()) >= kMaxAdvertsPerMessage) break;
    *out->Add() = s->advert;
  }
}

void MeshEngine::TradeAdverts() {
  std::map<std::string, Known> neighbours;
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() - adverts_traded_ < options_.advert_interval) return;
    adverts_traded_ = absl::Now();
    neighbours = known_;
  }
  const std::vector<IpPrefix> local = LocalForPaths();
  struct Call {
    std::shared_ptr<pb::Mesh::Stub> stub;
    grpc::ClientContext ctx;
    pb::HelloRequest req;
    pb::HelloResponse resp;
  };
  for (const auto& entry : neighbours) {
    const std::string node = entry.first;  // a copy: the callback below keeps it (clang cannot capture a binding)
    const Known& k = entry.second;
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
    call->req.set_version(PODLINK_VERSION);
    call->req.set_instance(instance_);
    AddAdverts(call->req.mutable_adverts());
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
