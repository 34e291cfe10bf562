#include "daemon/gpu/host_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "daemon/gpu/cuda_backend.h"
#include "gtest/gtest.h"

namespace podlink {
namespace {

UniqueFd Memfd(size_t size, int seals) {
  UniqueFd fd(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_EQ(::posix_fallocate(fd.get(), 0, size), 0);
  if (seals) {
    EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  }
  return fd;
}

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

TEST(HostBackend, AcceptsSealedMemfdAndDuplicates) {
  HostMemfdBackend b;
  auto obj = b.Adopt({4096, "", HandleKind::kHostMemfd}, Memfd(4096, kSeals), "");
  ASSERT_TRUE(obj.ok()) << obj.status();
  auto dup = (*obj)->Duplicate();
  ASSERT_TRUE(dup.ok());
  EXPECT_TRUE(dup->valid());
}

TEST(HostBackend, RejectsDescriptorsThatAreNotWhatTheyClaim) {
  HostMemfdBackend b;
  auto expect = [&](absl::StatusOr<std::shared_ptr<MemoryObject>> r, const char* mentions) {
    ASSERT_FALSE(r.ok()) << mentions;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(mentions), absl::string_view::npos) << r.status();
  };
  expect(b.Adopt({4096, "", HandleKind::kHostMemfd}, Memfd(4096, 0), ""), "not sealed");
  expect(b.Adopt({4096, "", HandleKind::kHostMemfd}, Memfd(4096, F_SEAL_SHRINK), ""), "not sealed");
  expect(b.Adopt({8192, "", HandleKind::kHostMemfd}, Memfd(4096, kSeals), ""), "holds only 4096");
  expect(b.Adopt({0, "", HandleKind::kHostMemfd}, Memfd(4096, kSeals), ""), "size");
  expect(b.Adopt({4096, "GPU-x", HandleKind::kHostMemfd}, Memfd(4096, kSeals), ""), "must not name a GPU");
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  ::close(p[1]);
  expect(b.Adopt({1, "", HandleKind::kHostMemfd}, UniqueFd(p[0]), ""), "not a memfd");
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ::close(sv[1]);
  expect(b.Adopt({1, "", HandleKind::kHostMemfd}, UniqueFd(sv[0]), ""), "not a memfd");
  char tmpl[] = "/tmp/podlink-backend-XXXXXX";
  int f = ::mkstemp(tmpl);
  ASSERT_GE(f, 0);
  ::unlink(tmpl);
  ASSERT_EQ(::ftruncate(f, 4096), 0);
  expect(b.Adopt({4096, "", HandleKind::kHostMemfd}, UniqueFd(f), ""), "not a memfd");
  expect(b.Adopt({4096, "", HandleKind::kHostMemfd}, UniqueFd(), ""), "needs a descriptor");
  // A read-only reopen of a sealed memfd.
  UniqueFd m = Memfd(4096, kSeals);
  UniqueFd ro(::open(("/proc/self/fd/" + std::to_string(m.get())).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(ro.valid());
  expect(b.Adopt({4096, "", HandleKind::kHostMemfd}, std::move(ro), ""), "read-write");
}

// Records what the backend asks of it; checks that memory handed to Unpin is
// still mapped (the backend must unpin before it unmaps).
class FakePinner : public HostPinner {
 public:
  explicit FakePinner(bool fail) : fail_(fail) {}
  absl::Status Pin(void* p, uint64_t size) override {
    pins.push_back({p, size});
    if (fail_) return absl::ResourceExhaustedError("RLIMIT_MEMLOCK");
    return absl::OkStatus();
  }
  void Unpin(void* p) override {
    unpins.push_back(p);
    still_mapped_at_unpin = static_cast<volatile char*>(p)[0] == 'x';
  }
  std::vector<std::pair<void*, uint64_t>> pins;
  std::vector<void*> unpins;
  bool still_mapped_at_unpin = false;

 private:
  const bool fail_;
};

// A sealed memfd of `size` bytes whose first byte is 'x', adopted by `b`.
absl::StatusOr<std::shared_ptr<MemoryObject>> AdoptMarked(HostMemfdBackend& b, size_t size) {
  UniqueFd fd = Memfd(size, kSeals);
  EXPECT_EQ(::pwrite(fd.get(), "x", 1, 0), 1);
  return b.Adopt({size, "", HandleKind::kHostMemfd}, std::move(fd), "");
}

TEST(HostBackend, PinsTheRelayMappingOnceAndUnpinsBeforeUnmapping) {
  auto pinner = std::make_shared<FakePinner>(false);
  HostMemfdBackend b(pinner);
  auto obj = AdoptMarked(b, 8192);
  ASSERT_TRUE(obj.ok()) << obj.status();
  EXPECT_TRUE(pinner->pins.empty()) << "nothing is pinned before the relay needs the memory";
  auto v1 = (*obj)->MapForRelay();
  auto v2 = (*obj)->MapForRelay();
  ASSERT_TRUE(v1.ok() && v2.ok());
  EXPECT_EQ(v1->address, v2->address);
  ASSERT_EQ(pinner->pins.size(), 1u);
  EXPECT_EQ(reinterpret_cast<uint64_t>(pinner->pins[0].first), v1->address);
  EXPECT_EQ(pinner->pins[0].second, 8192u);
  obj->reset();
  ASSERT_EQ(pinner->unpins.size(), 1u);
  EXPECT_EQ(reinterpret_cast<uint64_t>(pinner->unpins[0]), v1->address);
  EXPECT_TRUE(pinner->still_mapped_at_unpin);
}

TEST(HostBackend, PinFailureFallsBackToPageableMemory) {
  auto pinner = std::make_shared<FakePinner>(true);
  HostMemfdBackend b(pinner);
  auto obj = AdoptMarked(b, 4096);
  ASSERT_TRUE(obj.ok()) << obj.status();
  auto v = (*obj)->MapForRelay();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(reinterpret_cast<const char*>(v->address)[0], 'x');
  EXPECT_EQ(pinner->pins.size(), 1u);
  obj->reset();
  EXPECT_TRUE(pinner->unpins.empty()) << "only what was pinned is unpinned";
}

TEST(HostBackend, PinningStopsAtTheBudgetAndUnpinningGivesItBack) {
  auto fake = std::make_shared<FakePinner>(false);
  auto budget = std::make_shared<BudgetedPinner>(fake, 12288);
  HostMemfdBackend b(budget);
  auto first = AdoptMarked(b, 8192);
  auto second = AdoptMarked(b, 8192);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE((*first)->MapForRelay().ok());
  EXPECT_EQ(budget->pinned_bytes(), 8192u);
  // Over the budget: not pinned (the inner pinner is not even asked), still usable.
  auto v = (*second)->MapForRelay();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(reinterpret_cast<const char*>(v->address)[0], 'x');
  EXPECT_EQ(fake->pins.size(), 1u);
  EXPECT_EQ(budget->pinned_bytes(), 8192u);
  first->reset();
  EXPECT_EQ(budget->pinned_bytes(), 0u);
  second->reset();
  EXPECT_EQ(fake->unpins.size(), 1u) << "only the pinned export is unpinned";
  // The budget is free again.
  auto third = AdoptMarked(b, 8192);
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE((*third)->MapForRelay().ok());
  EXPECT_EQ(budget->pinned_bytes(), 8192u);
}

TEST(HostBackend, AFailedPinReturnsItsShareOfTheBudget) {
  auto budget = std::make_shared<BudgetedPinner>(std::make_shared<FakePinner>(true), 8192);
  int dummy = 0;
  absl::Status st = budget->Pin(&dummy, 8192);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);  // the inner pinner's error
  EXPECT_EQ(budget->pinned_bytes(), 0u);
  st = budget->Pin(&dummy, 8193);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("limit of 8192"), absl::string_view::npos) << st;
}

TEST(CudaBackend, WithoutCudaRefusesClearly) {
  GpuInventory inv;
  inv.cuda_status = "disabled with --no-gpu";
  CudaBackend b(&inv);
  auto r = b.Adopt({2 << 20, "GPU-x", HandleKind::kPosixFd}, Memfd(4096, kSeals), "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("--no-gpu"), absl::string_view::npos) << r.status();
}

}  // namespace
}  // namespace podlink
