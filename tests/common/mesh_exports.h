// Exports for tests of the mesh engine's owner side (MeshEngine::ForTesting):
// a populated, sealed host memfd as the broker would hold it, and a MeshHost
// that authorizes every request for it.
#pragma once

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <utility>

#include <gtest/gtest.h>

#include "daemon/gpu/host_backend.h"
#include "daemon/mesh/mesh_engine.h"

namespace podlink::mesh::testing {

// `punch_hole`: the exporting pod gives two pages back after podlinkd mapped
// the export (before, the mapping itself is refused).
inline std::shared_ptr<const ExportRecord> MemfdExport(uint64_t id, uint64_t size, bool punch_hole = false) {
  UniqueFd fd(::memfd_create("mesh-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)), 0);  // backed, as the daemon demands
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  UniqueFd owner_side(::dup(fd.get()));  // what the exporting pod keeps
  auto m = HostMemfdBackend().Adopt({size, "", HandleKind::kHostMemfd}, std::move(fd), "");
  EXPECT_TRUE(m.ok()) << m.status();
  if (punch_hole) {
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
  explicit OneExportHost(std::shared_ptr<const ExportRecord> rec = MemfdExport(7, 4096)) : rec_(std::move(rec)) {}
  absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(
      const PodInfo&, const podlink::mesh::v1::OpenRegionRequest&) override {
    return rec_;
  }
  bool ExportLive(const ExportRecord&) const override { return true; }
  absl::Status NotifyOwner(const ExportRecord&, uint64_t) override { return absl::OkStatus(); }

 private:
  std::shared_ptr<const ExportRecord> rec_;
};

}  // namespace podlink::mesh::testing
