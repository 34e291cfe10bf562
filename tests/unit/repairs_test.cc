// Repairs of failed paths (daemon/mesh/control/repairs.h), without an engine, sockets or queue pairs: which
// failures queue a repair, the backoff after a failed one, what is dropped, the bound, and stopping.
#include "daemon/mesh/control/repairs.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace podlink::mesh {
namespace {

// A link set whose paths are up as the test says.
class FakeLinks final : public DataLinks {
 public:
  explicit FakeLinks(bool whole_path) : whole_path_(whole_path) {}
  const char* transport() const override { return "fake"; }
  uint64_t instance() const override { return 1; }
  absl::Status Submit(LinkOp) override { return absl::UnimplementedError("fake"); }
  size_t live() const override { return live_.load(); }
  LinkStats Stats() const override { return {}; }
  std::vector<std::tuple<std::string, bool, uint64_t>> Connections() const override { return {}; }
  bool RepairsWholePath() const override { return whole_path_; }

  std::atomic<size_t> live_{1};

 private:
  const bool whole_path_;
};

Path PathTo(const std::string& remote) {
  Path p;
  p.local = *IpPrefix::Parse("10.0.0.1/24");
  p.remote = *IpPrefix::Parse(remote + "/24");
  return p;
}

const std::vector<Path> kPaths = {PathTo("10.0.0.2"), PathTo("10.0.0.3")};

// Calls of a Redo, as they happened.
struct Calls {
  absl::Mutex mu;
  std::vector<std::pair<std::string, absl::Time>> seen ABSL_GUARDED_BY(mu);
  size_t count() {
    absl::MutexLock l(&mu);
    return seen.size();
  }
  // Waits (10 s at most) for `n` calls.
  bool WaitFor(size_t n) {
    absl::MutexLock l(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return seen.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
};

Repairs::Redo Recording(Calls& calls, absl::Status answer) {
  return [&calls, answer](const Path&, const std::string& name) {
    absl::MutexLock l(&calls.mu);
    calls.seen.emplace_back(name, absl::Now());
    return answer;
  };
}

Repairs::Timing Fast() {
  return Repairs::Timing{.first = absl::Milliseconds(20), .most = absl::Milliseconds(80),
                         .tick = absl::Milliseconds(10), .max_queued = 8};
}

TEST(Repairs, AFailedPathOfTheLinkSetIsRepairedOnceAndCounted) {
  Repairs repairs(Fast());
  repairs.Start();
  auto links = std::make_shared<FakeLinks>(false);
  Calls calls;
  auto on_down = repairs.OnDown(links, Recording(calls, absl::OkStatus()), kPaths);
  on_down("10.0.0.9->10.0.0.8");  // not one of its paths
  on_down(PathName(kPaths[1]));
  ASSERT_TRUE(calls.WaitFor(1));
  absl::SleepFor(absl::Milliseconds(100));  // nothing more comes
  absl::MutexLock l(&calls.mu);
  ASSERT_EQ(calls.seen.size(), 1u);
  EXPECT_EQ(calls.seen[0].first, PathName(kPaths[1]));
  EXPECT_EQ(repairs.repaired(), 1u);
  EXPECT_EQ(repairs.queued(), 0u);
}

TEST(Repairs, AFailedRepairIsTriedAgainAfterABackoffThatDoublesUpToItsMost) {
  Repairs repairs(Fast());
  auto links = std::make_shared<FakeLinks>(false);
  Calls calls;
  const absl::Time failed = absl::Now();
  repairs.Start();
  repairs.OnDown(links, Recording(calls, absl::UnavailableError("cable down")), kPaths)(PathName(kPaths[0]));
  ASSERT_TRUE(calls.WaitFor(5));
  repairs.Stop();
  repairs.Join();
  EXPECT_EQ(repairs.repaired(), 0u);
  absl::MutexLock l(&calls.mu);
  // Never earlier than the backoff says (a slow machine only makes the gaps longer): 20 ms after the failure,
  // then 40, 80, 80 after each failed try.
  const absl::Duration want[] = {absl::Milliseconds(20), absl::Milliseconds(40), absl::Milliseconds(80),
                                 absl::Milliseconds(80)};
  EXPECT_GE(calls.seen[0].second - failed, want[0]);
  for (size_t i = 1; i < 5; ++i) {
    EXPECT_GE(calls.seen[i].second - calls.seen[i - 1].second, want[i - 1]) << "try " << i;
  }
}

TEST(Repairs, ALinkSetGoneOrWithNothingUpIsNotRepaired) {
  Repairs repairs(Fast());
  repairs.Start();
  Calls calls;
  auto gone = std::make_shared<FakeLinks>(false);
  auto on_gone = repairs.OnDown(gone, Recording(calls, absl::OkStatus()), kPaths);
  auto down = std::make_shared<FakeLinks>(false);
  down->live_ = 0;  // the whole peer is down: its next open dials it again
  auto on_down = repairs.OnDown(down, Recording(calls, absl::OkStatus()), kPaths);
  on_gone(PathName(kPaths[0]));
  gone.reset();
  on_down(PathName(kPaths[0]));
  // Both are taken from the queue when due and dropped.
  for (int i = 0; i < 500 && repairs.queued() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(repairs.queued(), 0u);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(calls.count(), 0u);
  EXPECT_EQ(repairs.repaired(), 0u);
}

TEST(Repairs, AWholePathRepairIsQueuedOncePerPathAndAConnectionRepairOncePerConnection) {
  Repairs::Timing slow = Fast();
  slow.first = absl::Hours(1);  // nothing comes due in this test
  Repairs repairs(slow);
  repairs.Start();
  Calls calls;
  auto verbs_like = std::make_shared<FakeLinks>(true);
  auto on_verbs = repairs.OnDown(verbs_like, Recording(calls, absl::OkStatus()), kPaths);
  on_verbs(PathName(kPaths[0]));
  on_verbs(PathName(kPaths[0]));  // a second QP of the same path
  on_verbs(PathName(kPaths[1]));
  EXPECT_EQ(repairs.queued(), 2u);
  auto other_verbs = std::make_shared<FakeLinks>(true);  // another peer's links over the same path name
  repairs.OnDown(other_verbs, Recording(calls, absl::OkStatus()), kPaths)(PathName(kPaths[0]));
  EXPECT_EQ(repairs.queued(), 3u);
  auto tcp_like = std::make_shared<FakeLinks>(false);
  auto on_tcp = repairs.OnDown(tcp_like, Recording(calls, absl::OkStatus()), kPaths);
  on_tcp(PathName(kPaths[0]));
  on_tcp(PathName(kPaths[0]));  // two connections of the path failed
  EXPECT_EQ(repairs.queued(), 5u);
  EXPECT_EQ(calls.count(), 0u);
}

TEST(Repairs, AtMostMaxQueuedWait) {
  Repairs::Timing slow = Fast();
  slow.first = absl::Hours(1);
  Repairs repairs(slow);
  repairs.Start();
  Calls calls;
  auto links = std::make_shared<FakeLinks>(false);
  auto on_down = repairs.OnDown(links, Recording(calls, absl::OkStatus()), kPaths);
  for (int i = 0; i < 100; ++i) on_down(PathName(kPaths[i % 2]));
  EXPECT_EQ(repairs.queued(), slow.max_queued);
}

TEST(Repairs, StopDropsWhatIsQueuedQueuesNothingMoreAndJoinWaitsForTheRepairRunning) {
  Repairs::Timing t = Fast();
  t.first = absl::Milliseconds(1);
  Repairs repairs(t);
  repairs.Start();
  auto links = std::make_shared<FakeLinks>(false);
  absl::Notification running, release;
  std::atomic<int> ran{0}, finished{0};
  Repairs::Redo blocking = [&](const Path&, const std::string&) {
    ++ran;
    running.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(10));
    ++finished;
    return absl::OkStatus();
  };
  auto on_down = repairs.OnDown(links, blocking, kPaths);
  on_down(PathName(kPaths[0]));
  ASSERT_TRUE(running.WaitForNotificationWithTimeout(absl::Seconds(10)));
  on_down(PathName(kPaths[1]));  // queued while the first runs
  EXPECT_EQ(repairs.queued(), 1u);
  repairs.Stop();
  EXPECT_EQ(repairs.queued(), 0u);
  on_down(PathName(kPaths[1]));
  EXPECT_EQ(repairs.queued(), 0u) << "nothing is queued once stopping";
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    release.Notify();
  });
  repairs.Join();
  EXPECT_EQ(finished.load(), 1) << "Join returned before the running repair ended";
  EXPECT_EQ(ran.load(), 1);
  releaser.join();
}

}  // namespace
}  // namespace podlink::mesh
