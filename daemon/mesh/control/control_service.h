// The mesh's control service (the control room's): the Mesh gRPC service
// other nodes' daemons call over mutual TLS. Each call is authenticated by its
// TLS peer (the verified certificate names exactly one node) and handed to
// the room it is for: Hello to the routing room and the owner (a restarted
// importer's grants dropped), OpenLink to the TCP data server's gate,
// OpenRegion, FenceRoute and CloseRegion to the owner, OpenVerbs to the verbs
// side. A peer's call in flight keeps it alive (Liveness). No lock of its own.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/mesh/control/liveness.h"
#include "daemon/mesh/owner/region_owner.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/routing/advert_trader.h"
#include "daemon/mesh/tcp/admission.h"
#include "daemon/mesh/verbs/verbs_node.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"

namespace podlink::mesh {

class ControlService final : public podlink::mesh::v1::Mesh::CallbackService {
 public:
  struct Options {
    std::string node_name;             // this node's (its own calls are not a peer's)
    uint64_t instance = 0;             // this daemon's
    uint32_t data_port = 0;            // the TCP data server's
    std::vector<IpPrefix> advertised;  // this node's addresses (the verbs side's paths)
  };
  struct Rooms {
    RegionOwner* owner = nullptr;
    DataAdmission* admission = nullptr;
    verbs::VerbsNode* verbs = nullptr;
    Liveness* liveness = nullptr;
    AdvertTrader* adverts = nullptr;
    // What a Hello answer says of this node besides its name, instance and
    // adverts: its addresses, control port and links as they are now.
    std::function<void(podlink::mesh::v1::HelloResponse*)> describe;
  };
  // Every room outlives this.
  ControlService(Options options, Rooms rooms) : options_(std::move(options)), rooms_(std::move(rooms)) {}

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* ctx, const podlink::mesh::v1::HelloRequest* req,
                                  podlink::mesh::v1::HelloResponse* resp) override;
  grpc::ServerUnaryReactor* OpenLink(grpc::CallbackServerContext* ctx, const podlink::mesh::v1::OpenLinkRequest* req,
                                     podlink::mesh::v1::OpenLinkResponse* resp) override;
  grpc::ServerUnaryReactor* OpenRegion(grpc::CallbackServerContext* ctx,
                                       const podlink::mesh::v1::OpenRegionRequest* req,
                                       podlink::mesh::v1::OpenRegionResponse* resp) override;
  grpc::ServerUnaryReactor* OpenVerbs(grpc::CallbackServerContext* ctx, const podlink::mesh::v1::OpenVerbsRequest* req,
                                      podlink::mesh::v1::OpenVerbsResponse* resp) override;
  grpc::ServerUnaryReactor* FenceRoute(grpc::CallbackServerContext* ctx,
                                       const podlink::mesh::v1::FenceRouteRequest* req,
                                       podlink::mesh::v1::FenceRouteResponse* resp) override;
  grpc::ServerUnaryReactor* CloseRegion(grpc::CallbackServerContext* ctx,
                                        const podlink::mesh::v1::CloseRegionRequest* req,
                                        podlink::mesh::v1::CloseRegionResponse* resp) override;

 private:
  // The peer's node name: the identity of its verified certificate.
  static absl::StatusOr<std::string> PeerNode(grpc::CallbackServerContext* ctx);
  // Runs `f` with the calling node's name, the peer kept alive meanwhile, and finishes the call with its status.
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx,
                                const std::function<absl::Status(const std::string& node)>& f);

  const Options options_;
  const Rooms rooms_;
};

}  // namespace podlink::mesh
