// The verbs backend (daemon/mesh/verbs/verbs_link.h) against a fake verbs
// table (tests/fakes/fake_verbs.h): an in-process "fabric" that carries RC
// RDMA WRITE, READ and WRITE WITH IMMEDIATE between fake QPs, checks rkeys
// against the target QP's protection domain like an HCA, and can break a QP
// (retry exhausted) on demand. Covers what soft-RoCE in the VM test cannot force cheaply: a QP
// failing mid-transfer, every QP failing, and a key used on another peer's
// QPs.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/gpu/memory_object.h"
#include "daemon/mesh/verbs/verbs_link.h"
#include "tests/fakes/fake_verbs.h"
#include "tests/fakes/verbs_owner.h"

namespace podlink::mesh::verbs {
namespace {

// The owner and the importer over the fake fabric: tests/fakes/verbs_owner.h.
class VerbsFake : public ::testing::Test, public FakeVerbsOwner {
 protected:
  using FakeVerbsOwner::Run;  // not ::testing::Test's
};

TEST_F(VerbsFake, WriteReadNotifyLandWhereGranted) {
  auto links = Connect("node-a");
  links->AddRegion(42, Register("node-a", 42));
  EXPECT_EQ(links->live(), 2u);
  std::vector<char> src = Pattern(300 << 10, 5);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 4096, src.data(), src.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data() + 4096, src.data(), src.size()));
  EXPECT_EQ(region_[4095], 0);
  std::vector<char> back(src.size());
  ASSERT_TRUE(Run(*links, FrameType::kRead, 42, 4096, back.data(), back.size()).ok());
  EXPECT_EQ(back, src);
  ASSERT_TRUE(Run(*links, FrameType::kNotify, 42, 77, nullptr, 0).ok());
  ASSERT_TRUE(AwaitNotes(1));
  std::lock_guard<std::mutex> l(mu_);
  ASSERT_EQ(notes_.size(), 1u);
  EXPECT_EQ(notes_[0].node, "node-a");
  EXPECT_EQ(notes_[0].grant, 42u);
  EXPECT_EQ(notes_[0].value, 77u);
  LinkStats s = links->Stats();
  EXPECT_EQ(s.bytes_sent, src.size());
  EXPECT_EQ(s.bytes_received, src.size());
}

// A host export as podlinkd holds it: its bytes, and whether every page is
// populated (a registration pins them, so a file with holes is not registered).
class FakeExport final : public MemoryObject {
 public:
  explicit FakeExport(size_t n, bool populated = true) : bytes_(n), populated_(populated) {}
  absl::StatusOr<RelayView> MapForRelay() override {
    return RelayView{false, -1, reinterpret_cast<uintptr_t>(bytes_.data()), bytes_.size()};
  }
  HandleKind kind() const override { return HandleKind::kHostMemfd; }
  absl::StatusOr<UniqueFd> Duplicate() const override { return absl::UnimplementedError("fake"); }
  absl::Status CheckPopulated(uint64_t, uint64_t) const override {
    return populated_ ? absl::OkStatus() : absl::FailedPreconditionError("holes");
  }
  char* data() { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }

 private:
  std::vector<char> bytes_;
  bool populated_;
};

size_t FabricMrs() {
  std::lock_guard<std::recursive_mutex> l(fabric->mu);
  return fabric->mrs.size();
}

// A host export on the importing side is registered itself (once per path,
// local access only) and slices go straight from and into it; the
// registration goes once the export is gone.
TEST_F(VerbsFake, AHostExportIsSentFromAndReadIntoDirectly) {
  auto links = Connect("node-a");
  links->AddRegion(42, Register("node-a", 42));
  auto exp = std::make_shared<FakeExport>(512 << 10);
  std::vector<char> src = Pattern(300 << 10, 8);
  std::memcpy(exp->data() + 8192, src.data(), src.size());
  const size_t mrs = FabricMrs();
  Local whole{exp, exp->data(), exp->size()};
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 4096, exp->data() + 8192, src.size(), nullptr, whole).ok());
  EXPECT_EQ(0, std::memcmp(region_.data() + 4096, src.data(), src.size()));
  EXPECT_EQ(FabricMrs(), mrs + 1) << "one registration of the export in the path's protection domain";
  std::memset(exp->data(), 0, exp->size());
  ASSERT_TRUE(Run(*links, FrameType::kRead, 42, 4096, exp->data() + 100, src.size(), nullptr, whole).ok());
  EXPECT_EQ(0, std::memcmp(exp->data() + 100, src.data(), src.size()));
  EXPECT_EQ(FabricMrs(), mrs + 1) << "the registration is reused";
  LinkStats s = links->Stats();
  const uint64_t slices = 2 * ((src.size() + options_.slice_bytes - 1) / options_.slice_bytes);
  EXPECT_EQ(s.zero_copy_slices, slices);
  EXPECT_EQ(s.local_registrations, 1u);
  {  // Its access is local: the owner's side of a peer cannot use it.
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    for (const auto& [key, m] : fabric->mrs) {
      if (m->mr.addr == exp->data()) {
        EXPECT_EQ(m->access, IBV_ACCESS_LOCAL_WRITE);
      }
    }
  }
  links->Sweep();
  EXPECT_EQ(links->Stats().local_registrations, 1u) << "the export is still held: kept";
  whole.record.reset();  // the export is withdrawn (its memory may live on elsewhere)
  // As the engine's housekeeping does every 200 ms (the completion thread
  // may still hold the last slice for a moment after the op finished).
  for (int i = 0; i < 200 && links->Stats().local_registrations != 0; ++i) {
    links->Sweep();
    usleep(10000);
  }
  EXPECT_EQ(links->Stats().local_registrations, 0u) << "the export went away: deregistered";
  EXPECT_EQ(FabricMrs(), mrs);
}

// One export used with two peers (a ring of three nodes): each peer's link
// set registers it in its own protection domain, and both registrations go
// once the export is gone.
TEST_F(VerbsFake, AnExportUsedWithTwoPeersIsDroppedByBoth) {
  auto a = Connect("node-a");
  auto b = Connect("node-b");
  a->AddRegion(42, Register("node-a", 42));
  b->AddRegion(43, Register("node-b", 43));
  auto exp = std::make_shared<FakeExport>(256 << 10);
  std::vector<char> src = Pattern(128 << 10, 14);
  std::memcpy(exp->data(), src.data(), src.size());
  Local whole{exp, exp->data(), exp->size()};
  ASSERT_TRUE(Run(*a, FrameType::kWrite, 42, 0, exp->data(), src.size(), nullptr, whole).ok());
  ASSERT_TRUE(Run(*b, FrameType::kRead, 43, 0, exp->data() + src.size(), src.size(), nullptr, whole).ok());
  EXPECT_EQ(a->Stats().local_registrations, 1u);
  EXPECT_EQ(b->Stats().local_registrations, 1u);
  whole.record.reset();
  for (int i = 0; i < 200 && a->Stats().local_registrations + b->Stats().local_registrations != 0; ++i) {
    a->Sweep();
    b->Sweep();
    usleep(10000);
  }
  EXPECT_EQ(a->Stats().local_registrations, 0u);
  EXPECT_EQ(b->Stats().local_registrations, 0u) << "each kept it alive for the other";
}

// What cannot be registered is copied through staging, byte for byte: an
// export with holes (registration would pin, and so allocate, them), one the
// device refuses, and a range outside the memory described.
TEST_F(VerbsFake, WhatCannotBeRegisteredIsStaged) {
  auto links = Connect("node-a");
  links->AddRegion(42, Register("node-a", 42));
  auto holes = std::make_shared<FakeExport>(256 << 10, /*populated=*/false);
  auto refused = std::make_shared<FakeExport>(256 << 10);
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    fabric->refuse_registration = refused->data();
  }
  int seed = 20;
  for (const auto& exp : {holes, refused}) {
    std::vector<char> src = Pattern(200 << 10, ++seed);
    std::memcpy(exp->data(), src.data(), src.size());
    const Local whole{exp, exp->data(), exp->size()};
    ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 0, exp->data(), src.size(), nullptr, whole).ok());
    EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
    std::memset(exp->data(), 0, exp->size());
    ASSERT_TRUE(Run(*links, FrameType::kRead, 42, 0, exp->data(), src.size(), nullptr, whole).ok());
    EXPECT_EQ(0, std::memcmp(exp->data(), src.data(), src.size()));
  }
  // A range the description does not cover (an engine bug must not become
  // a DMA outside the registration).
  auto small = std::make_shared<FakeExport>(64 << 10);
  std::vector<char> src = Pattern(128 << 10, 30);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 0, src.data(), src.size(), nullptr,
                  Local{small, small->data(), small->size()})
                  .ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
  EXPECT_EQ(links->Stats().zero_copy_slices, 0u);
  EXPECT_EQ(links->Stats().local_registrations, 0u);
  std::lock_guard<std::recursive_mutex> l(fabric->mu);
  fabric->refuse_registration = nullptr;
}

// Registrations are bounded per link set: the least recently used idle one
// makes room.
TEST_F(VerbsFake, LocalRegistrationsAreBounded) {
  auto links = Connect("node-a");
  links->AddRegion(42, Register("node-a", 42));
  std::vector<std::shared_ptr<FakeExport>> exports;
  for (size_t i = 0; i < VerbsLinks::kMaxLocalRegistrations + 8; ++i) {
    exports.push_back(std::make_shared<FakeExport>(4096));
    auto& exp = exports.back();
    std::vector<char> src = Pattern(4096, static_cast<int>(i));
    std::memcpy(exp->data(), src.data(), src.size());
    ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 0, exp->data(), src.size(), nullptr,
                    Local{exp, exp->data(), exp->size()})
                    .ok());
    ASSERT_EQ(0, std::memcmp(region_.data(), src.data(), src.size())) << i;
  }
  EXPECT_EQ(links->Stats().local_registrations, VerbsLinks::kMaxLocalRegistrations);
  EXPECT_EQ(links->Stats().zero_copy_slices, VerbsLinks::kMaxLocalRegistrations + 8);
}

// A GPU export (its dma-buf here a memfd, its address one only the device
// knows) is registered through ibv_reg_dmabuf_mr: the peer's writes and
// reads land in the dma-buf's memory at the daemon's address of it.
TEST_F(VerbsFake, AGpuExportIsRegisteredThroughItsDmaBuf) {
  auto links = Connect("node-a");
  const size_t size = 1 << 20;
  UniqueFd gpu(memfd_create("fake-dmabuf", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(gpu.get(), size), 0);
  char* const iova = reinterpret_cast<char*>(uintptr_t{0x7a0000000000});
  int made = 0;
  auto keys = server_->Register("node-a", 31, nullptr, iova, size, [&]() -> absl::StatusOr<UniqueFd> {
    ++made;
    return UniqueFd(dup(gpu.get()));
  });
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), 1u);
  EXPECT_EQ((*keys)[0].base, reinterpret_cast<uintptr_t>(iova));
  EXPECT_EQ(made, 1) << "one dma-buf per device registered";
  links->AddRegion(31, *keys);
  std::vector<char> src = Pattern(300 << 10, 12);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 31, 8192, src.data(), src.size()).ok());
  std::vector<char> landed(src.size());
  ASSERT_EQ(pread(gpu.get(), landed.data(), landed.size(), 8192), static_cast<ssize_t>(landed.size()));
  EXPECT_EQ(landed, src);
  std::vector<char> back(src.size());
  ASSERT_TRUE(Run(*links, FrameType::kRead, 31, 8192, back.data(), back.size()).ok());
  EXPECT_EQ(back, src);
  server_->Unregister(31, "node-a");
  EXPECT_EQ(server_->registrations(), 0u);
}

// Where the device cannot register dma-bufs (probed when it is opened), or
// no dma-buf of the memory can be made, a GPU export is refused with a
// reason, and nothing stays registered.
TEST_F(VerbsFake, AGpuExportIsRefusedWhereNoDmaBufCanBeRegistered) {
  auto links = Connect("node-a");
  auto no_dmabuf = [] { return absl::StatusOr<UniqueFd>(absl::UnimplementedError("this memory has no dma-buf")); };
  char* const iova = reinterpret_cast<char*>(uintptr_t{0x7a0000000000});
  auto keys = server_->Register("node-a", 32, nullptr, iova, 4096, no_dmabuf);
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kFailedPrecondition) << keys.status();
  EXPECT_NE(keys.status().message().find("no dma-buf"), std::string::npos) << keys.status();
  EXPECT_EQ(server_->registrations(), 0u);
}

TEST_F(VerbsFake, ADeviceWithoutDmaBufSupportRefusesGpuExports) {
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    fabric->dmabuf = false;
  }
  auto links = Connect("node-a");  // the device is opened (and probed) now
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    fabric->dmabuf = true;
  }
  int made = 0;
  auto keys = server_->Register("node-a", 33, nullptr, reinterpret_cast<char*>(uintptr_t{0x7a0000000000}), 4096,
                                [&]() -> absl::StatusOr<UniqueFd> {
                                  ++made;
                                  return UniqueFd(memfd_create("unused", MFD_CLOEXEC));
                                });
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kFailedPrecondition) << keys.status();
  EXPECT_NE(keys.status().message().find("cannot register GPU memory"), std::string::npos) << keys.status();
  EXPECT_EQ(made, 0);
  EXPECT_EQ(server_->registrations(), 0u);
  // Host memory still registers on that device.
  EXPECT_TRUE(server_->Register("node-a", 34, nullptr, region_.data(), region_.size()).ok());
}

TEST_F(VerbsFake, ManyNotificationsReuseMailboxSlots) {
  auto links = Connect("node-a");
  links->AddRegion(1, Register("node-a", 1));
  for (uint64_t v = 1; v <= 100; ++v) ASSERT_TRUE(Run(*links, FrameType::kNotify, 1, v, nullptr, 0).ok());
  ASSERT_TRUE(AwaitNotes(100));
  std::lock_guard<std::mutex> l(mu_);
  ASSERT_EQ(notes_.size(), 100u);
  for (uint64_t v = 1; v <= 100; ++v) EXPECT_EQ(notes_[v - 1].value, v);
}

TEST_F(VerbsFake, AQpFailingMidTransferCostsNoData) {
  auto links = Connect("node-a");
  links->AddRegion(9, Register("node-a", 9));
  uint32_t first = QpsOf(*links).front();
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    fabric->qps.at(first)->fail_after = 3;
  }
  std::vector<char> src = Pattern(1 << 20, 11);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 9, 0, src.data(), src.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
  LinkStats s = links->Stats();
  EXPECT_EQ(s.connections_up, 1u);
  EXPECT_EQ(s.connection_failures, 1u);
  EXPECT_GE(s.resent_slices, 1u);
  EXPECT_EQ(links->live(), 1u);
}

TEST_F(VerbsFake, EveryQpFailingFailsUnavailableAndNotifiesAreNotResent) {
  auto links = Connect("node-a");
  links->AddRegion(9, Register("node-a", 9));
  std::vector<uint32_t> qps = QpsOf(*links);
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    for (uint32_t qpn : qps) fabric->qps.at(qpn)->broken = true;
  }
  std::vector<char> src = Pattern(256 << 10, 3);
  absl::Status st = Run(*links, FrameType::kWrite, 9, 0, src.data(), src.size());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(links->live(), 0u);
  EXPECT_EQ(Run(*links, FrameType::kNotify, 9, 1, nullptr, 0).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(server_->notifies(), 0u);
}

// The paths a link set reported down, in order.
class DownLog {
 public:
  void Attach(VerbsLinks& links) {
    links.set_on_path_down([this](const std::string& path) {
      std::lock_guard<std::mutex> l(mu_);
      paths_.push_back(path);
    });
  }
  std::vector<std::string> paths() {
    std::lock_guard<std::mutex> l(mu_);
    return paths_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> paths_;
};

TEST_F(VerbsFake, APathWhoseQpsAllFailedIsRepairedAndTheOwnerDropsTheOldOnes) {
  auto links = Connect("node-a");
  links->AddRegion(9, Register("node-a", 9));
  DownLog downs;
  downs.Attach(*links);
  std::vector<uint32_t> qps = QpsOf(*links);
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    for (uint32_t qpn : qps) fabric->qps.at(qpn)->broken = true;
  }
  std::vector<char> src = Pattern(256 << 10, 4);
  EXPECT_EQ(Run(*links, FrameType::kWrite, 9, 0, src.data(), src.size()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(downs.paths(), (std::vector<std::string>{"test-path", "test-path"}));  // once per failed QP
  std::vector<uint32_t> failed = links->FailedRemoteQps("test-path");
  EXPECT_EQ(failed.size(), 2u);
  EXPECT_EQ(server_->qps(), 2u);
  // The repair: new QPs on the same path; the owner drops the failed ones.
  auto repaired = AddPath(*links, "node-a", "test-path", failed);
  ASSERT_TRUE(repaired.ok()) << repaired.status();
  EXPECT_EQ(server_->qps(), 2u);  // two new, two dropped
  links->MarkReported(failed);
  EXPECT_TRUE(links->FailedRemoteQps("test-path").empty());
  EXPECT_EQ(links->live(), 2u);
  EXPECT_EQ(links->Connections().size(), 2u);  // the replaced QPs are not listed
  // The grant's keys still work: same owner device, same protection domain.
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 9, 0, src.data(), src.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
  // Another node cannot make the owner drop node-a's QPs.
  std::vector<uint32_t> a_qps;
  for (const QpWire& q : repaired->owner.qps) a_qps.push_back(q.qpn);
  auto b = std::make_unique<VerbsLinks>("node-b", options_);
  auto nic = nics_.Get(Mine());
  ASSERT_TRUE(nic.ok());
  auto pb = b->PreparePath(*nic, Mine(), "b-path");
  ASSERT_TRUE(pb.ok());
  ASSERT_TRUE(server_->Accept("node-b", b->instance(), *IpPrefix::Parse("10.0.0.2/30"), pb->second, a_qps).ok());
  EXPECT_EQ(server_->qps(), 4u);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 9, 0, src.data(), src.size()).ok());
}

// One QP failing while its path's other QP lives: the transfer goes on over
// the other, and the repair makes one QP in its place (not a whole path),
// the owner dropping the failed one.
TEST_F(VerbsFake, AQpThatFailsAloneIsReplacedWhileItsPathCarriesOn) {
  auto links = Connect("node-a");
  links->AddRegion(9, Register("node-a", 9));
  DownLog downs;
  downs.Attach(*links);
  uint32_t first = QpsOf(*links).front();
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    fabric->qps.at(first)->fail_after = 1;
  }
  std::vector<char> src = Pattern(1 << 20, 6);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 9, 0, src.data(), src.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
  EXPECT_EQ(links->live(), 1u);
  EXPECT_EQ(downs.paths(), std::vector<std::string>{"test-path"});  // the path is still up: its QP is what failed
  std::vector<uint32_t> failed = links->FailedRemoteQps("test-path");
  ASSERT_EQ(failed.size(), 1u);
  auto repaired = AddPath(*links, "node-a", "test-path", failed, static_cast<uint32_t>(failed.size()));
  ASSERT_TRUE(repaired.ok()) << repaired.status();
  EXPECT_EQ(repaired->ours.qps.size(), 1u);
  EXPECT_EQ(server_->qps(), 2u);  // one new, one dropped
  links->MarkReported(failed);
  EXPECT_EQ(links->live(), 2u);
  EXPECT_EQ(links->Connections().size(), 2u);
  std::vector<char> next = Pattern(1 << 20, 7);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 9, 0, next.data(), next.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), next.data(), next.size()));
}

TEST_F(VerbsFake, AnotherPeersKeyIsUselessOnThisPeersQps) {
  auto a = Connect("node-a");
  auto b = Connect("node-b");
  std::vector<RegionKey> keys_for_a = Register("node-a", 5);
  // node-b's daemon learned node-a's key (leaked, guessed): its QPs live in
  // another protection domain, so the owner's HCA refuses the write.
  b->AddRegion(5, keys_for_a);
  std::vector<char> src = Pattern(4096, 1);
  absl::Status st = Run(*b, FrameType::kWrite, 5, 0, src.data(), src.size());
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(region_[0], 0);
  EXPECT_EQ(region_[1], 0);
  // The key still works for the node it was made for.
  a->AddRegion(5, keys_for_a);
  EXPECT_TRUE(Run(*a, FrameType::kWrite, 5, 0, src.data(), src.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
}

TEST_F(VerbsFake, UnregisteredGrantIsRefusedByTheHca) {
  auto links = Connect("node-a");
  std::vector<RegionKey> keys = Register("node-a", 8);
  links->AddRegion(8, keys);
  server_->Unregister(8, "node-b");  // not node-b's: stays
  std::vector<char> src = Pattern(4096, 2);
  EXPECT_TRUE(Run(*links, FrameType::kWrite, 8, 0, src.data(), src.size()).ok());
  server_->Unregister(8, "node-a");
  EXPECT_FALSE(Run(*links, FrameType::kWrite, 8, 0, src.data(), src.size()).ok());
}

TEST_F(VerbsFake, GrantsOfOneExportShareItsRegistration) {
  auto links = Connect("node-a");
  std::vector<RegionKey> k1 = Register("node-a", 1);
  std::vector<RegionKey> k2 = Register("node-a", 2);
  ASSERT_EQ(k1.size(), 1u);
  ASSERT_EQ(k2.size(), 1u);
  EXPECT_EQ(k1[0].rkey, k2[0].rkey);  // one MR
  EXPECT_EQ(server_->registrations(), 1u);
  EXPECT_EQ(server_->RegisteredGrants().size(), 2u);
  EXPECT_EQ(server_->Register("node-a", 2, nullptr, region_.data(), region_.size()).status().code(),
            absl::StatusCode::kAlreadyExists);
  links->AddRegion(2, k2);
  std::vector<char> src = Pattern(4096, 6);
  server_->Unregister(1, "node-a");  // the other grant keeps it
  EXPECT_TRUE(Run(*links, FrameType::kWrite, 2, 0, src.data(), src.size()).ok());
  EXPECT_EQ(server_->registrations(), 1u);
  server_->Unregister(2, "node-a");  // the last one drops it
  EXPECT_EQ(server_->registrations(), 0u);
  EXPECT_FALSE(Run(*links, FrameType::kWrite, 2, 0, src.data(), src.size()).ok());
}

// A transfer that prefers some paths (nic_rank.h: those nearest its
// memory) goes over their queue pairs while any of them is up, then over the
// others, and completes either way.
TEST_F(VerbsFake, PreferredPathsCarryTheTransferWhileTheyAreUp) {
  auto links = std::make_unique<VerbsLinks>("node-a", options_);
  for (const char* name : {"far", "near"}) {
    auto sides = AddPath(*links, "node-a", name);
    ASSERT_TRUE(sides.ok()) << sides.status();
  }
  links->AddRegion(5, Register("node-a", 5));
  auto pref = std::make_shared<PathPreference>();
  pref->tier = {"near"};
  pref->fastest = {"near"};
  auto sent = [&](const std::string& path) {
    uint64_t n = 0;
    for (const auto& [name, up, bytes] : links->Connections()) n += name.rfind(path + " ", 0) == 0 ? bytes : 0;
    return n;
  };
  std::vector<char> src = Pattern(1 << 20, 3);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 5, 0, src.data(), src.size(), pref).ok());
  EXPECT_EQ(sent("near"), src.size());
  EXPECT_EQ(sent("far"), 0u);
  // Both of near's QPs break after a few more posts: the rest goes far.
  std::vector<uint32_t> near;
  for (const auto& [name, up, bytes] : links->Connections()) {
    if (name.rfind("near ", 0) == 0) near.push_back(static_cast<uint32_t>(std::stoul(name.substr(name.rfind(' ') + 1))));
  }
  ASSERT_EQ(near.size(), 2u);
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    for (uint32_t qpn : near) fabric->qps.at(qpn)->fail_after = 2;
  }
  std::vector<char> next = Pattern(1 << 20, 4);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 5, 0, next.data(), next.size(), pref).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), next.data(), next.size()));
  EXPECT_GT(sent("far"), 0u);
  EXPECT_EQ(links->Stats().connections_up, 2u);  // far's two
}

// A host export is registered only on the paths its op may use (registering
// pins); when those fail mid-transfer, the rest goes over the others,
// copied through their staging, byte for byte.
TEST_F(VerbsFake, AHostExportIsRegisteredOnlyWhereItsSlicesMayGo) {
  auto links = std::make_unique<VerbsLinks>("node-a", options_);
  for (const char* name : {"far", "near"}) {
    auto sides = AddPath(*links, "node-a", name);
    ASSERT_TRUE(sides.ok()) << sides.status();
  }
  links->AddRegion(5, Register("node-a", 5));
  auto pref = std::make_shared<PathPreference>();
  pref->tier = {"near"};
  pref->fastest = {"near"};
  auto exp = std::make_shared<FakeExport>(1 << 20);
  std::vector<char> src = Pattern(1 << 20, 6);
  std::memcpy(exp->data(), src.data(), src.size());
  Local whole{exp, exp->data(), exp->size()};
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 5, 0, exp->data(), src.size(), pref, whole).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
  EXPECT_EQ(links->Stats().local_registrations, 1u) << "registered on near only";
  std::vector<uint32_t> near;
  for (const auto& [name, up, bytes] : links->Connections()) {
    if (name.rfind("near ", 0) == 0) near.push_back(static_cast<uint32_t>(std::stoul(name.substr(name.rfind(' ') + 1))));
  }
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    for (uint32_t qpn : near) fabric->qps.at(qpn)->fail_after = 2;
  }
  std::vector<char> next = Pattern(1 << 20, 7);
  std::memcpy(exp->data(), next.data(), next.size());
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 5, 0, exp->data(), next.size(), pref, whole).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), next.data(), next.size()));
  EXPECT_EQ(links->Stats().connections_up, 2u);  // far's two
}

TEST_F(VerbsFake, OwnerLimitsQueuePairsPerPeer) {
  options_.max_qps_per_peer = 3;
  server_ = std::make_unique<VerbsServer>(&nics_, options_, [](const std::string&, uint64_t, uint64_t) {});
  auto links = std::make_unique<VerbsLinks>("node-a", options_);
  GidChoice mine = Mine();
  auto nic = nics_.Get(mine);
  ASSERT_TRUE(nic.ok());
  auto p1 = links->PreparePath(*nic, mine, "p1");
  auto p2 = links->PreparePath(*nic, mine, "p2");
  ASSERT_TRUE(p1.ok() && p2.ok());
  IpPrefix owner = *IpPrefix::Parse("10.0.0.2/30");
  EXPECT_TRUE(server_->Accept("node-a", links->instance(), owner, p1->second).ok());
  EXPECT_EQ(server_->Accept("node-a", links->instance(), owner, p2->second).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A new link set of the same peer replaces the old one's QPs.
  auto again = std::make_unique<VerbsLinks>("node-a", options_);
  auto p3 = again->PreparePath(*nic, mine, "p3");
  ASSERT_TRUE(p3.ok());
  EXPECT_TRUE(server_->Accept("node-a", again->instance(), owner, p3->second).ok());
  EXPECT_EQ(server_->qps(), 2u);
}


// --- staged grants: the owner's bounce pool, no registration of the export -------

// Every byte of a staged grant goes through the owner's bounce pool: written,
// read back and notified over the same queue pairs, the export never
// registered for the peer and nothing of the owner's remotely accessible.
TEST_F(VerbsFake, AStagedGrantMovesEveryByteThroughTheOwnersBouncePool) {
  auto links = Connect("node-a");
  {
    std::lock_guard<std::mutex> l(mu_);
    staged_[42] = "node-a";
  }
  const size_t mrs = FabricMrs();
  ASSERT_TRUE(server_->PrepareStaging("node-a").ok());
  EXPECT_EQ(FabricMrs(), mrs + 1) << "one bounce pool for the peer's device";
  ASSERT_TRUE(server_->PrepareStaging("node-a").ok());
  EXPECT_EQ(FabricMrs(), mrs + 1) << "kept, not made again";
  {  // The pool is the owner's own: no remote access.
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    for (const auto& [key, m] : fabric->mrs) {
      if (m->mr.length >= kStageSlots * options_.slice_bytes) {
        EXPECT_EQ(m->access, IBV_ACCESS_LOCAL_WRITE);
      }
    }
  }
  links->AddStagedRegion(42);
  std::vector<char> src = Pattern(300 << 10, 41);  // 5 slices, more than the lanes' 4 slots
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 4096, src.data(), src.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data() + 4096, src.data(), src.size()));
  EXPECT_EQ(region_[4095], 0);
  EXPECT_EQ(region_[4096 + src.size()], 0);
  std::vector<char> back(src.size());
  ASSERT_TRUE(Run(*links, FrameType::kRead, 42, 4096, back.data(), back.size()).ok());
  EXPECT_EQ(back, src);
  ASSERT_TRUE(Run(*links, FrameType::kNotify, 42, 5, nullptr, 0).ok());
  ASSERT_TRUE(AwaitNotes(1));
  EXPECT_EQ(server_->staged_slices(), 10u);
  EXPECT_EQ(server_->registrations(), 0u);
  LinkStats st = links->Stats();
  EXPECT_EQ(st.bytes_sent, src.size());
  EXPECT_EQ(st.bytes_received, src.size());
  EXPECT_EQ(st.connection_failures, 0u);
  // Many small ones reuse the slots, the mailbox and the acknowledgements.
  for (int i = 0; i < 100; ++i) {
    std::vector<char> one = Pattern(1000, i);
    ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 1000 * i, one.data(), one.size()).ok()) << i;
    ASSERT_EQ(0, std::memcmp(region_.data() + 1000 * i, one.data(), one.size())) << i;
  }
}

// What the owner refuses fails with its reason, once, not resent, and the
// queue pairs carry on: a range outside the export, another peer's grant, a
// slice larger than the owner's bounce slots (a hostile or misconfigured
// importer), a grant the owner never staged.
TEST_F(VerbsFake, StagedSlicesTheOwnerRefusesFailWithItsCodeAndTheLinkCarriesOn) {
  auto a = Connect("node-a");
  auto b = Connect("node-b");
  {
    std::lock_guard<std::mutex> l(mu_);
    staged_[42] = "node-a";
    staged_[44] = "node-c";
  }
  ASSERT_TRUE(server_->PrepareStaging("node-a").ok());
  ASSERT_TRUE(server_->PrepareStaging("node-b").ok());
  a->AddStagedRegion(42);
  a->AddStagedRegion(43);  // never granted
  b->AddStagedRegion(42);  // node-a's
  std::vector<char> src = Pattern(64 << 10, 3);
  absl::Status outside = Run(*a, FrameType::kWrite, 42, region_.size() - 1000, src.data(), src.size());
  EXPECT_EQ(outside.code(), absl::StatusCode::kOutOfRange) << outside;
  EXPECT_NE(outside.message().find("refused a staged write"), std::string::npos) << outside;
  EXPECT_EQ(Run(*a, FrameType::kRead, 43, 0, src.data(), src.size()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Run(*b, FrameType::kWrite, 42, 0, src.data(), src.size()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(region_[0], 0) << "another peer's grant was written";
  VerbsOptions big = options_;
  big.slice_bytes = 2 * options_.slice_bytes;
  VerbsLinks wide("node-c", big);
  ASSERT_TRUE(AddPath(wide, "node-c", "wide").ok());
  ASSERT_TRUE(server_->PrepareStaging("node-c").ok());
  wide.AddStagedRegion(44);
  std::vector<char> large = Pattern(big.slice_bytes, 4);
  EXPECT_EQ(Run(wide, FrameType::kWrite, 44, 0, large.data(), large.size()).code(),
            absl::StatusCode::kInvalidArgument);
  // Told the owner's slot size (OpenRegionResponse.staged_slice_bytes), the
  // same link set cuts its slices to fit.
  wide.AddStagedRegion(44, options_.slice_bytes);
  ASSERT_TRUE(Run(wide, FrameType::kWrite, 44, 0, large.data(), large.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), large.data(), large.size()));
  std::memset(region_.data(), 0, region_.size());
  EXPECT_EQ(a->Stats().resent_slices, 0u) << "a refusal is final";
  EXPECT_EQ(server_->staged_refused(), 4u);
  ASSERT_TRUE(Run(*a, FrameType::kWrite, 42, 0, src.data(), src.size()).ok()) << "the owner's queue pairs carry on";
  EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
  EXPECT_EQ(a->live(), 2u);
}

// A queue pair failing with staged slices outstanding (their records sent,
// no acknowledgement yet): they go over the other one, no byte lost.
TEST_F(VerbsFake, AQpFailingWithStagedSlicesOutstandingCostsNoData) {
  auto links = Connect("node-a");
  {
    std::lock_guard<std::mutex> l(mu_);
    staged_[9] = "node-a";
  }
  ASSERT_TRUE(server_->PrepareStaging("node-a").ok());
  links->AddStagedRegion(9);
  uint32_t first = QpsOf(*links).front();
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    fabric->qps.at(first)->fail_after = 3;
  }
  std::vector<char> src = Pattern(1 << 20, 12);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 9, 0, src.data(), src.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
  std::vector<char> back(src.size());
  ASSERT_TRUE(Run(*links, FrameType::kRead, 9, 0, back.data(), back.size()).ok());
  EXPECT_EQ(back, src);
  LinkStats s = links->Stats();
  EXPECT_EQ(s.connection_failures, 1u);
  EXPECT_GE(s.resent_slices, 1u);
  EXPECT_EQ(links->live(), 1u);
}

// A sink that answers later from another thread (a relay sending the slice
// on): byte for byte, and the bounce slots it holds stay taken until it
// answers even when the importer's queue pairs go meanwhile — then come back.
TEST_F(VerbsFake, ASinkAnsweringLaterKeepsItsBounceSlotsUntilThenEvenWhenTheQpsGo) {
  async_sink_ = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    staged_[42] = "node-a";
  }
  auto links = Connect("node-a");
  ASSERT_TRUE(server_->PrepareStaging("node-a").ok());
  EXPECT_EQ(server_->FreeBounceSlots("node-a"), kStageSlots);
  links->AddStagedRegion(42);
  std::vector<char> src = Pattern(300 << 10, 51);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 0, src.data(), src.size()).ok());
  std::vector<char> back(src.size());
  ASSERT_TRUE(Run(*links, FrameType::kRead, 42, 0, back.data(), back.size()).ok());
  EXPECT_EQ(back, src);
  // Slices in the sink for a second when the importer's link set goes and a
  // new one replaces its queue pairs on the owner.
  sink_delay_us_ = 1000000;
  const int started = sinks_started_;
  absl::Notification failed;
  LinkOp op;
  op.type = FrameType::kWrite;
  op.grant = 42;
  op.length = src.size();
  op.local = src.data();
  op.done = [&](const absl::Status&) { failed.Notify(); };
  ASSERT_TRUE(links->Submit(std::move(op)).ok());
  // Until a slice is in the sink (not merely holding a slot for its READ,
  // which the owner may give back once the QP is gone).
  for (int i = 0; i < 1000 && sinks_started_ == started; ++i) usleep(2000);
  ASSERT_GT(sinks_started_, started) << "no slice reached the sink";
  links.reset();
  EXPECT_TRUE(failed.HasBeenNotified()) << "the op was not failed when its link set went";
  sink_delay_us_ = 2000;
  links = Connect("node-a");  // the owner drops the old QPs; the sink still holds their slots
  EXPECT_LT(server_->FreeBounceSlots("node-a"), kStageSlots) << "slots a sink still writes freed early";
  for (int i = 0; i < 600 && server_->FreeBounceSlots("node-a") != kStageSlots; ++i) usleep(5000);
  EXPECT_EQ(server_->FreeBounceSlots("node-a"), kStageSlots) << "slots lost once the sink answered";
  links->AddStagedRegion(42);
  ASSERT_TRUE(Run(*links, FrameType::kRead, 42, 0, back.data(), back.size()).ok());
  EXPECT_EQ(back, src);
}

// An owner that never answers a staged slice (a relay whose next hop hangs):
// the importer's housekeeping fails the QP after answer_timeout, the slices
// go to the other QP, which times out too, and the op fails UNAVAILABLE —
// bounded, not a hang. Answers that come after are dropped, their bounce
// slots given back.
TEST_F(VerbsFake, AStagedSliceNeverAnsweredFailsItsQpWithinTheAnswerTimeout) {
  options_.answer_timeout = absl::Milliseconds(500);
  hold_sink_ = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    staged_[42] = "node-a";
  }
  auto links = Connect("node-a");
  ASSERT_TRUE(server_->PrepareStaging("node-a").ok());
  links->AddStagedRegion(42);
  std::atomic<bool> stop{false};
  std::thread sweeper([&] {  // the engine's housekeeping, every 200 ms there
    while (!stop) {
      links->Sweep();
      usleep(50000);
    }
  });
  std::vector<char> src = Pattern(64 << 10, 61);
  const absl::Time t0 = absl::Now();
  absl::Status st = Run(*links, FrameType::kWrite, 42, 0, src.data(), src.size());
  const absl::Duration took = absl::Now() - t0;
  stop = true;
  sweeper.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("answered no staged slice"), std::string::npos) << st;
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(links->live(), 0u);
  EXPECT_GE(links->Stats().resent_slices, 1u) << "the first QP's slice did not go to the other";
  // The held slices are answered now, too late (nobody to answer): their
  // slots come back (a record the owner read late reaches the sink later).
  size_t answered = 0;
  for (int i = 0; i < 600 && server_->FreeBounceSlots("node-a") != kStageSlots; ++i) {
    std::vector<std::pair<std::shared_ptr<const void>, std::function<void(absl::Status)>>> held;
    {
      std::lock_guard<std::mutex> l(mu_);
      held.swap(held_);
    }
    for (auto& [keep, done] : held) done(absl::OkStatus());
    answered += held.size();
    usleep(5000);
  }
  EXPECT_GE(answered, 1u);
  EXPECT_EQ(server_->FreeBounceSlots("node-a"), kStageSlots);
}

// A staged write whose slice went out again after its QP failed, while the
// owner still held the first attempt's bytes (a relay sending them on, or
// its staging queue): the write ends only once that old copy landed (the
// importer's DONE record, answered after the transfer's copies in the
// sink), so the pod's next write to the same bytes cannot be overwritten
// by it. (Before: the first write completed at the resend's answer, the
// second landed, then the old copy over it.)
TEST_F(VerbsFake, AStagedWriteSentPartlyTwiceEndsOnlyOnceNoOldCopyCanLand) {
  options_.answer_timeout = absl::Milliseconds(600);
  {
    std::lock_guard<std::mutex> l(mu_);
    staged_[42] = "node-a";
  }
  auto links = Connect("node-a");
  ASSERT_TRUE(server_->PrepareStaging("node-a").ok());
  links->AddStagedRegion(42);
  std::atomic<bool> stop{false};
  std::thread sweeper([&] {  // the engine's housekeeping: fails the QP whose slice goes unanswered
    while (!stop) {
      links->Sweep();
      usleep(50000);
    }
  });
  const std::vector<char> first = Pattern(64 << 10, 71), second = Pattern(64 << 10, 72);
  defer_next_write_ = true;
  std::atomic<bool> second_done{false};
  // The first attempt's copy lands 100 ms after the resent one did, or
  // once the second write is done if that comes first.
  std::thread releaser([&] {
    bool resent_landed = false;
    for (int i = 0; i < 1000 && !resent_landed && !second_done; ++i) {
      usleep(5000);
      std::lock_guard<std::mutex> l(mu_);
      resent_landed = std::memcmp(region_.data(), first.data(), first.size()) == 0;
    }
    for (int i = 0; i < 20 && !second_done; ++i) usleep(5000);
    std::function<void()> late;
    {
      std::lock_guard<std::mutex> l(mu_);
      late.swap(deferred_);
    }
    if (late) late();
  });
  absl::Status a = Run(*links, FrameType::kWrite, 42, 0, const_cast<char*>(first.data()), first.size());
  absl::Status b = Run(*links, FrameType::kWrite, 42, 0, const_cast<char*>(second.data()), second.size());
  second_done = true;
  releaser.join();
  stop = true;
  sweeper.join();
  ASSERT_TRUE(a.ok()) << a;
  ASSERT_TRUE(b.ok()) << b;
  EXPECT_EQ(0, std::memcmp(region_.data(), second.data(), second.size()))
      << "the first write's old copy landed over the second";
  EXPECT_GE(links->Stats().resent_slices, 1u) << "the first attempt was not sent again";
  EXPECT_EQ(server_->staged_done(), 1u) << "one DONE record, for the write sent partly twice";
  EXPECT_EQ(links->live(), 1u);
  EXPECT_EQ(links->Stats().connection_failures, 1u);
  // Writes sent once need no DONE.
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 0, const_cast<char*>(first.data()), first.size()).ok());
  EXPECT_EQ(server_->staged_done(), 1u);
  for (int i = 0; i < 200 && server_->FreeBounceSlots("node-a") != kStageSlots; ++i) usleep(5000);
  EXPECT_EQ(server_->FreeBounceSlots("node-a"), kStageSlots);
}

// The owner READ a staged write's bytes but handles that READ's completion
// late (its poller behind, or another device's): meanwhile the importer's
// QP failed, the slice went again over the other QP, the write ended with
// DONE and the pod wrote the same bytes again. The old attempt's copy then
// reaches the staging thread: its transfer has ended, so it is dropped
// (counted), never copied over the newer bytes.
TEST_F(VerbsFake, AStagedWritesOldAttemptReachingTheOwnerAfterItsDoneIsDropped) {
  options_.answer_timeout = absl::Milliseconds(600);
  {
    std::lock_guard<std::mutex> l(mu_);
    staged_[42] = "node-a";
  }
  auto links = Connect("node-a");
  ASSERT_TRUE(server_->PrepareStaging("node-a").ok());
  links->AddStagedRegion(42);
  std::atomic<bool> stop{false};
  std::thread sweeper([&] {
    while (!stop) {
      links->Sweep();
      usleep(50000);
    }
  });
  const std::vector<char> first = Pattern(64 << 10, 81), second = Pattern(64 << 10, 82);
  {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    fabric->hold_reads = 1;  // the first attempt's READ lands; its completion waits
  }
  absl::Status a = Run(*links, FrameType::kWrite, 42, 0, const_cast<char*>(first.data()), first.size());
  absl::Status b = Run(*links, FrameType::kWrite, 42, 0, const_cast<char*>(second.data()), second.size());
  stop = true;
  sweeper.join();
  ASSERT_TRUE(a.ok()) << a;
  ASSERT_TRUE(b.ok()) << b;
  EXPECT_EQ(server_->staged_done(), 1u);
  EXPECT_EQ(server_->staged_late_dropped(), 0u);
  ReleaseReads();
  for (int i = 0; i < 400 && server_->staged_late_dropped() == 0; ++i) usleep(5000);
  EXPECT_EQ(server_->staged_late_dropped(), 1u) << "the old attempt's copy was not dropped";
  {
    std::lock_guard<std::mutex> l(mu_);
    EXPECT_EQ(0, std::memcmp(region_.data(), second.data(), second.size()))
        << "the first write's old attempt landed over the second";
  }
  for (int i = 0; i < 200 && server_->FreeBounceSlots("node-a") != kStageSlots; ++i) usleep(5000);
  EXPECT_EQ(server_->FreeBounceSlots("node-a"), kStageSlots) << "the dropped copy's bounce slot was kept";
}

// A peer's device reached after its grant was staged (a repaired path on
// another NIC) has no bounce pool yet: the first record makes it.
TEST_F(VerbsFake, APeerDeviceWithoutAPoolGetsOneAtItsFirstStagedRecord) {
  {
    std::lock_guard<std::mutex> l(mu_);
    staged_[42] = "node-a";
  }
  auto links = Connect("node-a");
  ASSERT_TRUE(server_->PrepareStaging("node-b").code() == absl::StatusCode::kFailedPrecondition);  // starts nothing
  links->AddStagedRegion(42);  // no PrepareStaging("node-a"): as for a device added later
  EXPECT_EQ(server_->FreeBounceSlots("node-a"), 0u);
  ASSERT_TRUE(server_->PrepareStaging("node-c").code() == absl::StatusCode::kFailedPrecondition);
  // The staging thread starts with the first pool of any peer.
  VerbsLinks other("node-z", options_);
  ASSERT_TRUE(AddPath(other, "node-z", "z").ok());
  ASSERT_TRUE(server_->PrepareStaging("node-z").ok());
  std::vector<char> src = Pattern(100 << 10, 62);
  ASSERT_TRUE(Run(*links, FrameType::kWrite, 42, 0, src.data(), src.size()).ok());
  EXPECT_EQ(0, std::memcmp(region_.data(), src.data(), src.size()));
  // Each slot comes back once its answer's send completed on the owner.
  for (int i = 0; i < 200 && server_->FreeBounceSlots("node-a") != kStageSlots; ++i) usleep(5000);
  EXPECT_EQ(server_->FreeBounceSlots("node-a"), kStageSlots);
}

// Staging needs both sides to speak staged records: an owner without a
// staging sink (or an importer of an older version) answers notifications
// only, and its notifications still arrive.
TEST_F(VerbsFake, AnOwnerThatDoesNotStageSaysSoAndStillTakesNotifications) {
  server_ = std::make_unique<VerbsServer>(&nics_, options_, [this](const std::string& node, uint64_t g, uint64_t v) {
    std::lock_guard<std::mutex> l(mu_);
    notes_.push_back({node, g, v});
  });
  auto links = std::make_unique<VerbsLinks>("node-a", options_);
  auto sides = AddPath(*links, "node-a", "old-owner");
  ASSERT_TRUE(sides.ok()) << sides.status();
  EXPECT_EQ(sides->ours.records, kRecordsStagedDone);
  EXPECT_EQ(sides->owner.records, kRecordsNotifyOnly);
  EXPECT_EQ(server_->PrepareStaging("node-a").code(), absl::StatusCode::kFailedPrecondition);
  links->AddRegion(7, Register("node-a", 7));
  for (uint64_t v = 1; v <= 40; ++v) ASSERT_TRUE(Run(*links, FrameType::kNotify, 7, v, nullptr, 0).ok());
  ASSERT_TRUE(AwaitNotes(40));
  {
    std::lock_guard<std::mutex> l(mu_);
    for (uint64_t v = 1; v <= 40; ++v) EXPECT_EQ(notes_[v - 1].value, v);
  }
  links->AddStagedRegion(8);  // an engine bug: the link set refuses rather than write a record the owner cannot read
  std::vector<char> src = Pattern(4096, 1);
  EXPECT_EQ(Run(*links, FrameType::kWrite, 8, 0, src.data(), src.size()).code(), absl::StatusCode::kFailedPrecondition);
  // A node with no queue pairs here at all has no pool either.
  EXPECT_EQ(server_->PrepareStaging("node-z").code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace podlink::mesh::verbs
