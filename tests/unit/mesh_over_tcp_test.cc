// The owner's answer to an importer that asks for RDMA access to an export
// this node cannot register (MeshEngine::RegisterForVerbs): the grant is
// given over TCP, with the reason, instead of refused. Here the engine has no
// RDMA device or queue pairs for the importer at all (the registration fails
// as it does for a GPU export the NICs cannot reach by dma-buf, or memory the
// daemon may not pin); the whole path, importer included, runs on soft-RoCE in
// tests/vm/mesh_verbs.sh.

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "daemon/gpu/host_backend.h"
#include "daemon/mesh/mesh_engine.h"

namespace podlink::mesh {
namespace {

namespace pb = podlink::mesh::v1;

std::shared_ptr<const ExportRecord> MemfdExport(uint64_t id, uint64_t size, bool punch_hole) {
  UniqueFd fd(::memfd_create("mesh-over-tcp", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)), 0);  // backed, as the daemon demands
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  UniqueFd owner_side(::dup(fd.get()));  // what the exporting pod keeps
  auto m = HostMemfdBackend().Adopt({size, "", HandleKind::kHostMemfd}, std::move(fd), "");
  EXPECT_TRUE(m.ok()) << m.status();
  if (punch_hole) {
    // The owner gives pages back after podlinkd mapped its export (before,
    // the mapping itself is refused, over any transport).
    EXPECT_TRUE((*m)->MapForRelay().ok());
    EXPECT_EQ(::fallocate(owner_side.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 8192), 0);
  }
  ExportRecord rec;
  rec.id = id;
  rec.size = size;
  rec.kind = HandleKind::kHostMemfd;
  rec.memory = *std::move(m);
  return std::make_shared<const ExportRecord>(std::move(rec));
}

class OneExportHost final : public MeshHost {
 public:
  explicit OneExportHost(std::shared_ptr<const ExportRecord> rec) : rec_(std::move(rec)) {}
  absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(const PodInfo&,
                                                                      const pb::OpenRegionRequest&) override {
    return rec_;
  }
  bool ExportLive(const ExportRecord&) const override { return true; }
  absl::Status NotifyOwner(const ExportRecord&, uint64_t) override { return absl::OkStatus(); }

 private:
  std::shared_ptr<const ExportRecord> rec_;
};

absl::StatusOr<pb::OpenRegionResponse> OpenOverVerbs(MeshEngine& e, const std::string& node,
                                                     bool accepts_over_tcp = true) {
  pb::OpenRegionRequest req;
  pb::ForwardedIdentity* who = req.mutable_importer();
  who->set_node(node);
  who->set_key("pod-uid-1");
  who->set_namespace_("ml");
  who->set_pod_name("decode-0");
  req.set_export_id(7);
  req.set_verbs(true);
  req.set_accepts_over_tcp(accepts_over_tcp);
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

}  // namespace
}  // namespace podlink::mesh
