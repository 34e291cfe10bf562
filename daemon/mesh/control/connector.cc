// The control room's connector: the peer for a node, its Hello and links (the
// transport's LinkMaker), an open carried over TCP where RDMA cannot, and a
// grant bound to the links that carry it.
#include "daemon/mesh/control/connector.h"

#include <grpcpp/grpcpp.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/control/answer_once.h"
#include "daemon/mesh/links/stopping.h"
#include "daemon/mesh/tcp/sockets.h"

namespace podlink::mesh {

namespace {
const ComponentLog ConnectorLog("mesh");
}  // namespace

std::shared_ptr<Peer> Connector::PeerFor(const RemoteTarget& target, bool tcp) {
  tcp = tcp && !links_->carries_relayed_grants();  // with TCP links anyway, one peer serves both
  // Stopping: the peers were taken away already (a worker's open that
  // needs another peer, OverTcp, gets none).
  if (stopping()) return nullptr;
  // A full table forgets a peer only if no handle and no relay's grant goes through it.
  return peers_->Get(target.node_name, tcp, rooms_.in_use);
}

void Connector::CarryGrant(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                           const pb::OpenRegionResponse& resp,
                           std::function<void(const std::shared_ptr<Peer>&)> install,
                           std::function<void(absl::Status)> failed) {
  std::shared_ptr<DataLinks> links = peer->links();
  if (links == nullptr || !links->RegistersRegions()) return install(peer);
  if (!resp.staged_reason().empty()) {
    // The owner moves each slice between the export and its bounce pool;
    // this node's queue pairs carry it as for any other grant.
    ConnectorLog()->info("event=mesh_region_staged node={} export={} grant={} why={}", target.node_name,
                         resp.export_id(), resp.grant(), LogQuoted(resp.staged_reason().substr(0, 256)));
    links->AddStagedRegion(resp.grant(), resp.staged_slice_bytes());
    return install(peer);
  }
  if (resp.over_tcp_reason().empty()) {
    std::vector<RegionKey> keys;
    for (const pb::VerbsKey& k : resp.verbs_keys()) keys.push_back(RegionKey{k.device(), k.rkey(), k.base()});
    links->AddRegion(resp.grant(), std::move(keys));
    return install(peer);
  }
  // The owner cannot register this export for RDMA (a GPU export its NICs
  // cannot reach by dma-buf, memory it may not pin): the grant is carried by
  // this node's TCP links to it instead.
  ConnectorLog()->info("event=mesh_region_over_tcp node={} export={} grant={} why={}", target.node_name,
                       resp.export_id(), resp.grant(), LogQuoted(resp.over_tcp_reason().substr(0, 256)));
  OverTcp(target, [peer, grant = resp.grant(), install = std::move(install),
                   failed = std::move(failed)](absl::StatusOr<std::shared_ptr<Peer>> tcp) {
    if (!tcp.ok()) {
      ReleaseRemoteGrant(peer.get(), grant);
      return failed(tcp.status());
    }
    install(*tcp);
  });
}

void Connector::ConnectOrOverTcp(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                                 std::function<void(const std::shared_ptr<Peer>&)> then,
                                 std::function<void(absl::Status)> failed) {
  // The node answered, but no RDMA path to it came up lately (no RDMA
  // device or GID for this node's address, the owner refusing the queue
  // pairs): over the TCP links to it instead, said and counted, without
  // trying RDMA again for kVerbsRetry.
  constexpr absl::Duration kVerbsRetry = absl::Seconds(30);
  bool verbs_failed = false;
  absl::Status st;
  if (options_.verbs_tcp_fallback && !peer->tcp() && absl::Now() < peer->verbs_retry_after() &&
      (peer->links() == nullptr || peer->links()->live() == 0)) {
    verbs_failed = true;
    st = absl::UnavailableError(absl::StrCat("no RDMA path to node ", target.node_name, " came up lately"));
  } else {
    st = Connect(peer, target, &verbs_failed);
    if (verbs_failed) peer->set_verbs_retry_after(absl::Now() + kVerbsRetry);
  }
  if (st.ok()) return then(peer);
  if (!verbs_failed || !options_.verbs_tcp_fallback) return failed(st);
  verbs_fallbacks_.fetch_add(1, std::memory_order_relaxed);
  if (fallback_log_.Due()) {
    ConnectorLog()->warn("event=mesh_verbs_fallback node={} why={} (opens over TCP so far: {})", target.node_name,
                         LogQuoted(st.message().substr(0, 512)), verbs_fallbacks_.load(std::memory_order_relaxed));
  }
  OverTcp(target, [then = std::move(then), failed = std::move(failed), st](absl::StatusOr<std::shared_ptr<Peer>> tcp) {
    if (!tcp.ok()) {
      return failed(absl::Status(tcp.status().code(),
                                 absl::StrCat(tcp.status().message(), " (over RDMA before: ", st.message(), ")")));
    }
    then(*tcp);
  });
}

void Connector::OverTcp(const RemoteTarget& target, std::function<void(absl::StatusOr<std::shared_ptr<Peer>>)> next) {
  std::shared_ptr<Peer> tcp = PeerFor(target, /*tcp=*/true);
  if (tcp == nullptr) {
    return next(NoPeer());
  }
  auto answer = std::make_shared<AnswerOnce<std::shared_ptr<Peer>>>(
      std::move(next), "the open over TCP was dropped (podlinkd is stopping)");
  // Connected on that peer's own worker, as every dial of it is; the task
  // holds no reference to its own peer (a worker must not outlive it).
  std::weak_ptr<Peer> weak = tcp;
  bool posted = tcp->Post([this, weak, target, answer] {
    std::shared_ptr<Peer> peer = weak.lock();
    if (peer == nullptr) return;  // going away: the answer's last holder says so
    if (stopping()) return (*answer)(StoppingStatus());
    if (absl::Status st = Connect(peer, target); !st.ok()) return (*answer)(st);
    (*answer)(std::move(peer));
  });
  if (!posted) {
    (*answer)(NotQueued(target.node_name));
  }
}

absl::Status Connector::Connect(const std::shared_ptr<Peer>& peer, const RemoteTarget& target, bool* verbs_failed) {
  Peer& p = *peer;
  if (auto links = p.links(); links != nullptr && links->live() > 0 && p.stub() != nullptr) return absl::OkStatus();
  std::vector<IpPrefix> remote = ParsePrefixes(target.addresses);
  std::vector<IpPrefix> local = rooms_.local();
  std::vector<Path> paths = ChoosePaths(local, remote, options_.fallback);
  if (paths.empty()) {
    std::vector<std::string> mine;
    for (const IpPrefix& a : local) mine.push_back(a.ToString());
    return absl::FailedPreconditionError(absl::StrCat(
        "no direct link reaches node ", target.node_name, ": it advertises [", absl::StrJoin(target.addresses, ", "),
        "], this node has [", absl::StrJoin(mine, ", "), "] (set mesh.fallback to let the kernel route)"));
  }
  std::string endpoint = HostPort(paths.front().remote, target.port);
  std::shared_ptr<pb::Mesh::Stub> stub = rooms_.new_stub(target.node_name, endpoint);
  pb::HelloResponse hello;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
    pb::HelloRequest req = rooms_.hello();
    PODLINK_RETURN_IF_ERROR(FromGrpc(stub->Hello(&ctx, req, &hello), target.node_name));
  }
  if (hello.node_name() != target.node_name) {
    return absl::PermissionDeniedError(
        absl::StrCat("the daemon at ", endpoint, " is node '", hello.node_name(), "', not '", target.node_name, "'"));
  }
  // Said by the node itself (its certificate names it): routes may go
  // through it to the nodes it is cabled to.
  rooms_.heard(target.node_name, hello);
  p.set_paths(paths, PeerLinkInfo(hello));
  // A peer kept for TCP links (PeerFor) gets those, whatever the node's transport.
  LinkMaker* maker = p.tcp() ? tcp_ : links_;
  return maker->Connect(peer, target, paths, std::move(stub), hello, verbs_failed);
}

absl::Status Connector::NoPeer() const {
  if (stopping()) return StoppingStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("this podlinkd talks to too many other nodes already (", PeerTable::kMaxPeers, ")"));
}

absl::Status Connector::NotQueued(const std::string& node) const { return NotQueuedStatus(stopping(), node); }

std::vector<pb::LinkInfo> PeerLinkInfo(const pb::HelloResponse& hello) {
  std::vector<pb::LinkInfo> out;
  for (const pb::LinkInfo& l : hello.links()) {
    if (out.size() == 64) break;
    pb::LinkInfo c = l;
    for (std::string* f : {c.mutable_address(), c.mutable_netdev(), c.mutable_pci_path(), c.mutable_rdma_device(),
                           c.mutable_gid_type()}) {
      if (f->size() > 256) f->resize(256);
      for (char& ch : *f) {
        if (ch < 0x20 || ch == 0x7f) ch = '?';
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

void Connector::KeepAlive(absl::Duration every, const pb::HelloRequest& hello) {
  std::set<std::shared_ptr<Peer>> peers;
  {
    absl::MutexLock l(&keepalive_mu_);
    if (absl::Now() - last_keepalive_ < every) return;
    last_keepalive_ = absl::Now();
  }
  for (auto& p : rooms_.in_use()) peers.insert(std::move(p));
  // Asynchronous calls on the peers' channels: never queued behind a peer
  // worker's long task, never blocking this thread.
  struct Call {
    std::shared_ptr<pb::Mesh::Stub> stub;
    grpc::ClientContext ctx;
    pb::HelloRequest req;
    pb::HelloResponse resp;
  };
  for (const std::shared_ptr<Peer>& p : peers) {
    std::shared_ptr<pb::Mesh::Stub> stub = p->stub();
    if (stub == nullptr) continue;
    auto call = std::make_shared<Call>();
    call->stub = stub;
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
    call->req = hello;
    Call* c = call.get();
    stub->async()->Hello(&c->ctx, &c->req, &c->resp, [call](grpc::Status) mutable { call.reset(); });
  }
}

}  // namespace podlink::mesh
