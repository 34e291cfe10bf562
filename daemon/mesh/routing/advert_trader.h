// The routing room's trade of node adverts (mesh.proto NodeAdvert): this
// node's own advert signed again every interval with its key, the adverts
// other nodes send checked against the mesh CA and their nodes learnt, an
// asynchronous Hello with every known node this one is cabled to each
// interval, and what makes a cable between two other nodes believable
// (CableTrust). The book of adverts is advert_book.h; the endpoints learnt go
// to KnownNodes. Its lock guards the stubs and the Hellos in flight, a leaf;
// the book's, the known nodes' and the credentials' are their own.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/mesh/control/credentials.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/routing/advert_book.h"
#include "daemon/mesh/routing/known_nodes.h"
#include "daemon/mesh/routing/routes.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"

namespace grpc {
class ClientContext;
}

namespace podlink::mesh {

class AdvertTrader {
 public:
  struct Options {
    std::string node_name;                                    // this node's
    absl::Duration interval = absl::Seconds(60);              // mesh.advert_interval
    absl::Duration connect_timeout = absl::Seconds(5);        // a trade's Hello
    std::map<std::string, std::vector<IpPrefix>> configured;  // mesh.peers: the operator's word, by node
  };
  struct Rooms {
    std::function<std::vector<IpPrefix>()> local;  // this node's addresses for choosing paths
    // A control channel to `node` at `endpoint`, its certificate checked to name it.
    std::function<std::shared_ptr<podlink::mesh::v1::Mesh::Stub>(const std::string& node, const std::string& endpoint)>
        new_stub;
    std::function<podlink::mesh::v1::HelloRequest()> hello;  // the Hello this node says (its adverts included)
  };
  // `credentials` and `known` outlive this.
  AdvertTrader(Options options, Rooms rooms, const NodeCredentials* credentials, KnownNodes* known)
      : options_(std::move(options)),
        rooms_(std::move(rooms)),
        credentials_(*credentials),
        known_(*known),
        book_(options_.node_name, options_.interval) {}
  ~AdvertTrader();  // Stop()s

  // `node` (its certificate checked) talked to this one from, or was reached
  // at, `address`: a neighbour when that lies on one of this node's subnets
  // (its next advert says so).
  void SawNeighbour(const std::string& node, const std::string& address);
  // What makes a cable between two other nodes in a route (routes.h).
  CableTrust Trust() const;
  // This node's own advert, signed again when due: its `addresses` and
  // control `port` as they are now.
  void RefreshOwn(const std::vector<std::string>& addresses, uint32_t port);
  // Keeps the adverts `from` sent that are new, fresh and verified against the
  // mesh CA, and learns their nodes; at most one batch per peer a second.
  void Accept(const std::string& from,
              const google::protobuf::RepeatedPtrField<podlink::mesh::v1::NodeAdvert>& adverts);
  // What a Hello carries: this node's advert first, then the freshest others.
  void AddTo(google::protobuf::RepeatedPtrField<podlink::mesh::v1::NodeAdvert>* out) const { book_.AddTo(out); }
  // When due: an asynchronous Hello, adverts both ways, with each known node
  // this one is cabled to.
  void Trade() ABSL_LOCKS_EXCLUDED(mu_);
  // No trade starts from now on; those in flight are cancelled and waited for.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  const AdvertBook& book() const { return book_; }

 private:
  struct Call;

  const Options options_;
  const Rooms rooms_;
  const NodeCredentials& credentials_;
  KnownNodes& known_;
  AdvertBook book_;  // its own lock, a leaf
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // One channel per known node cabled to this one (KnownNodes is bounded, so is this).
  std::map<std::string, std::shared_ptr<podlink::mesh::v1::Mesh::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);  // trades' Hellos in flight
};

}  // namespace podlink::mesh
