// This node's verbs side (daemon/mesh/verbs/verbs_node.h) without an engine, a peer or an RDMA device: what a
// peer's OpenVerbs may ask for is checked before any device is touched, and an export RDMA may not reach is granted
// over TCP with the reason (or refused to an importer that cannot take that), counted. Whether libibverbs loads
// here or not, the answers are the same: every case below is decided before the library is asked.
#include "daemon/mesh/verbs/verbs_node.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/common/memfd_export.h"

namespace podlink::mesh::verbs {
namespace {

namespace pb = podlink::mesh::v1;

constexpr uint64_t kSize = 1 << 20;

VerbsNode MakeNode(bool staged_only) {
  VerbsNode::Options o;
  o.node_name = "self";
  o.staged_only = staged_only;
  return VerbsNode(o, VerbsNode::Sinks{});
}

std::vector<IpPrefix> Advertised() {
  absl::StatusOr<IpPrefix> p = IpPrefix::Parse("10.7.0.1/24");
  EXPECT_TRUE(p.ok());
  return {*p};
}

pb::OpenVerbsRequest GoodRequest() {
  pb::OpenVerbsRequest req;
  req.set_address("10.7.0.1/24");
  req.set_gid(std::string(16, '\1'));
  req.set_device("mlx5_0");
  for (int i = 0; i < 2; ++i) {
    pb::VerbsQp* q = req.add_qps();
    q->set_qpn(100 + i);
    q->set_psn(7);
  }
  return req;
}

TEST(VerbsNode, RefusesWhatAPeersQueuePairsMayNotAskFor) {
  VerbsNode n = MakeNode(false);
  const std::vector<IpPrefix> mine = Advertised();
  EXPECT_EQ(n.Accept("self", GoodRequest(), mine).status().code(), absl::StatusCode::kPermissionDenied);
  pb::OpenVerbsRequest r = GoodRequest();
  r.set_address("10.7.0.9/24");  // not this node's
  absl::StatusOr<pb::OpenVerbsResponse> out = n.Accept("peer", r, mine);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(out.status().message(), "not an address this node advertises")) << out.status();
  r = GoodRequest();
  r.set_address("not an address");
  EXPECT_FALSE(n.Accept("peer", r, mine).ok());
  r = GoodRequest();
  r.set_gid(std::string(15, '\1'));
  EXPECT_EQ(n.Accept("peer", r, mine).status().code(), absl::StatusCode::kInvalidArgument);
  r = GoodRequest();
  r.clear_qps();
  EXPECT_EQ(n.Accept("peer", r, mine).status().code(), absl::StatusCode::kInvalidArgument);
  r = GoodRequest();
  for (int i = 0; i < 15; ++i) r.add_qps()->set_qpn(200 + i);  // 17 in all
  EXPECT_EQ(n.Accept("peer", r, mine).status().code(), absl::StatusCode::kInvalidArgument);
  r = GoodRequest();
  for (int i = 0; i < 65; ++i) r.add_replaces(i);
  EXPECT_EQ(n.Accept("peer", r, mine).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(n.server_counts().serving);  // none of these made a server
}

TEST(VerbsNode, AnExportRdmaMayNotReachGoesOverTcpWithTheReasonOrIsRefused) {
  std::unique_ptr<podlink::testing::MemfdExport> e = podlink::testing::MakeMemfdExport(1, kSize, 0);
  VerbsNode staged_only = MakeNode(true);
  pb::OpenRegionResponse resp;
  ASSERT_TRUE(staged_only.Register("peer", 9, e->record, /*over_tcp_ok=*/true, /*staged_ok=*/false,
                                   /*may_register=*/true, &resp)
                  .ok());
  EXPECT_EQ(resp.verbs_keys_size(), 0);
  EXPECT_TRUE(absl::StrContains(resp.over_tcp_reason(), "mesh.verbs_staged_only")) << resp.over_tcp_reason();
  EXPECT_EQ(staged_only.grants_over_tcp(), 1u);
  // An importer that cannot carry the grant over TCP (an older daemon) is refused, as before.
  pb::OpenRegionResponse old;
  absl::Status st = staged_only.Register("peer", 10, e->record, /*over_tcp_ok=*/false, false, true, &old);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;

  // A sealed route's export is never registered for the relay.
  VerbsNode n = MakeNode(false);
  pb::OpenRegionResponse sealed;
  ASSERT_TRUE(n.Register("relay", 11, e->record, true, false, /*may_register=*/false, &sealed).ok());
  EXPECT_TRUE(absl::StrContains(sealed.over_tcp_reason(), "never registered for the relay"))
      << sealed.over_tcp_reason();
  // Pages the owner punched out are not pinned (registration would fault them in at podlinkd's expense).
  ASSERT_EQ(::fallocate(e->fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
  pb::OpenRegionResponse punched;
  ASSERT_TRUE(n.Register("peer", 12, e->record, true, false, true, &punched).ok());
  EXPECT_FALSE(punched.over_tcp_reason().empty());
  EXPECT_EQ(punched.verbs_keys_size(), 0);
  EXPECT_EQ(n.grants_over_tcp(), 2u);
  EXPECT_EQ(n.grants_staged(), 0u);
}

TEST(VerbsNode, NoServerIsMadeOnceStopping) {
  VerbsNode n = MakeNode(false);
  n.BeginStop();
  absl::StatusOr<VerbsServer*> s = n.Serving();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_EQ(n.PrepareStaging("peer").status().code(), absl::StatusCode::kUnavailable);
  n.Stop();
  EXPECT_FALSE(n.server_counts().serving);
}

}  // namespace
}  // namespace podlink::mesh::verbs
