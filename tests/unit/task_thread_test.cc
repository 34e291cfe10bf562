// The importer's two-hop thread (daemon/mesh/importer/task_thread.h), without an engine.
#include "daemon/mesh/importer/task_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace podlink::mesh {
namespace {

TEST(TaskThread, RefusesTasksUntilStartedAndAfterStopping) {
  TaskThread t;
  EXPECT_FALSE(t.Post([] {})) << "not started (mesh.two_hop_stripe off): the caller runs it";
  t.Start();
  absl::Notification ran;
  EXPECT_TRUE(t.Post([&] { ran.Notify(); }));
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  t.Stop();
  EXPECT_FALSE(t.Post([] {})) << "stopped";
  t.Start();
  EXPECT_FALSE(t.Post([] {})) << "a stopped thread does not start again";
  t.Stop();  // idempotent
}

TEST(TaskThread, RunsTasksOneAtATimeInOrderOnItsOwnThread) {
  TaskThread t;
  t.Start();
  absl::Mutex mu;
  std::vector<int> order;
  std::thread::id ran_on;
  std::atomic<int> inside{0}, most{0};
  absl::Notification gate;
  ASSERT_TRUE(t.Post([&] { gate.WaitForNotification(); }));  // the rest queue up behind this one
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(t.Post([&, i] {
      int now = inside.fetch_add(1) + 1;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      absl::MutexLock l(&mu);
      order.push_back(i);
      ran_on = std::this_thread::get_id();
      inside.fetch_sub(1);
    }));
  }
  gate.Notify();
  t.Stop();  // runs what is queued, then joins
  ASSERT_EQ(order.size(), 100u) << "tasks queued before the stop all run";
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(most.load(), 1) << "never two at once";
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(TaskThread, ATaskPostedWhileStoppingIsRefusedAndTheStopEnds) {
  // A striped transfer whose end is posted from a task once the engine is
  // stopping runs it where it is (importer/transfer.cc): Post says false,
  // and the stop still ends (what was queued before it ran).
  TaskThread t;
  t.Start();
  absl::Notification started;
  std::atomic<bool> refused{false};
  ASSERT_TRUE(t.Post([&] {
    started.Notify();
    // Until the stop below takes effect (bounded: 10 s), each Post queues one more task.
    for (int i = 0; i < 10000 && !refused; ++i) {
      if (!t.Post([] {})) refused = true;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }));
  started.WaitForNotification();
  t.Stop();
  EXPECT_TRUE(refused.load());
}

}  // namespace
}  // namespace podlink::mesh
