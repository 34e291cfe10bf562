// TransferEngine's notifications with bytes (version 2 relay rings) and
// RegisterHost (host memory by address: memfds and memory as it is), against a real podlinkd: two
// sessions of this process (one standalone identity: the same-pod policy).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "podlink/client.h"
#include "podlink/transfer.h"
#include "tests/integration/harness.h"
#include "tests/integration/host_peer.h"

namespace podlink::testing {
namespace {

using Peer = HostPeer;

Peer MakePeer(const Daemon& d, size_t size, bool force_relay) { return MakeHostPeer(d, size, force_relay); }

RemoteRegion Open(Peer& from, Peer& to) {
  auto desc = to.engine->Describe(to.region);
  EXPECT_TRUE(desc.ok()) << desc.status();
  auto r = from.engine->Open(*RegionDescriptor::Parse(desc->Serialize()));
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

// Notifications of `to` until `n` arrived or 10 s passed.
std::vector<Notification> Receive(Peer& to, size_t n) {
  std::vector<Notification> got;
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (got.size() < n && absl::Now() < deadline) {
    for (Notification& x : to.engine->PollNotifications()) got.push_back(std::move(x));
    if (got.size() < n) absl::SleepFor(absl::Microseconds(200));
  }
  return got;
}

class Messages : public ::testing::TestWithParam<bool> {  // force_relay: the relay's copies, or host memcpy
 protected:
  Daemon daemon_{"{}"};
};

TEST_P(Messages, EachArrivesAfterItsDataInOrderWithItsBytes) {
  constexpr size_t kSize = 1 << 20;
  Peer a = MakePeer(daemon_, kSize, GetParam());
  Peer b = MakePeer(daemon_, kSize, GetParam());
  RemoteRegion ra = Open(b, a);
  auto* src = static_cast<uint8_t*>(b.buf->data());
  auto* dst = static_cast<uint8_t*>(a.buf->data());
  constexpr int kRounds = 200;
  int checked = 0;
  std::vector<std::string> messages;
  for (int i = 0; i < kRounds; ++i) {
    std::memset(src, i & 0xff, kSize);
    auto write = b.engine->WriteAsync({{&b.region, 0, &ra, 0, kSize}});
    ASSERT_TRUE(write.ok()) << write.status();
    // Sizes 0 .. kMaxNotifyBytes, the bound itself every 50 rounds.
    std::string m(i % 50 == 49 ? TransferEngine::kMaxNotifyBytes : static_cast<size_t>(i * 17), 'a' + i % 26);
    m.replace(0, std::min<size_t>(m.size(), 8), std::to_string(i).substr(0, m.size()));
    messages.push_back(m);
    auto id = b.engine->NotifyAsync(ra, 1000 + i, m);
    ASSERT_TRUE(id.ok()) << id.status();
    // The receiver looks at the data as each notification arrives.
    for (Notification& n : a.engine->PollNotifications()) {
      ASSERT_TRUE(n.has_message);
      int round = static_cast<int>(n.value) - 1000;
      ASSERT_EQ(round, checked) << "out of order";
      EXPECT_EQ(n.message, messages[round]);
      EXPECT_EQ(n.export_id, a.region.export_id);
      EXPECT_NE(n.from_session, 0u);
      // A later round may have overwritten it already; never an earlier one.
      EXPECT_GE(dst[0], round & 0xff) << "notification " << round << " arrived before its data";
      ++checked;
    }
    ASSERT_TRUE(b.engine->Wait(*id).ok());
    ASSERT_TRUE(b.engine->Wait(*write).ok());  // done before the notification was (and src is rewritten next)
  }
  for (Notification& n : Receive(a, kRounds - checked)) {
    ASSERT_EQ(static_cast<int>(n.value) - 1000, checked);
    EXPECT_EQ(n.message, messages[checked]);
    ++checked;
  }
  EXPECT_EQ(checked, kRounds);
  EXPECT_EQ(dst[kSize - 1], (kRounds - 1) & 0xff);
  // A value alone still arrives as one, beside messages.
  ASSERT_TRUE(b.engine->Notify(ra, 77).ok());
  auto v = Receive(a, 1);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_FALSE(v[0].has_message);
  EXPECT_EQ(v[0].value, 77u);
}

TEST_P(Messages, OverTheBoundIsRefusedAndNothingArrives) {
  Peer a = MakePeer(daemon_, 4096, GetParam());
  Peer b = MakePeer(daemon_, 4096, GetParam());
  RemoteRegion ra = Open(b, a);
  absl::Status st = b.engine->Notify(ra, 1, std::string(TransferEngine::kMaxNotifyBytes + 1, 'x'));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("4096"), std::string::npos) << st;
  ASSERT_TRUE(b.engine->Notify(ra, 2, "after").ok());
  auto got = Receive(a, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].value, 2u);
  EXPECT_EQ(got[0].message, "after");
}

TEST_P(Messages, ManyInFlightReuseTheRingsSlots) {
  // More notifications in flight than the ring has message slots (64): each
  // waits for a slot to come back, none is lost or mixed up.
  Peer a = MakePeer(daemon_, 4096, GetParam());
  Peer b = MakePeer(daemon_, 4096, GetParam());
  RemoteRegion ra = Open(b, a);
  std::vector<uint64_t> ids;
  size_t received = 0;
  for (int i = 0; i < 300; ++i) {
    auto id = b.engine->NotifyAsync(ra, i, std::string(3000, static_cast<char>('A' + i % 26)));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
    // The receiver keeps its queue from filling (the relay refuses beyond it).
    for (Notification& n : a.engine->PollNotifications()) {
      EXPECT_EQ(n.value, received);
      EXPECT_EQ(n.message, std::string(3000, static_cast<char>('A' + received % 26)));
      ++received;
    }
    if (ids.size() > 100) {
      ASSERT_TRUE(b.engine->Wait(ids.front()).ok());
      ids.erase(ids.begin());
    }
  }
  for (uint64_t id : ids) ASSERT_TRUE(b.engine->Wait(id).ok());
  auto rest = Receive(a, 300 - received);
  for (Notification& n : rest) EXPECT_EQ(n.value, received++);
  EXPECT_EQ(received, 300u);
}

INSTANTIATE_TEST_SUITE_P(Transports, Messages, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Relay" : "HostMemcpy"; });

// RegisterHost: host memory by address inside a memfd mapping, at an offset.
TEST(RegisterHost, ARangeInsideAMemfdMovesAtItsOffset) {
  Daemon d("{}");
  Peer a = MakePeer(d, 1 << 20, true);
  Peer b = MakePeer(d, 1 << 20, true);
  // b's own sealed memfd, mapped by b, a range 8 KiB + 100 bytes into it.
  int fd = ::memfd_create("app-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  constexpr size_t kFile = 1 << 20;
  ASSERT_EQ(::posix_fallocate(fd, 0, kFile), 0);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  auto* map = static_cast<uint8_t*>(::mmap(nullptr, kFile, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(map, MAP_FAILED);
  uint8_t* range = map + 8192 + 100;
  constexpr size_t kLen = 50000;
  for (size_t i = 0; i < kLen; ++i) range[i] = static_cast<uint8_t>(i * 7 + 3);
  auto h = b.engine->RegisterHost(range, kLen);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->offset, 8192u + 100u);
  RemoteRegion ra = Open(b, a);
  ASSERT_TRUE(b.engine->Write({&h->region, h->offset, &ra, 10, kLen}).ok());
  auto* dst = static_cast<uint8_t*>(a.buf->data());
  for (size_t i = 0; i < kLen; ++i) ASSERT_EQ(dst[10 + i], static_cast<uint8_t>(i * 7 + 3)) << i;
  // Read into it, at an offset inside the range.
  std::memset(dst, 0x5a, 1000);
  ASSERT_TRUE(b.engine->Read({&h->region, h->offset + 20, &ra, 0, 1000}).ok());
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(range[20 + i], 0x5a) << i;
  // Before the range is refused (the engine holds only what was registered from there on).
  EXPECT_EQ(b.engine->Write({&h->region, h->offset - 1, &ra, 0, 10}).code(), absl::StatusCode::kOutOfRange);
  // A peer can open it too: it is an export of its own.
  auto desc = b.engine->Describe(h->region);
  ASSERT_TRUE(desc.ok());
  EXPECT_EQ(desc->size, h->offset + kLen);
  EXPECT_TRUE(b.engine->Unregister(h->region).ok());
  ::munmap(map, kFile);
  ::close(fd);
}

// Memory as the application has it (a std::vector on the heap): podlinkd's
// relay reads and writes it in place; a peer's memfd is still mapped.
TEST(RegisterHost, OrdinaryMemoryMovesInPlace) {
  Daemon d("{}");
  for (bool force_relay : {true, false}) {
    SCOPED_TRACE(force_relay ? "relay" : "host mapping of the peer's memfd");
    Peer a = MakePeer(d, 4 << 20, force_relay);
    Peer b = MakePeer(d, 4096, force_relay);
    std::vector<uint8_t> heap((4 << 20) + 7);
    for (size_t i = 0; i < heap.size(); ++i) heap[i] = static_cast<uint8_t>(i * 13 + 1);
    auto h = b.engine->RegisterHost(heap.data() + 7, heap.size() - 7);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->offset, 0u);
    RemoteRegion ra = Open(b, a);
    auto* dst = static_cast<uint8_t*>(a.buf->data());
    for (size_t n : {size_t{1}, size_t{4096}, size_t{65537}, size_t{4} << 20}) {
      ASSERT_TRUE(b.engine->Write({&h->region, 0, &ra, 0, n}).ok()) << n;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(dst[i], static_cast<uint8_t>((i + 7) * 13 + 1)) << n << " " << i;
    }
    std::memset(dst, 0x5a, 1 << 20);
    ASSERT_TRUE(b.engine->Read({&h->region, 100, &ra, 0, 1 << 20}).ok());
    for (size_t i = 0; i < (1u << 20); ++i) ASSERT_EQ(heap[7 + 100 + i], 0x5a) << i;
    // A peer opens the heap range itself: only the relay reaches it.
    Peer c = MakePeer(d, 1 << 20, force_relay);
    auto desc = b.engine->Describe(h->region);
    ASSERT_TRUE(desc.ok());
    EXPECT_EQ(desc->handle_type, HandleType::kProcessMemory);
    auto rh = c.engine->Open(*RegionDescriptor::Parse(desc->Serialize()));
    ASSERT_TRUE(rh.ok()) << rh.status();
    EXPECT_EQ(rh->transport, Transport::kRelay);
    std::memset(c.buf->data(), 0x33, 1 << 20);
    ASSERT_TRUE(c.engine->Write({&c.region, 0, &*rh, 5, 1 << 20}).ok());
    for (size_t i = 0; i < (1u << 20); ++i) ASSERT_EQ(heap[7 + 5 + i], 0x33) << i;
    // Two process-memory regions (through the relay's bounce buffer).
    std::vector<uint8_t> other(1 << 20, 0x71);
    auto ho = c.engine->RegisterHost(other.data(), other.size());
    ASSERT_TRUE(ho.ok()) << ho.status();
    ASSERT_TRUE(c.engine->Read({&ho->region, 0, &*rh, 0, other.size()}).ok());
    EXPECT_EQ(std::memcmp(other.data(), heap.data() + 7, other.size()), 0);
    EXPECT_TRUE(b.engine->Unregister(h->region).ok());
  }
  // Still refused: a range running past its memfd mapping, and an empty one.
  Peer b = MakePeer(d, 4096, true);
  auto past = b.engine->RegisterHost(b.buf->data(), b.buf->size() + 4096);
  EXPECT_FALSE(past.ok());
  EXPECT_EQ(b.engine->RegisterHost(b.buf->data(), 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace podlink::testing
