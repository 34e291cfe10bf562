// The owner's answer to an importer that asks for RDMA access to an export
// this node cannot register (verbs::VerbsNode::Register): the grant is
// given over TCP, with the reason, instead of refused. Here the engine has no
// RDMA device or queue pairs for the importer at all (the registration fails
// as it does for a GPU export the NICs cannot reach by dma-buf, or memory the
// daemon may not pin); the whole path, importer included, runs on soft-RoCE in
// tests/vm/mesh_verbs.sh.

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "daemon/mesh/mesh_engine.h"
#include "tests/common/mesh_exports.h"

namespace podlink::mesh {
namespace {

namespace pb = podlink::mesh::v1;

using testing::MemfdExport;
using testing::OneExportHost;

absl::StatusOr<pb::OpenRegionResponse> OpenOverVerbs(MeshEngine& e, const std::string& node,
                                                     bool accepts_over_tcp = true, bool accepts_staged = false) {
  pb::OpenRegionRequest req;
  pb::ForwardedIdentity* who = req.mutable_importer();
  who->set_node(node);
  who->set_key("pod-uid-1");
  who->set_namespace_("ml");
  who->set_pod_name("decode-0");
  req.set_export_id(7);
  req.set_verbs(true);
  req.set_accepts_over_tcp(accepts_over_tcp);
  req.set_accepts_staged(accepts_staged);
  absl::StatusOr<pb::OpenRegionResponse> out = absl::UnknownError("not answered");
  e.OpenRegionFor(node, req, [&](absl::StatusOr<pb::OpenRegionResponse> r) { out = std::move(r); });
  return out;
}

MeshOptions Verbs() {
  MeshOptions o;
  o.transport = "verbs";
  return o;
}

TEST(MeshOverTcp, AnExportRdmaCannotReachIsGrantedOverTcpWithTheReason) {
  OneExportHost host(MemfdExport(7, 1 << 20, /*punch_hole=*/false));
  auto e = MeshEngine::ForTesting(Verbs(), "owner", &host);
  absl::StatusOr<pb::OpenRegionResponse> r = OpenOverVerbs(*e, "importer");
  ASSERT_TRUE(r.ok()) << "refused instead of carried over TCP: " << r.status();
  EXPECT_FALSE(r->over_tcp_reason().empty());
  EXPECT_EQ(r->verbs_keys_size(), 0) << "keys for a registration that failed";
  EXPECT_NE(r->grant(), 0u);
  EXPECT_EQ(e->Status().grants(), 1u) << "the grant must live on for the TCP links";
  const std::string metrics = e->RenderMetrics();
  EXPECT_NE(metrics.find("podlink_mesh_grants_over_tcp_total 1"), std::string::npos) << metrics;
}

TEST(MeshOverTcp, AnExportWithHolesIsNotPinnedButGrantedOverTcp) {
  // Pages punched out after podlinkd mapped the export: registering would
  // fault them in at podlinkd's expense; over TCP each frame's range is
  // checked instead.
  OneExportHost host(MemfdExport(7, 1 << 20, /*punch_hole=*/true));
  auto e = MeshEngine::ForTesting(Verbs(), "owner", &host);
  absl::StatusOr<pb::OpenRegionResponse> r = OpenOverVerbs(*e, "importer");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->over_tcp_reason().find("not fully allocated"), std::string::npos) << r->over_tcp_reason();
  EXPECT_EQ(r->verbs_keys_size(), 0);
}

TEST(MeshOverTcp, AnOlderImporterIsRefusedAsBefore) {
  // It would take a grant without keys for usable and fail every transfer.
  OneExportHost host(MemfdExport(7, 1 << 20, /*punch_hole=*/false));
  auto e = MeshEngine::ForTesting(Verbs(), "owner", &host);
  absl::StatusOr<pb::OpenRegionResponse> r = OpenOverVerbs(*e, "importer", /*accepts_over_tcp=*/false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_EQ(e->Status().grants(), 0u) << "a refused open left its grant behind";
  EXPECT_NE(e->RenderMetrics().find("podlink_mesh_grants_over_tcp_total 0"), std::string::npos);
}

TEST(MeshOverTcp, AnImporterThatTakesStagedGrantsButCannotBeStagedForGoesOverTcpWithBothReasons) {
  // Staging needs the importer's queue pairs here (their mailboxes carry
  // the records) and a bounce pool for them; with neither, over TCP, saying
  // why both failed. With mesh.verbs_staged_only the first reason is that.
  for (bool staged_only : {false, true}) {
    OneExportHost host(MemfdExport(7, 1 << 20, /*punch_hole=*/false));
    MeshOptions o = Verbs();
    o.verbs_staged_only = staged_only;
    auto e = MeshEngine::ForTesting(o, "owner", &host);
    absl::StatusOr<pb::OpenRegionResponse> r = OpenOverVerbs(*e, "importer", true, /*accepts_staged=*/true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->staged_reason().empty()) << r->staged_reason();
    EXPECT_NE(r->over_tcp_reason().find("no staging over RDMA either"), std::string::npos) << r->over_tcp_reason();
    if (staged_only) {
      EXPECT_EQ(r->over_tcp_reason().find("mesh.verbs_staged_only"), 0u) << r->over_tcp_reason();
    }
    const std::string metrics = e->RenderMetrics();
    EXPECT_NE(metrics.find("podlink_mesh_grants_staged_total 0"), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("podlink_mesh_grants_over_tcp_total 1"), std::string::npos) << metrics;
  }
}

}  // namespace
}  // namespace podlink::mesh
