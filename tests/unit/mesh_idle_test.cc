// The owner's sweep of idle importers (MeshEngine::SweepIdleImporters) on an
// engine without listeners: a node's grants go only after it has been silent
// for the whole limit, counting the grant itself as a sign of life.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/gpu/host_backend.h"
#include "daemon/mesh/mesh_engine.h"

namespace podlink::mesh {
namespace {

namespace pb = podlink::mesh::v1;

std::shared_ptr<const ExportRecord> MemfdExport(uint64_t id, uint64_t size) {
  UniqueFd fd(::memfd_create("mesh-idle", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)), 0);  // backed, as the daemon demands
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  auto m = HostMemfdBackend().Adopt({size, "", HandleKind::kHostMemfd}, std::move(fd), "");
  EXPECT_TRUE(m.ok()) << m.status();
  ExportRecord rec;
  rec.id = id;
  rec.size = size;
  rec.kind = HandleKind::kHostMemfd;
  rec.memory = *std::move(m);
  return std::make_shared<const ExportRecord>(std::move(rec));
}

class OneExportHost final : public MeshHost {
 public:
  OneExportHost() : rec_(MemfdExport(7, 4096)) {}
  absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(const PodInfo&,
                                                                      const pb::OpenRegionRequest&) override {
    return rec_;
  }
  bool ExportLive(const ExportRecord&) const override { return true; }
  absl::Status NotifyOwner(const ExportRecord&, uint64_t) override { return absl::OkStatus(); }

 private:
  std::shared_ptr<const ExportRecord> rec_;
};

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

}  // namespace
}  // namespace podlink::mesh
