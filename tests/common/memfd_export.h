// A host memory export as Broker::Export accepts one (a sealed memfd adopted by
// the host backend), with the owner's own mapping of it: for the mesh's room
// tests that serve or register an export without a broker.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "daemon/gpu/host_backend.h"
#include "daemon/registry/registry.h"
#include "gtest/gtest.h"

namespace podlink::testing {

struct MemfdExport {
  UniqueFd fd;
  uint8_t* bytes = nullptr;  // the owner's mapping
  uint64_t size = 0;
  std::shared_ptr<const ExportRecord> record;
  MemfdExport() = default;
  MemfdExport(const MemfdExport&) = delete;
  MemfdExport& operator=(const MemfdExport&) = delete;
  ~MemfdExport() {
    if (bytes != nullptr) ::munmap(bytes, size);
  }
};

// Export `id` of `size` bytes, every byte `fill`, owned by pod team/owner-pod.
inline std::unique_ptr<MemfdExport> MakeMemfdExport(uint64_t id, uint64_t size, uint8_t fill) {
  auto e = std::make_unique<MemfdExport>();
  e->size = size;
  e->fd = UniqueFd(::memfd_create("podlink-test-export", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(e->fd.valid());
  EXPECT_EQ(::posix_fallocate(e->fd.get(), 0, static_cast<off_t>(size)), 0);
  EXPECT_EQ(::fcntl(e->fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, e->fd.get(), 0);
  EXPECT_NE(p, MAP_FAILED);
  if (p == MAP_FAILED) return e;
  e->bytes = static_cast<uint8_t*>(p);
  std::memset(e->bytes, fill, size);
  UniqueFd dup(::fcntl(e->fd.get(), F_DUPFD_CLOEXEC, 0));
  auto m = HostMemfdBackend().Adopt({size, "", HandleKind::kHostMemfd}, std::move(dup), "");
  EXPECT_TRUE(m.ok()) << m.status();
  ExportRecord rec;
  rec.id = id;
  rec.size = size;
  rec.kind = HandleKind::kHostMemfd;
  if (m.ok()) rec.memory = *std::move(m);
  rec.owner.namespace_ = "team";
  rec.owner.name = "owner-pod";
  e->record = std::make_shared<const ExportRecord>(std::move(rec));
  return e;
}

}  // namespace podlink::testing
