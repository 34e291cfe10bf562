// The verbs transport's LinkMaker (control/link_maker.h): a peer's RC queue
// pairs path by path, accepted by the peer's OpenVerbs (VerbsNode::Connect);
// a path whose queue pairs all failed gets new ones, the failed ones named to
// the peer once (VerbsNode::ConnectPath).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/mesh/control/link_maker.h"
#include "daemon/mesh/verbs/verbs_node.h"

namespace podlink::mesh::verbs {

class VerbsLinkMaker final : public LinkMaker {
 public:
  // `node` and `repairs` outlive this. An OpenVerbs call may take
  // `connect_timeout` and 25 s more: the owner may open its device and make
  // queue pairs first (seconds on emulated soft-RoCE).
  VerbsLinkMaker(absl::Duration connect_timeout, VerbsNode* node, Repairs* repairs)
      : connect_timeout_(connect_timeout), node_(node), repairs_(repairs) {}

  absl::Status Connect(const std::shared_ptr<Peer>& peer, const RemoteTarget& target, const std::vector<Path>& paths,
                       std::shared_ptr<pb::Mesh::Stub> stub, const pb::HelloResponse& hello,
                       bool* verbs_failed) override;
  // A relay's grant has no memory of the relay's for RDMA to land in: the
  // hop to a relay is the node's TCP peer (or the relay stages it).
  bool carries_relayed_grants() const override { return false; }
  bool stripes_two_hop() const override { return false; }

 private:
  // The peer's OpenVerbs over `stub`, said as coming from `node`.
  VerbsNode::OpenVerbsCall OpenVerbsOver(pb::Mesh::Stub& stub, const std::string& node) const;
  std::function<void(const std::string&)> RepairOnDown(const std::shared_ptr<Peer>& peer,
                                                       const std::shared_ptr<VerbsLinks>& links,
                                                       const std::vector<Path>& paths);

  const absl::Duration connect_timeout_;
  VerbsNode* const node_;
  Repairs* const repairs_;
};

}  // namespace podlink::mesh::verbs
