// The relay's copy executor over a fake CUDA driver table (no GPU): which
// cuMemcpyAsync calls a round of requests becomes (contiguous requests merge,
// up to the limit), that every request of a merged copy completes, and that a
// copy the driver refuses completes every request in it with the error.
#include "daemon/relay/copy_executor.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <vector>

namespace podlink {
namespace {

struct FakeCopy {
  cu::DevicePtr dst, src;
  size_t length;
  cu::Stream stream;
};

struct Fake {
  std::vector<FakeCopy> copies;
  int streams = 0;
  int events = 0;
  bool refuse_copies = false;
  bool events_pending = false;  // EventQuery says NOT_READY while set
};
Fake* fake = nullptr;

cu::Result CtxSet(cu::Context) { return cu::kSuccess; }
cu::Result StreamCreate(cu::Stream* s, unsigned) {
  *s = reinterpret_cast<cu::Stream>(static_cast<uintptr_t>(0x1000 + ++fake->streams));
  return cu::kSuccess;
}
cu::Result StreamDestroy(cu::Stream) { return cu::kSuccess; }
cu::Result StreamSync(cu::Stream) { return cu::kSuccess; }
cu::Result Memcpy(cu::DevicePtr dst, cu::DevicePtr src, size_t n, cu::Stream s) {
  if (fake->refuse_copies) return cu::kErrorInvalidValue;
  fake->copies.push_back({dst, src, n, s});
  return cu::kSuccess;
}
cu::Result EventCreate(cu::Event* e, unsigned) {
  *e = reinterpret_cast<cu::Event>(static_cast<uintptr_t>(0x2000 + ++fake->events));
  return cu::kSuccess;
}
cu::Result EventRecord(cu::Event, cu::Stream) { return cu::kSuccess; }
cu::Result EventQuery(cu::Event) { return fake->events_pending ? cu::kErrorNotReady : cu::kSuccess; }
cu::Result EventSync(cu::Event) { return cu::kSuccess; }
cu::Result EventDestroy(cu::Event) { return cu::kSuccess; }

class CopyExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake = &state_;
    driver_.CtxSetCurrent = CtxSet;
    driver_.StreamCreate = StreamCreate;
    driver_.StreamDestroy = StreamDestroy;
    driver_.StreamSynchronize = StreamSync;
    driver_.MemcpyAsync = Memcpy;
    driver_.EventCreate = EventCreate;
    driver_.EventRecord = EventRecord;
    driver_.EventQuery = EventQuery;
    driver_.EventSynchronize = EventSync;
    driver_.EventDestroy = EventDestroy;
    src_ = std::make_shared<ExportRecord>();
    dst_ = std::make_shared<ExportRecord>();
  }
  void TearDown() override { fake = nullptr; }

  std::unique_ptr<CopyExecutor> Make(uint64_t max_merge) {
    // One GPU (a non-null context), 2 streams, an event per 1 MiB.
    return std::make_unique<CopyExecutor>(0, &driver_, std::vector<cu::Context>{reinterpret_cast<cu::Context>(1)},
                                          2, 1 << 20, 1 << 20, max_merge);
  }
  CopyRequest Req(uint64_t tag, uint64_t src_off, uint64_t dst_off, uint64_t len) {
    CopyRequest c;
    c.tag = tag;
    c.src = src_;
    c.dst = dst_;
    c.src_view = {true, 0, 0x10000000, 1 << 30};
    c.dst_view = {true, 0, 0x80000000, 1 << 30};
    c.src_off = src_off;
    c.dst_off = dst_off;
    c.length = len;
    return c;
  }

  Fake state_;
  cu::Driver driver_{};
  std::shared_ptr<ExportRecord> src_, dst_;
  std::map<uint64_t, absl::Status> done_;
  std::function<void(uint64_t, const absl::Status&, double)> on_done_ =
      [this](uint64_t tag, const absl::Status& st, double) { done_[tag] = st; };
  // A FunctionRef refers to its callable: hand out the member, never a temporary.
  const std::function<void(uint64_t, const absl::Status&, double)>& Done() { return on_done_; }
};

constexpr uint64_t kMiB = 1 << 20;

TEST_F(CopyExecutorTest, ContiguousRequestsOfARoundMergeIntoOneCopy) {
  auto exec = Make(64 * kMiB);
  CopyQueue q;
  // Two interleaved streams of 2 MiB steps (two NCCL channels): a0 b0 a1 b1 a2.
  ASSERT_TRUE(exec->Submit(q, Req(1, 0, 0, 2 * kMiB)).ok());                        // a0
  ASSERT_TRUE(exec->Submit(q, Req(2, 100 * kMiB, 300 * kMiB, 2 * kMiB)).ok());      // b0
  ASSERT_TRUE(exec->Submit(q, Req(3, 2 * kMiB, 2 * kMiB, 2 * kMiB)).ok());          // a1
  ASSERT_TRUE(exec->Submit(q, Req(4, 102 * kMiB, 302 * kMiB, 2 * kMiB)).ok());      // b1
  ASSERT_TRUE(exec->Submit(q, Req(5, 4 * kMiB, 4 * kMiB, 2 * kMiB)).ok());          // a2
  exec->SealFull(q, Done());
  EXPECT_TRUE(state_.copies.empty()) << "copies are issued when the round is sealed";
  EXPECT_EQ(q.pending(), 5u);
  EXPECT_TRUE(q.HasRunningUpTo(1));
  exec->SealRound(q, Done());
  ASSERT_EQ(state_.copies.size(), 2u);
  EXPECT_EQ(state_.copies[0].src, 0x10000000u);
  EXPECT_EQ(state_.copies[0].dst, 0x80000000u);
  EXPECT_EQ(state_.copies[0].length, 6 * kMiB);
  EXPECT_EQ(state_.copies[1].src, 0x10000000u + 100 * kMiB);
  EXPECT_EQ(state_.copies[1].length, 4 * kMiB);
  EXPECT_EQ(q.gpu_bytes(), 10 * kMiB);
  EXPECT_TRUE(exec->PollGpu(q, Done()));
  EXPECT_EQ(done_.size(), 5u);
  for (auto& [tag, st] : done_) EXPECT_TRUE(st.ok()) << tag;
  EXPECT_EQ(q.pending(), 0u);
  EXPECT_EQ(q.gpu_bytes(), 0u);
  EXPECT_FALSE(q.HasRunningUpTo(5));
}

TEST_F(CopyExecutorTest, OnlyTrueContinuationsMergeAndNeverPastTheLimit) {
  auto exec = Make(4 * kMiB);
  CopyQueue q;
  ASSERT_TRUE(exec->Submit(q, Req(1, 0, 0, 2 * kMiB)).ok());
  ASSERT_TRUE(exec->Submit(q, Req(2, 2 * kMiB, 8 * kMiB, 2 * kMiB)).ok());  // source continues, destination does not
  ASSERT_TRUE(exec->Submit(q, Req(3, 2 * kMiB, 2 * kMiB, 2 * kMiB)).ok());  // continues 1: 4 MiB
  ASSERT_TRUE(exec->Submit(q, Req(4, 4 * kMiB, 4 * kMiB, 2 * kMiB)).ok());  // would make 6 MiB: a copy of its own
  ASSERT_TRUE(exec->Submit(q, Req(5, 1 * kMiB, 1 * kMiB, 1 * kMiB)).ok());  // overlaps 1: a copy of its own
  exec->SealRound(q, Done());
  ASSERT_EQ(state_.copies.size(), 4u);
  EXPECT_EQ(state_.copies[0].length, 4 * kMiB);
  EXPECT_EQ(state_.copies[1].length, 2 * kMiB);
  EXPECT_EQ(state_.copies[1].dst, 0x80000000u + 8 * kMiB);
  EXPECT_EQ(state_.copies[2].length, 2 * kMiB);
  EXPECT_EQ(state_.copies[3].length, 1 * kMiB);
}

TEST_F(CopyExecutorTest, WithoutMergingEveryRequestIsIssuedAtOnce) {
  auto exec = Make(0);
  CopyQueue q;
  ASSERT_TRUE(exec->Submit(q, Req(1, 0, 0, kMiB)).ok());
  exec->SealFull(q, Done());
  EXPECT_EQ(state_.copies.size(), 1u);
  ASSERT_TRUE(exec->Submit(q, Req(2, kMiB, kMiB, kMiB)).ok());
  exec->SealFull(q, Done());
  EXPECT_EQ(state_.copies.size(), 2u);
  exec->SealRound(q, Done());
  EXPECT_EQ(state_.copies.size(), 2u);
}

TEST_F(CopyExecutorTest, ARefusedMergedCopyFailsEveryRequestInIt) {
  auto exec = Make(64 * kMiB);
  CopyQueue q;
  ASSERT_TRUE(exec->Submit(q, Req(1, 0, 0, kMiB)).ok());
  ASSERT_TRUE(exec->Submit(q, Req(2, kMiB, kMiB, kMiB)).ok());
  state_.refuse_copies = true;
  exec->SealRound(q, Done());
  ASSERT_EQ(done_.size(), 2u);
  EXPECT_EQ(done_[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(done_[2].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.pending(), 0u);
  EXPECT_EQ(q.gpu_bytes(), 0u);
}

TEST_F(CopyExecutorTest, CopiesRunningKeepANotifyWaitingUntilTheyComplete) {
  auto exec = Make(64 * kMiB);
  CopyQueue q;
  ASSERT_TRUE(exec->Submit(q, Req(1, 0, 0, kMiB)).ok());
  uint64_t fence = CopyExecutor::LastSeq(q);
  state_.events_pending = true;
  exec->SealRound(q, Done());
  EXPECT_FALSE(exec->PollGpu(q, Done()));
  EXPECT_TRUE(q.HasRunningUpTo(fence));
  state_.events_pending = false;
  EXPECT_TRUE(exec->PollGpu(q, Done()));
  EXPECT_FALSE(q.HasRunningUpTo(fence));
  EXPECT_TRUE(done_[1].ok());
}

TEST_F(CopyExecutorTest, DrainForgetsUnissuedCopies) {
  auto exec = Make(64 * kMiB);
  CopyQueue q;
  ASSERT_TRUE(exec->Submit(q, Req(1, 0, 0, kMiB)).ok());
  exec->Drain(q);
  EXPECT_EQ(q.pending(), 0u);
  EXPECT_EQ(q.gpu_bytes(), 0u);
  exec->SealRound(q, Done());
  EXPECT_TRUE(state_.copies.empty());
  EXPECT_TRUE(done_.empty());
}

}  // namespace
}  // namespace podlink
