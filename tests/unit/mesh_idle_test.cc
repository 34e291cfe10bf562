// The owner's sweep of idle importers (MeshEngine::SweepIdleImporters) on an
// engine without listeners: a node's grants go only after it has been silent
// for the whole limit, counting the grant itself as a sign of life.

#include <chrono>
#include <memory>
#include <string>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/mesh/mesh_engine.h"
#include "tests/common/mesh_exports.h"

namespace podlink::mesh {
namespace {

namespace pb = podlink::mesh::v1;

using testing::OneExportHost;

pb::OpenRegionRequest RequestOf(const std::string& node) {
  pb::OpenRegionRequest req;
  pb::ForwardedIdentity* who = req.mutable_importer();
  who->set_node(node);
  who->set_key("pod-uid-1");
  who->set_namespace_("ml");
  who->set_pod_name("decode-0");
  req.set_export_id(7);
  return req;
}

absl::StatusOr<pb::OpenRegionResponse> Open(MeshEngine& e, const std::string& node) {
  absl::StatusOr<pb::OpenRegionResponse> out = absl::UnknownError("not answered");
  e.OpenRegionFor(node, RequestOf(node), [&](absl::StatusOr<pb::OpenRegionResponse> r) { out = std::move(r); });
  return out;
}

MeshOptions IdleAfter(absl::Duration d) {
  MeshOptions o;
  o.grant_idle_timeout = d;
  return o;
}

TEST(MeshIdle, AGrantGivenAfterALongSilenceIsNotDroppedAtOnce) {
  OneExportHost host;
  auto e = MeshEngine::ForTesting(IdleAfter(absl::Milliseconds(300)), "owner", &host);
  // The importer has never called before (as after minutes without regions,
  // when it sent no keepalives): the grant it is given now counts as contact.
  ASSERT_TRUE(Open(*e, "importer").ok());
  e->SweepIdleImportersForTesting();
  EXPECT_EQ(e->Status().grants(), 1u) << "dropped the moment it was given";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  e->SweepIdleImportersForTesting();
  EXPECT_EQ(e->Status().grants(), 0u) << "kept past the idle limit with no sign of life";
  EXPECT_NE(e->RenderMetrics().find("podlink_mesh_idle_peer_grants_dropped_total 1"), std::string::npos)
      << e->RenderMetrics();
}

TEST(MeshIdle, EveryGrantRenewsItsNode) {
  OneExportHost host;
  auto e = MeshEngine::ForTesting(IdleAfter(absl::Milliseconds(300)), "owner", &host);
  ASSERT_TRUE(Open(*e, "importer").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(Open(*e, "importer").ok());  // the older grant is 200 ms old, the node 0 ms silent
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  e->SweepIdleImportersForTesting();
  EXPECT_EQ(e->Status().grants(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  e->SweepIdleImportersForTesting();
  EXPECT_EQ(e->Status().grants(), 0u) << "the node's grants go together";
}

TEST(MeshIdle, OnlyTheSilentNodeLosesItsGrants) {
  OneExportHost host;
  auto e = MeshEngine::ForTesting(IdleAfter(absl::Milliseconds(300)), "owner", &host);
  ASSERT_TRUE(Open(*e, "quiet").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(Open(*e, "busy").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  e->SweepIdleImportersForTesting();
  EXPECT_EQ(e->Status().grants(), 1u);
  const std::string metrics = e->RenderMetrics();
  EXPECT_NE(metrics.find("podlink_mesh_idle_peer_grants_dropped_total 1"), std::string::npos) << metrics;
}

// The owner itself did not run (its host starved it, or it was stopped) for longer than the idle limit: what its
// importers sent meanwhile is still unread, so the pause is not their silence. Silence after it still counts.
TEST(MeshIdle, TheOwnersOwnPauseIsNoImportersSilence) {
  OneExportHost host;
  auto e = MeshEngine::ForTesting(IdleAfter(absl::Milliseconds(300)), "owner", &host);
  ASSERT_TRUE(Open(*e, "importer").ok());
  e->SweepIdleImportersForTesting();
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // no sweep ran: the owner was paused
  e->SweepIdleImportersForTesting();
  EXPECT_EQ(e->Status().grants(), 1u) << "the owner's own pause was taken for the importer's silence";
  EXPECT_NE(e->RenderMetrics().find("podlink_mesh_own_pauses_total 1"), std::string::npos) << e->RenderMetrics();
  // Running again, sweeping at its period: the importer stays silent and loses its grant after the limit.
  const auto resumed = std::chrono::steady_clock::now();
  while (e->Status().grants() != 0 && std::chrono::steady_clock::now() - resumed < std::chrono::seconds(2)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    e->SweepIdleImportersForTesting();
  }
  EXPECT_EQ(e->Status().grants(), 0u) << "an importer silent after the pause kept its grant";
  EXPECT_GE(std::chrono::steady_clock::now() - resumed, std::chrono::milliseconds(100));
}

// With the API server (MeshHost::TracksRemotePods), a grant goes once its
// importing pod is gone; other pods' grants stay.
class PodsHost final : public MeshHost {
 public:
  absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(
      const PodInfo&, const pb::OpenRegionRequest&) override {
    return rec_;
  }
  bool ExportLive(const ExportRecord&) const override { return true; }
  absl::Status NotifyOwner(const ExportRecord&, uint64_t) override { return absl::OkStatus(); }
  bool TracksRemotePods() const override { return true; }
  bool RemotePodGone(const std::string& uid) const override { return gone.contains(uid); }
  std::set<std::string> gone;

 private:
  std::shared_ptr<const ExportRecord> rec_ = testing::MemfdExport(7, 4096);
};

absl::StatusOr<pb::OpenRegionResponse> OpenFor(MeshEngine& e, const std::string& node, const std::string& uid) {
  pb::OpenRegionRequest req = RequestOf(node);
  req.mutable_importer()->set_key(uid);
  req.mutable_importer()->set_pod_uid(uid);
  absl::StatusOr<pb::OpenRegionResponse> out = absl::UnknownError("not answered");
  e.OpenRegionFor(node, req, [&](absl::StatusOr<pb::OpenRegionResponse> r) { out = std::move(r); });
  return out;
}

TEST(MeshGonePods, AGrantGoesWithItsImportingPod) {
  PodsHost host;
  auto e = MeshEngine::ForTesting(MeshOptions{}, "owner", &host);
  ASSERT_TRUE(OpenFor(*e, "node-a", "uid-1").ok());
  ASSERT_TRUE(OpenFor(*e, "node-a", "uid-1").ok());
  ASSERT_TRUE(OpenFor(*e, "node-a", "uid-2").ok());
  e->DropGrantsOfGonePodsForTesting();
  EXPECT_EQ(e->Status().grants(), 3u);
  host.gone.insert("uid-1");  // deleted in the API server
  e->DropGrantsOfGonePodsForTesting();
  EXPECT_EQ(e->Status().grants(), 1u) << "uid-1's two grants should have gone, uid-2's stayed";
  EXPECT_NE(e->RenderMetrics().find("podlink_mesh_gone_pod_grants_dropped_total 2"), std::string::npos)
      << e->RenderMetrics();
}

}  // namespace
}  // namespace podlink::mesh
