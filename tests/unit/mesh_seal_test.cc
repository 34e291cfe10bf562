// Sealed routes (daemon/mesh/seal/): the importer's SealedLinks and the
// owner's SealedRegion with a relay between them that may read, alter, drop,
// replay or make up anything it forwards. No engine, sockets or daemon.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "daemon/mesh/importer/task_thread.h"
#include "daemon/mesh/seal/seal_crypto.h"
#include "daemon/mesh/seal/window.h"

namespace podlink::mesh::seal {
namespace {

// The owner's export, in memory.
class FakeExport : public Lander {
 public:
  explicit FakeExport(uint64_t size) : bytes(size, '\0') {}
  absl::Status CopyIn(uint64_t offset, const char* src, uint64_t n) override {
    std::lock_guard<std::mutex> l(mu);
    if (offset > bytes.size() || n > bytes.size() - offset) return absl::OutOfRangeError("range");
    std::memcpy(bytes.data() + offset, src, n);
    ++copies_in;
    return absl::OkStatus();
  }
  absl::Status CopyOut(uint64_t offset, char* dst, uint64_t n) override {
    std::lock_guard<std::mutex> l(mu);
    if (offset > bytes.size() || n > bytes.size() - offset) return absl::OutOfRangeError("range");
    if (fail_out) {
      std::memcpy(dst, bytes.data() + offset, n / 2);  // as a GPU copy failing half-way
      return absl::InternalError("the copy failed half-way");
    }
    std::memcpy(dst, bytes.data() + offset, n);
    return absl::OkStatus();
  }
  bool fail_out = false;
  absl::Status Notify(uint64_t value) override {
    std::lock_guard<std::mutex> l(mu);
    notified.push_back(value);
    return absl::OkStatus();
  }
  std::mutex mu;
  std::string bytes;
  std::vector<uint64_t> notified;
  int copies_in = 0;
};

// A frame as the relay sees it: what it forwards, and where.
struct Frame {
  FrameType type;
  uint64_t offset;
  std::string bytes;  // WRITE: the payload; READ: the owner's answer
};

// The relay: forwards every frame of the importer's grant to the owner's
// window on its own thread, and may do what it likes on the way.
class Relay : public DataLinks {
 public:
  Relay(SealedRegion* owner, Lander* lander) : owner_(owner), lander_(lander) { thread_.Start(); }
  const char* transport() const override { return "relay"; }
  uint64_t instance() const override { return 1; }
  size_t live() const override { return 1; }
  LinkStats Stats() const override { return {}; }
  std::vector<std::tuple<std::string, bool, uint64_t>> Connections() const override { return {}; }
  absl::Status Submit(LinkOp op) override {
    thread_.Post([this, op = std::move(op)]() mutable { Forward(std::move(op)); });
    return absl::OkStatus();
  }
  // What the relay does to a frame before it goes on (WRITE) or after the
  // owner answered (READ); a status to answer instead; nullopt: as it is.
  std::function<std::optional<absl::Status>(Frame&)> tamper;
  std::vector<Frame> seen;  // every frame, as the owner sent or received it
  std::mutex mu;

 private:
  void Forward(LinkOp op) {
    Frame f{op.type, op.offset, {}};
    absl::Status st;
    if (op.type == FrameType::kWrite) {
      f.bytes.assign(op.local, op.length);
      std::optional<absl::Status> instead = tamper ? tamper(f) : std::nullopt;
      st = instead.has_value() ? *instead : owner_->Write(f.offset, f.bytes.data(), f.bytes.size());
    } else {
      f.bytes.assign(op.length, '\0');
      st = owner_->Read(op.offset, f.bytes.data(), f.bytes.size(), *lander_);
      if (std::optional<absl::Status> instead = tamper ? tamper(f) : std::nullopt; instead.has_value()) st = *instead;
      if (st.ok()) std::memcpy(op.local, f.bytes.data(), op.length);
    }
    {
      std::lock_guard<std::mutex> l(mu);
      seen.push_back(f);
    }
    op.done(st);
  }
  SealedRegion* owner_;
  Lander* lander_;
  TaskThread thread_;  // a link's own thread
};

SealKeys TestKeys() {
  auto a = EphemeralKey::Generate();
  auto b = EphemeralKey::Generate();
  EXPECT_TRUE(a.ok() && b.ok());
  auto shared = a->Agree(b->public_key());
  EXPECT_TRUE(shared.ok()) << shared.status();
  auto keys = DeriveSealKeys(*shared, 42, "node-a", "node-b", a->public_key(), b->public_key());
  EXPECT_TRUE(keys.ok()) << keys.status();
  return *keys;
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

// The carrier as the engine hands it out: the link set is not the sealed
// route's to keep (a relay thread must never drop its own last reference).
std::shared_ptr<DataLinks> Unowned(DataLinks* links) { return std::shared_ptr<DataLinks>(std::shared_ptr<void>(), links); }

class Sealed : public ::testing::Test {
 protected:
  static constexpr uint64_t kExport = 4 << 20;
  Sealed()
      : keys_(TestKeys()),
        export_(kExport),
        budget_(NodeShares::Rules{1ull << 30, 1ull << 29, true, false}),
        owner_(std::make_unique<SealedRegion>(keys_, kExport, "node-a", &budget_, &counters_)),
        relay_(std::make_shared<Relay>(owner_.get(), &export_)),
        importer_(std::make_shared<SealedLinks>(
            keys_, 7, kExport, [r = relay_.get()] { return Unowned(r); },
            [this](std::function<void()> f) { return pump_.Post(std::move(f)); })) {
    pump_.Start();
  }

  absl::Status Op(FrameType type, uint64_t offset, char* local, uint64_t length) {
    auto done = std::make_shared<std::promise<absl::Status>>();
    auto got = done->get_future();
    LinkOp op;
    op.type = type;
    op.offset = offset;
    op.local = local;
    op.length = length;
    op.done = [done](const absl::Status& st) { done->set_value(st); };
    if (absl::Status st = importer_->Submit(std::move(op)); !st.ok()) return st;
    if (got.wait_for(std::chrono::seconds(20)) != std::future_status::ready) return absl::DeadlineExceededError("hung");
    return got.get();
  }
  absl::Status Write(uint64_t offset, std::string bytes) {
    return Op(FrameType::kWrite, offset, bytes.data(), bytes.size());
  }
  absl::Status Read(uint64_t offset, std::string* out) { return Op(FrameType::kRead, offset, out->data(), out->size()); }

  SealKeys keys_;
  FakeExport export_;
  NodeShares budget_;
  SealCounters counters_;
  std::unique_ptr<SealedRegion> owner_;
  std::shared_ptr<Relay> relay_;
  TaskThread pump_;  // the engine's pump (MeshEngine::two_hop_thread_)
  std::shared_ptr<SealedLinks> importer_;
};

TEST(SealKeysTest, BothEndsDeriveTheSameKeysAndSmallOrderPointsAreRefused) {
  auto a = EphemeralKey::Generate();
  auto b = EphemeralKey::Generate();
  ASSERT_TRUE(a.ok() && b.ok());
  auto ab = a->Agree(b->public_key());
  auto ba = b->Agree(a->public_key());
  ASSERT_TRUE(ab.ok() && ba.ok());
  EXPECT_EQ(*ab, *ba);
  auto k1 = DeriveSealKeys(*ab, 1, "node-a", "node-b", a->public_key(), b->public_key());
  auto k2 = DeriveSealKeys(*ba, 1, "node-a", "node-b", a->public_key(), b->public_key());
  auto k3 = DeriveSealKeys(*ab, 2, "node-a", "node-b", a->public_key(), b->public_key());
  ASSERT_TRUE(k1.ok() && k2.ok() && k3.ok());
  EXPECT_EQ(k1->to_owner, k2->to_owner);
  EXPECT_EQ(k1->to_importer, k2->to_importer);
  EXPECT_NE(k1->to_owner, k1->to_importer);
  EXPECT_NE(k1->to_owner, k3->to_owner) << "another claim, the same keys";
  // A relay swapping in a point of small order (here: zero) cannot force a
  // known secret; a key of the wrong length is refused.
  EXPECT_EQ(a->Agree(std::string(32, '\0')).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(a->Agree("short").status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(Sealed, WritesReadsAndNotificationsArriveWhileTheRelaySeesNoPlaintext) {
  const std::string data = Pattern(3 * kSlotDataBytes + 12345, 1);
  ASSERT_TRUE(Write(4096, data).ok());
  EXPECT_EQ(export_.bytes.substr(4096, data.size()), data);
  std::string back(data.size(), '\0');
  ASSERT_TRUE(Read(4096, &back).ok());
  EXPECT_EQ(back, data);
  ASSERT_TRUE(Op(FrameType::kNotify, 77, nullptr, 0).ok());
  EXPECT_EQ(export_.notified, std::vector<uint64_t>{77});
  // Nothing the relay forwarded holds 64 plaintext bytes in a row.
  std::lock_guard<std::mutex> l(relay_->mu);
  ASSERT_FALSE(relay_->seen.empty());
  for (const Frame& f : relay_->seen) {
    for (size_t at = 0; at + 64 <= data.size(); at += 40000) {
      EXPECT_EQ(f.bytes.find(data.substr(at, 64)), std::string::npos) << "plaintext at " << at << " crossed the relay";
    }
  }
  EXPECT_EQ(importer_->pending(), 0u);
  EXPECT_GT(counters_.units.load(), 0u);
}

// What the relay may read of the window with its grant, after a write, a
// read, and a read whose copy out of the export failed: no plaintext (the
// owner decrypted writes in the window itself and left them there before).
TEST_F(Sealed, TheWindowNeverHoldsPlaintextARelayCouldRead) {
  const std::string data = Pattern(kSlotDataBytes, 21);
  ASSERT_TRUE(Write(0, data).ok());
  std::string back(data.size(), '\0');
  ASSERT_TRUE(Read(0, &back).ok());
  ASSERT_EQ(back, data);
  // A read whose copy out of the export fails half-way.
  export_.fail_out = true;
  std::string failed(data.size(), '\0');
  EXPECT_EQ(Read(0, &failed).code(), absl::StatusCode::kInternal);
  export_.fail_out = false;
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    std::string window(kSlotStride, '\0');
    if (!owner_->Read(slot * kSlotStride, window.data(), window.size(), export_).ok()) continue;
    for (size_t at = 0; at + 64 <= data.size(); at += 4096) {
      ASSERT_EQ(window.find(data.substr(at, 64)), std::string::npos)
          << "plaintext at " << at << " of the write readable in slot " << slot;
    }
  }
}

TEST_F(Sealed, ABytesAlteredInAWriteLandsNothingOfIt) {
  for (size_t at : {size_t{0}, size_t{31}, size_t{40}, size_t{100}, kRequestBytes + 10, kRequestBytes + 70000}) {
    relay_->tamper = [at](Frame& f) -> std::optional<absl::Status> {
      if (f.type == FrameType::kWrite && f.bytes.size() > at) f.bytes[at] ^= 1;
      return std::nullopt;
    };
    const int before = export_.copies_in;
    absl::Status st = Write(0, Pattern(200000, 2));
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << "byte " << at << ": " << st;
    EXPECT_EQ(export_.copies_in, before) << "byte " << at;
    EXPECT_EQ(export_.bytes, std::string(kExport, '\0')) << "byte " << at;
  }
  relay_->tamper = nullptr;
  EXPECT_TRUE(Write(0, Pattern(1000, 3)).ok()) << "the route works again once the relay behaves";
}

TEST_F(Sealed, AReadTheRelayAltersOrAnswersItselfHandsTheImporterNothing) {
  ASSERT_TRUE(Write(0, Pattern(300000, 4)).ok());
  struct Case {
    const char* what;
    std::function<std::optional<absl::Status>(Frame&)> tamper;
  };
  const Case cases[] = {
      {"a data byte flipped",
       [](Frame& f) -> std::optional<absl::Status> {
         if (f.type == FrameType::kRead && f.bytes.size() > kDataAt + 5000) f.bytes[kDataAt + 5000] ^= 0x80;
         return std::nullopt;
       }},
      {"a tag flipped",
       [](Frame& f) -> std::optional<absl::Status> {
         if (f.type == FrameType::kRead) f.bytes[50] ^= 1;
         return std::nullopt;
       }},
      {"the status flipped",
       [](Frame& f) -> std::optional<absl::Status> {
         if (f.type == FrameType::kRead) f.bytes[4] ^= 1;
         return std::nullopt;
       }},
      {"answered with the relay's own bytes",
       [](Frame& f) -> std::optional<absl::Status> {
         if (f.type == FrameType::kRead) f.bytes = std::string(f.bytes.size(), 'x');
         return std::nullopt;
       }},
  };
  for (const Case& c : cases) {
    relay_->tamper = c.tamper;
    std::string back(300000, '\x55');
    absl::Status st = Read(0, &back);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << c.what << ": " << st;
    EXPECT_EQ(back, std::string(300000, '\x55')) << c.what << ": unverified bytes reached the caller";
  }
}

TEST_F(Sealed, ARelayCannotSayAWriteLandedThatItDropped) {
  // Genuine receipts, kept by the relay as they passed.
  ASSERT_TRUE(Write(0, Pattern(1000, 5)).ok());
  std::vector<std::string> receipts;
  {
    std::lock_guard<std::mutex> l(relay_->mu);
    for (const Frame& f : relay_->seen) {
      if (f.type == FrameType::kRead) receipts.push_back(f.bytes.substr(0, kReceiptBytes));
    }
  }
  ASSERT_FALSE(receipts.empty());
  // It drops the next write and answers its receipt with the old one (or an OK ack of its own).
  relay_->tamper = [&](Frame& f) -> std::optional<absl::Status> {
    if (f.type == FrameType::kWrite) return absl::OkStatus();  // "landed"
    f.bytes.replace(0, kReceiptBytes, receipts.front());
    return absl::OkStatus();  // answered by the relay, whatever the owner said
  };
  const std::string before = export_.bytes;
  absl::Status st = Write(0, Pattern(1000, 6));
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_EQ(export_.bytes, before);
}

TEST_F(Sealed, ReplayedRequestsNeverLandTwice) {
  const std::string a = Pattern(5000, 7), b = Pattern(5000, 8);
  ASSERT_TRUE(Write(0, a).ok());
  Frame first;
  {
    std::lock_guard<std::mutex> l(relay_->mu);
    first = relay_->seen.front();  // the request and ciphertext of a's write
  }
  ASSERT_EQ(first.type, FrameType::kWrite);
  ASSERT_TRUE(Write(0, b).ok());
  ASSERT_EQ(export_.bytes.substr(0, b.size()), b);
  // The relay writes a's unit into its slot again, and into every other slot, and asks for receipts.
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    const uint64_t at = slot * kSlotStride + kReceiptBytes;
    ASSERT_TRUE(owner_->Write(at, first.bytes.data(), first.bytes.size()).ok());
    std::string r(kReceiptBytes, '\0');
    (void)owner_->Read(slot * kSlotStride, r.data(), r.size(), export_);
  }
  EXPECT_EQ(export_.bytes.substr(0, b.size()), b) << "a replayed write landed";
  EXPECT_GT(counters_.refused.load(), 0u);
  // The route goes on (the importer's numbers are past the replayed one).
  ASSERT_TRUE(Write(0, a).ok());
  EXPECT_EQ(export_.bytes.substr(0, a.size()), a);
}

TEST_F(Sealed, ManyUnitsInFlightOnTwoRelayThreadsAllLand) {
  // A second relay thread: frames of different slots overtake each other.
  auto other = std::make_shared<Relay>(owner_.get(), &export_);
  std::atomic<int> turn{0};
  auto importer = std::make_shared<SealedLinks>(
      keys_, 7, kExport,
      [this, other = other.get(), &turn]() -> std::shared_ptr<DataLinks> {
        return Unowned(turn.fetch_add(1) % 2 == 0 ? static_cast<DataLinks*>(relay_.get()) : other);
      },
      [this](std::function<void()> f) { return pump_.Post(std::move(f)); });
  std::vector<std::future<absl::Status>> ops;
  std::vector<std::string> blocks;
  for (int i = 0; i < 24; ++i) blocks.push_back(Pattern(150000, 100 + i));
  for (int i = 0; i < 24; ++i) {
    auto done = std::make_shared<std::promise<absl::Status>>();
    ops.push_back(done->get_future());
    LinkOp op;
    op.type = FrameType::kWrite;
    op.offset = uint64_t(i) * 150000;
    op.local = blocks[i].data();
    op.length = blocks[i].size();
    op.done = [done](const absl::Status& st) { done->set_value(st); };
    ASSERT_TRUE(importer->Submit(std::move(op)).ok());
  }
  for (auto& f : ops) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_TRUE(f.get().ok());
  }
  for (int i = 0; i < 24; ++i) EXPECT_EQ(export_.bytes.substr(i * 150000, 150000), blocks[i]) << i;
}

TEST_F(Sealed, TheOwnerRefusesRangesOutsideTheWindowOrTheExport) {
  char b[16] = {};
  EXPECT_EQ(owner_->Write(0, b, 16).code(), absl::StatusCode::kPermissionDenied) << "the receipt is the owner's";
  EXPECT_EQ(owner_->Write(kWindowBytes, b, 16).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(owner_->Write(kSlotStride - 8, b, 16).code(), absl::StatusCode::kOutOfRange) << "across two slots";
  EXPECT_EQ(owner_->Read(2 * kSlotStride, b, 16, export_).code(), absl::StatusCode::kFailedPrecondition);
  std::string big(16, '\0');
  EXPECT_EQ(Write(kExport - 8, big).code(), absl::StatusCode::kOutOfRange);
}

TEST(NodeSharesTest, TwoNodesTakingAllTheyMayLeaveRoomForAThird) {
  NodeShares budget(NodeShares::Rules{64, 32, /*last_quarter_for_small=*/true, /*one_oversized=*/false});
  EXPECT_TRUE(budget.TryTake("node-a", 32));
  EXPECT_FALSE(budget.TryTake("node-a", 1)) << "over half for one node";
  EXPECT_TRUE(budget.TryTake("node-b", 16));
  EXPECT_FALSE(budget.TryTake("node-b", 8)) << "into the last quarter while holding an eighth";
  EXPECT_TRUE(budget.TryTake("node-c", 8)) << "the last quarter is for nodes holding little";
  EXPECT_TRUE(budget.TryTake("node-d", 8));
  EXPECT_FALSE(budget.TryTake("node-e", 1)) << "over the cap";
  budget.Give("node-a", 32);
  EXPECT_EQ(budget.used(), 32u);
  EXPECT_TRUE(budget.TryTake("node-e", 8));
}

// The relay's staging: one node at most its share, a request over the cap
// only alone, and a wait for room that ends when room comes or the daemon stops.
TEST(NodeSharesTest, TheRelaysStagingWaitsForRoomAndStopsWaitingWhenStopped) {
  NodeShares staging(NodeShares::Rules{100, 50, /*last_quarter_for_small=*/false, /*one_oversized=*/true});
  EXPECT_TRUE(staging.TryTake("node-a", 50));
  EXPECT_FALSE(staging.TryTake("node-a", 1));
  EXPECT_TRUE(staging.TryTake("node-b", 50));
  EXPECT_FALSE(staging.Take("node-c", 10, absl::Milliseconds(10))) << "no room, and none came";
  std::thread giver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    staging.Give("node-a", 50);
  });
  EXPECT_TRUE(staging.Take("node-c", 10, absl::Seconds(20))) << "room came";
  giver.join();
  staging.Give("node-b", 50);
  staging.Give("node-c", 10);
  NodeShares big(NodeShares::Rules{100, 200, false, true});
  EXPECT_TRUE(big.TryTake("node-a", 150)) << "one request over the cap, alone";
  EXPECT_FALSE(big.TryTake("node-b", 1));
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    big.Stop();
  });
  EXPECT_FALSE(big.Take("node-b", 1, absl::Seconds(20))) << "a stopped daemon's wait ends";
  stopper.join();
  EXPECT_FALSE(big.TryTake("node-c", 0)) << "nothing is taken once stopped";
}

TEST(SealBudget, ASlotsMemoryIsBoundedPerNodeAndGivenBack) {
  SealKeys keys = TestKeys();
  NodeShares budget(NodeShares::Rules{8 * kSlotStride, 4 * kSlotStride, true, false});  // four slots for one node
  SealCounters counters;
  char b[16] = {};
  {
    SealedRegion r(keys, 1 << 20, "node-a", &budget, &counters);
    for (uint64_t slot = 0; slot < 4; ++slot) EXPECT_TRUE(r.Write(slot * kSlotStride + kReceiptBytes, b, 16).ok());
    EXPECT_EQ(r.Write(4 * kSlotStride + kReceiptBytes, b, 16).code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(r.Write(2 * kSlotStride + kReceiptBytes + 100, b, 16).ok()) << "a slot it has costs nothing more";
    SealedRegion other(keys, 1 << 20, "node-c", &budget, &counters);
    EXPECT_TRUE(other.Write(kReceiptBytes, b, 16).ok()) << "one node's windows leave room for another's";
    EXPECT_EQ(budget.used(), 5 * kSlotStride);
  }
  EXPECT_EQ(budget.used(), 0u);
}

}  // namespace
}  // namespace podlink::mesh::seal
