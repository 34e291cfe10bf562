// The importer's transfers (daemon/mesh/importer/transfer.h) without an engine, gRPC or a peer daemon: what a
// transfer on a remote handle is checked for before anything is submitted, a write and a notification handed whole
// to the handle's peer's links, and two-hop striping when the relay's route fails: a read finishes on the direct
// links, and a write's chunk that the relay's route held is never sent again unless the owner fenced the route.
// The links are fakes that complete each operation on a thread of their own.
#include "daemon/mesh/importer/transfer.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace podlink::mesh {
namespace {

// Links that complete every operation on their own thread with `result`, and record what they were given.
class FakeLinks final : public DataLinks {
 public:
  explicit FakeLinks(size_t live = 1) : live_(live) { completer_.Start(); }
  ~FakeLinks() override { completer_.Stop(); }
  const char* transport() const override { return "fake"; }
  uint64_t instance() const override { return 1; }
  absl::Status Submit(LinkOp op) override {
    if (live_ == 0) return absl::UnavailableError("nothing is up");
    {
      absl::MutexLock l(&mu_);
      ops_.push_back(Seen{op.type, op.grant, op.offset, op.length});
    }
    auto done = std::move(op.done);
    EXPECT_TRUE(completer_.Post([done] { done(absl::OkStatus()); }));
    return absl::OkStatus();
  }
  size_t live() const override { return live_; }
  LinkStats Stats() const override { return {}; }
  std::vector<std::tuple<std::string, bool, uint64_t>> Connections() const override { return {}; }

  struct Seen {
    FrameType type;
    uint64_t grant, offset, length;
  };
  std::vector<Seen> ops() const {
    absl::MutexLock l(&mu_);
    return ops_;
  }

 private:
  const size_t live_;
  TaskThread completer_;
  mutable absl::Mutex mu_;
  std::vector<Seen> ops_ ABSL_GUARDED_BY(mu_);
};

class NoHost final : public MeshHost {
 public:
  absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(
      const PodInfo&, const podlink::mesh::v1::OpenRegionRequest&) override {
    return absl::PermissionDeniedError("not here");
  }
  bool ExportLive(const ExportRecord&) const override { return true; }
  absl::Status NotifyOwner(const ExportRecord&, uint64_t) override { return absl::OkStatus(); }
};

constexpr uint64_t kSession = 7;
constexpr uint64_t kRegion = 64 << 20;

class RemoteTransfersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    direct_->instance.store(11);
    direct_->set_links(direct_links_);
    Handle h;
    h.session = kSession;
    h.peer = direct_;
    h.grant = 500;
    h.size = kRegion;
    h.instance = 11;
    h.destination = "node-b";
    absl::StatusOr<uint64_t> id = handles_.Add(std::move(h));
    ASSERT_TRUE(id.ok()) << id.status();
    handle_ = *id;
    transfers_.StartTwoHopThread();
  }
  void TearDown() override {
    transfers_.StopTwoHopThread();
    direct_->Stop();
    if (relay_ != nullptr) relay_->Stop();
  }
  // A second route through a relay whose links are up but that carries nothing (no sealed links for it).
  void JoinBrokenTwoHop() {
    relay_ = std::make_shared<Peer>("relay", /*tcp=*/true);
    relay_->instance.store(22);
    relay_->set_links(std::make_shared<FakeLinks>());
    auto route = std::make_shared<TwoHop>();
    route->peer = relay_;
    route->grant = 900;
    route->instance = 22;
    route->nonce = 0x5eed;
    ASSERT_TRUE(handles_.AttachTwoHop(kSession, handle_, route));
  }
  MeshTransfer Write(uint64_t offset, uint64_t length) {
    MeshTransfer t;
    t.write = true;
    t.session = kSession;
    t.handle = handle_;
    t.remote_offset = offset;
    t.length = length;
    buf_.resize(length);
    t.local = buf_.data();
    return t;
  }
  // Runs one transfer to its end (at most 10 s).
  absl::Status Run(MeshTransfer t) {
    absl::Notification finished;
    absl::Status result;
    absl::Status submitted = transfers_.Transfer(std::move(t), [&](const absl::Status& st) {
      result = st;
      finished.Notify();
    });
    if (!submitted.ok()) return submitted;
    if (!finished.WaitForNotificationWithTimeout(absl::Seconds(10))) return absl::DeadlineExceededError("never ended");
    return result;
  }

  NoHost host_;
  HandleTable handles_{16};
  RemoteTransfers transfers_{RemoteTransfers::Options{}, &host_, &handles_};
  std::shared_ptr<FakeLinks> direct_links_ = std::make_shared<FakeLinks>();
  std::shared_ptr<Peer> direct_ = std::make_shared<Peer>("node-b", /*tcp=*/true);
  std::shared_ptr<Peer> relay_;
  uint64_t handle_ = 0;
  std::vector<char> buf_;
};

TEST_F(RemoteTransfersTest, ChecksTheHandleBeforeAnythingIsSubmitted) {
  MeshTransfer other = Write(0, 4096);
  other.session = kSession + 1;  // not this session's handle
  EXPECT_EQ(Run(other).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Run(Write(0, 0)).code(), absl::StatusCode::kInvalidArgument);
  absl::Status past = Run(Write(kRegion - 4096, 8192));
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;
  EXPECT_EQ(Run(Write(~uint64_t{0} - 10, 4096)).code(), absl::StatusCode::kOutOfRange);  // an offset that wraps
  direct_->instance.store(12);  // the owner's daemon restarted
  absl::Status restarted = Run(Write(0, 4096));
  EXPECT_EQ(restarted.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(restarted.message(), "restarted")) << restarted;
  direct_->instance.store(11);
  direct_->set_links(std::make_shared<FakeLinks>(/*live=*/0));
  EXPECT_EQ(Run(Write(0, 4096)).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(direct_links_->ops().empty());
  transfers_.BeginStop();
  absl::Status stopping = Run(other);
  EXPECT_EQ(stopping.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(stopping.message(), "stopping")) << stopping;
}

TEST_F(RemoteTransfersTest, AWriteAndANotificationGoWholeToThePeersLinks) {
  ASSERT_TRUE(Run(Write(4096, 1 << 20)).ok());
  absl::Notification notified;
  ASSERT_TRUE(transfers_.Notify(kSession, handle_, 42, [&](const absl::Status& st) {
    EXPECT_TRUE(st.ok());
    notified.Notify();
  }).ok());
  ASSERT_TRUE(notified.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::vector<FakeLinks::Seen> ops = direct_links_->ops();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].type, FrameType::kWrite);
  EXPECT_EQ(ops[0].grant, 500u);
  EXPECT_EQ(ops[0].offset, 4096u);
  EXPECT_EQ(ops[0].length, 1u << 20);
  EXPECT_EQ(ops[1].type, FrameType::kNotify);
  EXPECT_EQ(ops[1].offset, 42u);
  EXPECT_EQ(transfers_.counters().two_hop_transfers.load(), 0u);  // no second route: not striped
}

TEST_F(RemoteTransfersTest, AStripedReadFinishesOnTheDirectLinksWhenTheRelaysRouteFails) {
  JoinBrokenTwoHop();
  MeshTransfer t = Write(0, 4 * kTwoHopChunk);
  t.write = false;
  ASSERT_TRUE(Run(t).ok());
  std::set<uint64_t> offsets;
  for (const FakeLinks::Seen& op : direct_links_->ops()) {
    EXPECT_EQ(op.type, FrameType::kRead);
    EXPECT_EQ(op.length, kTwoHopChunk);
    offsets.insert(op.offset);
  }
  EXPECT_EQ(offsets, (std::set<uint64_t>{0, kTwoHopChunk, 2 * kTwoHopChunk, 3 * kTwoHopChunk}));
  EXPECT_EQ(transfers_.counters().two_hop_transfers.load(), 1u);
  EXPECT_EQ(transfers_.counters().two_hop_failovers.load(), 1u);
  EXPECT_EQ(transfers_.counters().two_hop_fences.load(), 0u);  // a read needs no fence
}

TEST_F(RemoteTransfersTest, AStripedWritesChunkIsNeverSentAgainUnfenced) {
  JoinBrokenTwoHop();
  // The relay's route took one chunk and failed it; the owner cannot be asked to fence (no control channel here),
  // so that chunk must not go again on the direct links: the write fails instead.
  absl::Status st = Run(Write(0, 4 * kTwoHopChunk));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "could not fence it")) << st;
  std::vector<FakeLinks::Seen> ops = direct_links_->ops();
  std::set<uint64_t> offsets;
  for (const FakeLinks::Seen& op : ops) offsets.insert(op.offset);
  EXPECT_EQ(offsets.size(), ops.size()) << "a chunk went twice on the direct links";
  EXPECT_TRUE(offsets.contains(0)) << "the direct links took the first chunk";
  // Which chunk the relay's route took depends on how the pump's threads ran; that it took one does not (it is
  // offered a chunk before the direct links can take a third): so at most three of the four went direct.
  EXPECT_LT(ops.size(), 4u) << "every chunk went on the direct links: the relay's went again without a fence";
}

}  // namespace
}  // namespace podlink::mesh
