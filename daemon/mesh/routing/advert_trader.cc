// Node adverts (advert_trader.h): this node's signed, peers' checked and
// learnt, and their trade with the nodes this one is cabled to.
#include "daemon/mesh/routing/advert_trader.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_join.h"
#include "common/log.h"
#include "daemon/mesh/trust/origin_sign.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

namespace {
const ComponentLog AdvertLog("mesh");
}  // namespace

struct AdvertTrader::Call {
  std::shared_ptr<pb::Mesh::Stub> stub;
  grpc::ClientContext ctx;
  pb::HelloRequest req;
  pb::HelloResponse resp;
};

AdvertTrader::~AdvertTrader() { Stop(); }

void AdvertTrader::SawNeighbour(const std::string& node, const std::string& address) {
  absl::StatusOr<IpPrefix> far = IpPrefix::Parse(address);
  if (!far.ok() || !ValidNodeName(node) || node == options_.node_name) return;
  bool direct = false;
  for (const IpPrefix& l : rooms_.local()) direct = direct || (l.SameNetwork(*far) && !(l.addr == far->addr));
  if (!direct) return;
  book_.SawNeighbour(node, address);
}

CableTrust AdvertTrader::Trust() const {
  CableTrust t;
  t.configured = options_.configured;
  t.confirmed = book_.Confirmed();
  return t;
}

void AdvertTrader::RefreshOwn(const std::vector<std::string>& addresses, uint32_t port) {
  if (!book_.OwnDue()) return;
  pb::AdvertEntry entry = book_.OwnEntry();
  entry.mutable_node()->set_node(options_.node_name);
  for (const std::string& a : addresses) entry.mutable_node()->add_addresses(a);
  entry.mutable_node()->set_port(port);
  pb::NodeAdvert own;
  entry.SerializeToString(own.mutable_entry());
  const NodeCredentials::Pems pems = credentials_.Current();
  absl::StatusOr<std::string> sig = SignWithKey(pems.key, own.entry());
  if (!sig.ok()) {
    AdvertLog()->warn("event=mesh_advert_unsigned why={}", LogQuoted(sig.status().message()));
    return;
  }
  own.set_signature(*std::move(sig));
  own.set_cert(pems.cert);
  book_.SetOwn(std::move(own), entry);
}

void AdvertTrader::Accept(const std::string& from, const google::protobuf::RepeatedPtrField<pb::NodeAdvert>& adverts) {
  if (adverts.empty()) return;
  const std::string ca = credentials_.Current().ca;
  auto verify = [&ca](const pb::NodeAdvert& a, const std::string& node) {
    return VerifyNodeSignature(ca, a.cert(), node, a.entry(), a.signature());
  };
  for (const AdvertBook::Learned& n : book_.Accept(from, adverts, verify)) {
    (void)known_.Learn(n.node, n.addresses, n.port);  // refused when not well formed, or the book is full
    if (n.first) {
      AdvertLog()->info("event=mesh_node_learned node={} from={} addresses={}", n.node, from,
                        LogQuoted(absl::StrJoin(n.addresses, ",")));
    }
  }
}

void AdvertTrader::Trade() {
  if (!book_.TradeDue()) return;
  const std::map<std::string, KnownNodes::Known> neighbours = known_.Snapshot();
  const std::vector<IpPrefix> local = rooms_.local();
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
      stub = stubs_[node];
    }
    if (stub == nullptr) {
      stub = rooms_.new_stub(node, HostPort(paths.front().remote, k.port));
      absl::MutexLock l(&mu_);
      stubs_[node] = stub;
    }
    auto call = std::make_shared<Call>();
    call->stub = stub;
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
    call->req = rooms_.hello();
    Call* c = call.get();
    {
      // Stop cancels these and waits for their callbacks, which use this.
      absl::MutexLock l(&mu_);
      if (stopped_) return;
      calls_.insert(&c->ctx);
    }
    const std::string dialed = paths.front().remote.AddressText();
    stub->async()->Hello(&c->ctx, &c->req, &c->resp, [this, call, node, dialed](grpc::Status st) mutable {
      bool stopped = false;
      {
        absl::MutexLock l(&mu_);
        stopped = stopped_;
      }
      if (st.ok() && call->resp.node_name() == node && !stopped) {
        // Reached over a shared subnet, its certificate naming it: a neighbour.
        SawNeighbour(node, dialed);
        Accept(node, call->resp.adverts());
      }
      absl::MutexLock l(&mu_);
      calls_.erase(&call->ctx);
      call.reset();
    });
  }
}

void AdvertTrader::Stop() {
  absl::MutexLock l(&mu_);
  stopped_ = true;
  for (grpc::ClientContext* c : calls_) c->TryCancel();
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.empty(); };
  mu_.Await(absl::Condition(&none));
}

}  // namespace podlink::mesh
