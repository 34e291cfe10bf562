// The control room's connector: the peer for a node (PeerTable), its Hello
// and links (the configured transport's LinkMaker), the fallback to TCP links
// where no RDMA path comes up, and a grant bound to the links that carry it.
// Everything that dials another node runs on that node's peer's worker; this
// class holds no lock of its own (the peer table's and each peer's are its
// rooms' own).
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
#include "daemon/mesh/control/link_maker.h"
#include "daemon/mesh/control/peer.h"
#include "daemon/mesh/control/peer_table.h"
#include "daemon/mesh/links/log_limit.h"
#include "daemon/mesh/routing/addresses.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"

namespace podlink::mesh {

class Connector {
 public:
  struct Options {
    bool fallback = false;           // mesh.fallback: no direct subnet, the kernel routes to the first address
    bool verbs_tcp_fallback = true;  // mesh.verbs_tcp_fallback
    absl::Duration connect_timeout = absl::Seconds(5);
  };
  // What the connector asks the rooms around it (the engine sets them; each
  // may be called on any peer's worker, with no lock held).
  struct Rooms {
    // This node's addresses for choosing paths (addresses.h).
    std::function<std::vector<IpPrefix>()> local;
    // A control channel to `node` at `endpoint`, its certificate checked to name it.
    std::function<std::shared_ptr<pb::Mesh::Stub>(const std::string& node, const std::string& endpoint)> new_stub;
    // The Hello this node says (its version, instance and adverts).
    std::function<pb::HelloRequest()> hello;
    // `node` answered `hello`, its certificate naming it (the routing room learns its addresses and adverts).
    std::function<void(const std::string& node, const pb::HelloResponse& hello)> heard;
    // The peers that back what this node holds (PeerTable::InUse).
    PeerTable::InUse in_use;
  };
  // `peers`, `stopping` and both link makers outlive this. `links` is the
  // configured transport's; `tcp` makes TCP links (the same object when the
  // transport is TCP).
  Connector(Options options, Rooms rooms, PeerTable* peers, const std::atomic<bool>* stopping, LinkMaker* links,
            LinkMaker* tcp)
      : options_(options), rooms_(std::move(rooms)), peers_(peers), stopping_(stopping), links_(links), tcp_(tcp) {}

  // The configured transport (what it can do; the connector never asks its name).
  const LinkMaker& transport() const { return *links_; }

  // `target`'s peer (`tcp`: the one kept for TCP links, which is the node's
  // own peer when the transport's links carry relayed grants); nullptr when
  // stopping or the table is full of peers in use (NoPeer says which).
  std::shared_ptr<Peer> PeerFor(const RemoteTarget& target, bool tcp = false);
  absl::Status NoPeer() const;
  // Why a task for `node` could not be queued on its peer's worker.
  absl::Status NotQueued(const std::string& node) const;

  // On `peer`'s worker: Hello (the answer must name target.node_name), then
  // the links over the direct paths to the node's addresses; at once when
  // the peer has live links. `verbs_failed`: set when the node answered but
  // no RDMA path to it came up.
  absl::Status Connect(const std::shared_ptr<Peer>& peer, const RemoteTarget& target, bool* verbs_failed = nullptr);
  // On `peer`'s worker: connects it and calls `then` with it; where no RDMA
  // path to the node came up (now or within the last 30 s) and
  // mesh.verbs_tcp_fallback, with the node's TCP peer instead (OverTcp,
  // said and counted). `failed` gets why not.
  void ConnectOrOverTcp(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                        std::function<void(const std::shared_ptr<Peer>&)> then,
                        std::function<void(absl::Status)> failed);
  // The node's TCP peer, connected on its own worker; `next` gets it or why not.
  void OverTcp(const RemoteTarget& target, std::function<void(absl::StatusOr<std::shared_ptr<Peer>>)> next);
  // Binds a grant `peer`'s node answered (`resp`) to the peer whose links
  // carry it: its RDMA keys or staging on `peer`'s links, or (over_tcp_reason)
  // the node's TCP peer; `failed` (the grant given back) when that cannot
  // connect.
  void CarryGrant(const std::shared_ptr<Peer>& peer, const RemoteTarget& target, const pb::OpenRegionResponse& resp,
                  std::function<void(const std::shared_ptr<Peer>&)> install, std::function<void(absl::Status)> failed);

  // Every `every` (called more often, it does nothing): `hello` to each peer
  // that backs what this node holds (Rooms::in_use: its pods' handles, a
  // relay's onward grants), asynchronously on the peers' channels: never
  // queued behind a peer worker's long task, never blocking the caller.
  void KeepAlive(absl::Duration every, const pb::HelloRequest& hello) ABSL_LOCKS_EXCLUDED(keepalive_mu_);

  // Opens that went over TCP because no RDMA path to the node came up.
  uint64_t verbs_fallbacks() const { return verbs_fallbacks_.load(std::memory_order_relaxed); }

 private:
  bool stopping() const { return stopping_->load(std::memory_order_acquire); }

  const Options options_;
  const Rooms rooms_;
  PeerTable* const peers_;
  const std::atomic<bool>* const stopping_;
  LinkMaker* const links_;
  LinkMaker* const tcp_;
  std::atomic<uint64_t> verbs_fallbacks_{0};
  LogLimit fallback_log_;     // the fallback said at most every 10 s
  absl::Mutex keepalive_mu_;  // a leaf
  absl::Time last_keepalive_ ABSL_GUARDED_BY(keepalive_mu_) = absl::Now();
};

// What a peer daemon says of its NICs, kept for operators: at most 64
// entries, strings cut to 256 bytes, control characters replaced.
std::vector<pb::LinkInfo> PeerLinkInfo(const pb::HelloResponse& hello);

}  // namespace podlink::mesh
