// The slice scheduler every mesh transport shares (daemon/mesh/links/slices.h),
// without sockets or queue pairs: cutting, path preference, resending and the
// attempt limit, the first error, and the DONE record ending an op one of
// whose slices went out twice. Then the TCP links driven through it over
// socketpairs, the test playing the owner: a connection that dies holding
// slices hands them to another, and the op ends with DONE. Last, one write
// through each transport's links (TCP, and verbs over the fake fabric of
// tests/fakes/), each losing a carrier mid-write: the same scheduler moves
// the slices and every byte lands. (More of verbs in verbs_fake_test.)
#include "daemon/mesh/links/slices.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "daemon/mesh/links/nic_rank.h"
#include "daemon/mesh/tcp/tcp_link.h"
#include "daemon/mesh/verbs/verbs_link.h"
#include "daemon/mesh/links/wire.h"
#include "gtest/gtest.h"
#include "tests/fakes/verbs_owner.h"

namespace podlink::mesh {
namespace {

// A scheduler over a lock of the test's, with what it reported.
struct Rig {
  absl::Mutex mu;
  bool carriers = true;  // what can_queue answers
  std::atomic<int> wakes{0};
  SliceScheduler sched;
  explicit Rig(SliceScheduler::Options o = {})
      : sched(&mu, o, [this] { return carriers; }, [this] { ++wakes; }, "nothing carries it") {}

  // An op of `length` bytes whose `done` lands in *result (and counts).
  std::shared_ptr<Transfer> Op(uint64_t length, std::vector<absl::Status>* results,
                               FrameType type = FrameType::kWrite) {
    auto t = std::make_shared<Transfer>();
    t->op.type = type;
    t->op.length = length;
    t->op.done = [results](const absl::Status& st) { results->push_back(st); };
    return t;
  }
  std::optional<Slice> Take() {
    absl::MutexLock l(&mu);
    return sched.Next([](const Slice&) { return SliceScheduler::Verdict::kTake; });
  }
};

TEST(SliceScheduler, CutsAnOpIntoSlicesAndNumbersIt) {
  Rig rig;
  std::vector<absl::Status> results;
  {
    absl::MutexLock l(&rig.mu);
    ASSERT_TRUE(rig.sched.Cut(rig.Op(10 * 1000 + 7, &results), 1000).ok());
    ASSERT_TRUE(rig.sched.Cut(rig.Op(0, &results), 1000).ok());  // one empty slice where allowed
    ASSERT_TRUE(rig.sched.Cut(rig.Op(5000, &results, FrameType::kNotify), 1000).ok());  // one slice, no bytes
    EXPECT_EQ(rig.sched.queued(), 11u + 1 + 1);
  }
  uint64_t next_offset = 0;
  for (uint32_t i = 0; i < 11; ++i) {
    std::optional<Slice> s = rig.Take();
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->index, i);
    EXPECT_EQ(s->offset, next_offset);
    EXPECT_EQ(s->length, i < 10 ? 1000u : 7u);
    EXPECT_EQ(s->op->slices, 11u);
    EXPECT_EQ(s->op->number, 1u);
    next_offset += s->length;
  }
  std::optional<Slice> empty = rig.Take();
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->length, 0u);
  EXPECT_EQ(empty->op->number, 2u);
  std::optional<Slice> notify = rig.Take();
  ASSERT_TRUE(notify.has_value());
  EXPECT_EQ(notify->length, 0u);
  EXPECT_EQ(notify->op->slices, 1u);
  EXPECT_FALSE(rig.Take().has_value());

  Rig strict(SliceScheduler::Options{.empty_is_one_slice = false});
  absl::MutexLock l(&strict.mu);
  EXPECT_EQ(strict.sched.Cut(strict.Op(0, &results), 1000).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(strict.sched.Cut(strict.Op(uint64_t{1} << 40, &results), 1).code(),
            absl::StatusCode::kInvalidArgument);  // more slices than a tag counts
  EXPECT_EQ(strict.sched.queued(), 0u);
  EXPECT_TRUE(results.empty());
}

TEST(SliceScheduler, ACarrierTakesOnlySlicesItMayCarryAndStopsWhenTold) {
  Rig rig;
  std::vector<absl::Status> results;
  auto near = rig.Op(3000, &results);
  auto pref = std::make_shared<PathPreference>();
  pref->tier = {"a->x"};
  pref->fastest = {"a->x"};
  near->op.prefer = pref;
  {
    absl::MutexLock l(&rig.mu);
    ASSERT_TRUE(rig.sched.Cut(near, 1000).ok());                      // 3 slices for path a->x only
    ASSERT_TRUE(rig.sched.Cut(rig.Op(1000, &results), 1000).ok());   // 1 slice, any path
  }
  const std::set<std::string> up = {"a->x", "b->y"};
  absl::MutexLock l(&rig.mu);
  // Path b->y passes over the preferring op's slices to the one it may carry.
  std::optional<Slice> s = rig.sched.Next([&](const Slice& c) {
    return SliceScheduler::MayCarry(c, "b->y", up) ? SliceScheduler::Verdict::kTake : SliceScheduler::Verdict::kSkip;
  });
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->op->number, 2u);
  // Nothing more for b->y while a->x is up; kStop ends a look at once.
  EXPECT_FALSE(rig.sched
                   .Next([&](const Slice& c) {
                     return SliceScheduler::MayCarry(c, "b->y", up) ? SliceScheduler::Verdict::kTake
                                                                    : SliceScheduler::Verdict::kSkip;
                   })
                   .has_value());
  int looked = 0;
  EXPECT_FALSE(rig.sched
                   .Next([&](const Slice&) {
                     ++looked;
                     return SliceScheduler::Verdict::kStop;
                   })
                   .has_value());
  EXPECT_EQ(looked, 1);
  // With a->x down, b->y may carry them.
  std::optional<Slice> moved = rig.sched.Next([&](const Slice& c) {
    return SliceScheduler::MayCarry(c, "b->y", {"b->y"}) ? SliceScheduler::Verdict::kTake
                                                         : SliceScheduler::Verdict::kSkip;
  });
  ASSERT_TRUE(moved.has_value());
  EXPECT_EQ(moved->op->number, 1u);
  // A DONE record goes anywhere.
  Slice done;
  done.op = near;
  done.done_record = true;
  EXPECT_TRUE(SliceScheduler::MayCarry(done, "b->y", up));
}

// A carrier taking several slices under one hold of the lock (verbs' Pump) looks at a slice it passed over once,
// not again for every slice it takes after it.
TEST(SliceScheduler, SlicesPassedOverInOneRoundAreLookedAtOnce) {
  Rig rig;
  std::vector<absl::Status> results;
  absl::MutexLock l(&rig.mu);
  ASSERT_TRUE(rig.sched.Cut(rig.Op(2000, &results), 1000).ok());  // op 1: passed over
  ASSERT_TRUE(rig.sched.Cut(rig.Op(4000, &results), 1000).ok());  // op 2: taken
  int looks_at_op1 = 0, taken = 0;
  auto choose = [&](const Slice& c) {
    if (c.op->number == 1) {
      ++looks_at_op1;
      return SliceScheduler::Verdict::kSkip;
    }
    return SliceScheduler::Verdict::kTake;
  };
  size_t resume = 0;
  while (rig.sched.Next(choose, &resume).has_value()) ++taken;
  EXPECT_EQ(taken, 4);
  EXPECT_EQ(looks_at_op1, 2) << "each passed-over slice once";
  EXPECT_EQ(rig.sched.queued(), 2u);
  // A new round starts at the front again.
  looks_at_op1 = 0;
  EXPECT_FALSE(rig.sched.Next(choose).has_value());
  EXPECT_EQ(looks_at_op1, 2);
}

TEST(SliceScheduler, AFailedCarriersSlicesGoFirstInLineAtMostMaxAttemptsTimes) {
  Rig rig(SliceScheduler::Options{.max_attempts = 3});
  std::vector<absl::Status> results;
  {
    absl::MutexLock l(&rig.mu);
    ASSERT_TRUE(rig.sched.Cut(rig.Op(2000, &results), 1000).ok());
  }
  std::optional<Slice> first = rig.Take();
  ASSERT_TRUE(first.has_value());
  for (uint32_t sends = 1; sends <= 3; ++sends) {
    SliceScheduler::Sent(*first);
    EXPECT_EQ(first->attempts, sends);
    absl::MutexLock l(&rig.mu);
    const bool again = rig.sched.Resend(*first, /*mark_resent=*/true, /*nothing_left=*/false);
    EXPECT_EQ(again, sends < 3) << sends;
    if (!again) break;
    first = rig.sched.Next([](const Slice&) { return SliceScheduler::Verdict::kTake; });
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->index, 0u);  // ahead of slice 1, queued all along
  }
  EXPECT_TRUE(first->op->resent.load());
  absl::MutexLock l(&rig.mu);
  std::vector<Slice> rest = rig.sched.TakeAll();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].index, 1u);
  // Nothing left to carry it: not queued, whatever its attempts.
  Slice fresh = rest[0];
  EXPECT_FALSE(rig.sched.Resend(fresh, true, /*nothing_left=*/true));
  EXPECT_EQ(rig.sched.queued(), 0u);
}

TEST(SliceScheduler, TheFirstErrorIsTheOpsAndItIsReportedOnce) {
  Rig rig;
  std::vector<absl::Status> results;
  {
    absl::MutexLock l(&rig.mu);
    ASSERT_TRUE(rig.sched.Cut(rig.Op(3000, &results), 1000).ok());
  }
  std::vector<Slice> slices;
  for (int i = 0; i < 3; ++i) slices.push_back(*rig.Take());
  rig.sched.Settle(slices[1], absl::PermissionDeniedError("first"));
  rig.sched.Settle(slices[0], absl::UnavailableError("second"));
  EXPECT_TRUE(results.empty());
  rig.sched.Settle(slices[2], absl::OkStatus());
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(results[0].message(), "first");
  EXPECT_EQ(rig.wakes.load(), 0);
}

TEST(SliceScheduler, AnOpWithAResentSliceEndsWithADoneRecordBeforeItIsReported) {
  Rig rig;
  std::vector<absl::Status> results;
  {
    absl::MutexLock l(&rig.mu);
    ASSERT_TRUE(rig.sched.Cut(rig.Op(2000, &results), 1000).ok());
  }
  Slice a = *rig.Take();
  Slice b = *rig.Take();
  SliceScheduler::Sent(a);
  {
    absl::MutexLock l(&rig.mu);
    ASSERT_TRUE(rig.sched.Resend(a, /*mark_resent=*/true, false));
  }
  a = *rig.Take();
  rig.sched.Settle(a, absl::OkStatus());
  rig.sched.Settle(b, absl::OkStatus());
  EXPECT_TRUE(results.empty()) << "reported before the DONE record was answered";
  EXPECT_EQ(rig.wakes.load(), 1);
  std::optional<Slice> done = rig.Take();
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->done_record);
  EXPECT_EQ(done->op, a.op);
  rig.sched.Settle(*done, absl::OkStatus());
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].ok());
  EXPECT_FALSE(rig.Take().has_value()) << "one DONE record only";
}

TEST(SliceScheduler, WhereNothingCanCarryTheDoneRecordTheOpFailsUnavailable) {
  Rig rig;
  std::vector<absl::Status> results;
  {
    absl::MutexLock l(&rig.mu);
    ASSERT_TRUE(rig.sched.Cut(rig.Op(1000, &results), 1000).ok());
  }
  Slice a = *rig.Take();
  a.op->resent.store(true);
  rig.carriers = false;
  rig.sched.Settle(a, absl::OkStatus());
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(results[0].message(), "nothing carries it");
  EXPECT_EQ(rig.wakes.load(), 0);
}

TEST(SliceScheduler, AFailedOpEndsWithDoneOnlyWhereTheTransportAsksForIt) {
  for (bool after_failure : {false, true}) {
    Rig rig(SliceScheduler::Options{.done_after_failure = after_failure});
    std::vector<absl::Status> results;
    {
      absl::MutexLock l(&rig.mu);
      ASSERT_TRUE(rig.sched.Cut(rig.Op(1000, &results), 1000).ok());
    }
    Slice a = *rig.Take();
    a.op->resent.store(true);
    rig.sched.Settle(a, absl::DataLossError("refused"));
    if (after_failure) {
      EXPECT_TRUE(results.empty());
      std::optional<Slice> done = rig.Take();
      ASSERT_TRUE(done.has_value());
      EXPECT_TRUE(done->done_record);
      rig.sched.Settle(*done, absl::OkStatus());
    }
    ASSERT_EQ(results.size(), 1u) << after_failure;
    EXPECT_EQ(results[0].code(), absl::StatusCode::kDataLoss) << "the op keeps its own error";
  }
}

TEST(SliceScheduler, SlicesSettledFromManyThreadsReportTheOpOnce) {
  Rig rig;
  std::atomic<int> reports{0};
  auto t = std::make_shared<Transfer>();
  t->op.length = 64 * 1000;
  t->op.done = [&](const absl::Status& st) {
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
    ++reports;
  };
  {
    absl::MutexLock l(&rig.mu);
    ASSERT_TRUE(rig.sched.Cut(t, 1000).ok());
  }
  t.reset();
  std::vector<Slice> slices;
  while (std::optional<Slice> s = rig.Take()) slices.push_back(*std::move(s));
  ASSERT_EQ(slices.size(), 64u);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (size_t i = k; i < slices.size(); i += 4) {
        rig.sched.Settle(slices[i], i == 17 ? absl::AbortedError("one") : absl::OkStatus());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(reports.load(), 1);
}

// --- the TCP links through the scheduler, the test playing the owner --------

struct Socketpair {
  UniqueFd mine, theirs;
  Socketpair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    mine.Reset(fds[0]);
    theirs.Reset(fds[1]);
    // The test's reads give up after 10 s (ReadFull: UNAVAILABLE), never hang.
    timeval tv{10, 0};
    EXPECT_EQ(::setsockopt(theirs.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
  }
};

// A write of `src` to grant 9 at offset 0 whose end lands in *result and notifies *finished.
LinkOp WriteOf(std::vector<char>& src, absl::Status* result, absl::Notification* finished) {
  LinkOp op;
  op.type = FrameType::kWrite;
  op.grant = 9;
  op.length = src.size();
  op.local = src.data();
  op.done = [result, finished](const absl::Status& st) {
    *result = st;
    finished->Notify();
  };
  return op;
}

TEST(TcpLinksThroughTheScheduler, ADeadConnectionsSlicesGoToAnotherAndTheWriteEndsWithDone) {
  constexpr uint64_t kSlice = 4096;
  constexpr uint32_t kSlices = 4;
  PeerLinks links("owner", kSlice, /*slices_in_flight=*/kSlices, absl::Seconds(30));
  Socketpair dying, living;
  links.AddConnection(std::move(dying.mine), "a->x");
  std::vector<char> src = verbs::Pattern(kSlice * kSlices, 1);
  absl::Notification finished;
  absl::Status result;
  ASSERT_TRUE(links.Submit(WriteOf(src, &result, &finished)).ok());
  // The first connection takes every slice (4 may be in flight) and dies
  // without answering.
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < kSlices; ++i) {
    FrameHeader h;
    ASSERT_TRUE(ReadFull(dying.theirs.get(), &h, sizeof(h)).ok());
    ASSERT_EQ(static_cast<FrameType>(h.type), FrameType::kWrite);
    std::vector<char> payload(h.length);
    ASSERT_TRUE(ReadFull(dying.theirs.get(), payload.data(), payload.size()).ok());
    seen.insert(static_cast<uint32_t>(h.tag));
  }
  EXPECT_EQ(seen.size(), kSlices);
  links.AddConnection(std::move(living.mine), "a->x");
  dying.theirs.Reset();
  // The second connection carries them again, byte for byte; the owner answers.
  std::vector<char> landed(src.size());
  uint32_t transfer = 0;
  for (uint32_t i = 0; i < kSlices; ++i) {
    FrameHeader h;
    ASSERT_TRUE(ReadFull(living.theirs.get(), &h, sizeof(h)).ok());
    ASSERT_EQ(static_cast<FrameType>(h.type), FrameType::kWrite);
    ASSERT_LE(h.offset + h.length, landed.size());
    ASSERT_TRUE(ReadFull(living.theirs.get(), landed.data() + h.offset, h.length).ok());
    transfer = TransferOfTag(h.tag);
    FrameHeader ack{};
    ack.magic = kFrameMagic;
    ack.type = static_cast<uint16_t>(FrameType::kAck);
    ack.tag = h.tag;
    ASSERT_TRUE(WriteFrame(living.theirs.get(), ack, nullptr, 0).ok());
  }
  EXPECT_EQ(landed, src);
  // Then DONE, before the write is reported.
  FrameHeader done;
  ASSERT_TRUE(ReadFull(living.theirs.get(), &done, sizeof(done)).ok());
  EXPECT_EQ(static_cast<FrameType>(done.type), FrameType::kDone);
  EXPECT_EQ(TransferOfTag(done.tag), transfer);
  EXPECT_FALSE(finished.HasBeenNotified());
  FrameHeader ack{};
  ack.magic = kFrameMagic;
  ack.type = static_cast<uint16_t>(FrameType::kAck);
  ack.tag = done.tag;
  ASSERT_TRUE(WriteFrame(living.theirs.get(), ack, nullptr, 0).ok());
  ASSERT_TRUE(finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(links.Stats().resent_slices, kSlices);
}

// --- one write through each transport --------------------------------------------

// A TCP owner on socketpairs: lands WRITE frames in `region` and answers every frame, except that a connection
// made `dying` is closed unanswered at its `die_at`th frame. Until a dying connection has died, the others answer
// nothing: with their windows full, the scheduler must hand the dying one its frames, however the threads run
// (else a fast healthy connection could take every slice and the dying one never die).
class TcpOwner {
 public:
  explicit TcpOwner(std::vector<char>* region) : region_(region) {}
  ~TcpOwner() {
    for (std::thread& t : threads_) t.join();
  }
  // What landed, read under the lock the serving threads write under (a socket is no ordering ThreadSanitizer sees).
  std::vector<char> Landed() {
    std::lock_guard<std::mutex> l(mu_);
    return *region_;
  }
  UniqueFd Connection(bool dying, int die_at) {
    if (dying) has_dying_ = true;
    Socketpair p;
    threads_.emplace_back(
        [this, fd = std::move(p.theirs), dying, die_at]() mutable { Serve(std::move(fd), dying, die_at); });
    return std::move(p.mine);
  }

 private:
  void Serve(UniqueFd fd, bool dying, int die_at) {
    for (int frames = 1;; ++frames) {
      FrameHeader h;
      if (!ReadFull(fd.get(), &h, sizeof(h)).ok()) return;  // the links closed it, or 10 s passed
      std::vector<char> payload(h.length);
      if (h.length > 0 && !ReadFull(fd.get(), payload.data(), payload.size()).ok()) return;
      if (dying && frames == die_at) {
        died_.Notify();
        return;  // closed with this frame and those before it in flight unanswered
      }
      if (!dying && frames == 1 && has_dying_) died_.WaitForNotificationWithTimeout(absl::Seconds(10));
      FrameHeader ack{};
      ack.magic = kFrameMagic;
      ack.type = static_cast<uint16_t>(FrameType::kAck);
      ack.tag = h.tag;
      if (static_cast<FrameType>(h.type) == FrameType::kWrite) {
        std::lock_guard<std::mutex> l(mu_);
        if (h.offset > region_->size() || h.length > region_->size() - h.offset) {
          ack.status = static_cast<int32_t>(absl::StatusCode::kOutOfRange);
        } else {
          std::memcpy(region_->data() + h.offset, payload.data(), payload.size());
        }
      }
      if (!WriteFrame(fd.get(), ack, nullptr, 0).ok()) return;
    }
  }
  std::vector<char>* const region_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
  std::atomic<bool> has_dying_{false};
  absl::Notification died_;
};

// Writes `src` to grant 9 at offset 0 through `links`, as the engine submits an op.
absl::Status WriteThrough(DataLinks& links, std::vector<char>& src) {
  absl::Notification finished;
  absl::Status result;
  PODLINK_RETURN_IF_ERROR(links.Submit(WriteOf(src, &result, &finished)));
  if (!finished.WaitForNotificationWithTimeout(absl::Seconds(30))) return absl::DeadlineExceededError("not finished");
  return result;
}

TEST(BothTransportsThroughTheScheduler, ACarrierDyingMidWriteCostsNoByteOnEither) {
  {
    SCOPED_TRACE("tcp");
    std::vector<char> src = verbs::Pattern(4 << 20, 5);  // 64 slices: the dying connection takes three (TcpOwner)
    std::vector<char> region(src.size());
    TcpOwner owner(&region);
    auto links = std::make_unique<PeerLinks>("owner", 64 << 10, /*slices_in_flight=*/4, absl::Seconds(30));
    links->AddConnection(owner.Connection(/*dying=*/true, /*die_at=*/3), "a->x");
    links->AddConnection(owner.Connection(/*dying=*/false, 0), "a->x");
    absl::Status st = WriteThrough(*links, src);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_TRUE(owner.Landed() == src) << "bytes lost or misplaced over TCP";
    const LinkStats stats = links->Stats();
    EXPECT_EQ(stats.connection_failures, 1u);
    EXPECT_GE(stats.resent_slices, 1u);
    EXPECT_EQ(links->live(), 1u);
    links.reset();  // closes the living connection: its owner thread ends
  }
  {
    SCOPED_TRACE("verbs");
    std::vector<char> src = verbs::Pattern(1 << 20, 6);  // the fake owner's whole region: 16 slices
    verbs::FakeVerbsOwner owner;
    std::unique_ptr<verbs::VerbsLinks> links = owner.Connect("node-a");
    links->AddRegion(9, owner.Register("node-a", 9));
    {
      std::lock_guard<std::recursive_mutex> l(verbs::fabric->mu);
      verbs::fabric->qps.at(owner.QpsOf(*links).front())->fail_after = 3;
    }
    absl::Status st = WriteThrough(*links, src);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(0, std::memcmp(owner.region_.data(), src.data(), src.size())) << "bytes lost or misplaced over verbs";
    const LinkStats stats = links->Stats();
    EXPECT_EQ(stats.connection_failures, 1u);
    EXPECT_GE(stats.resent_slices, 1u);
    EXPECT_EQ(links->live(), 1u);
  }
}

}  // namespace
}  // namespace podlink::mesh
