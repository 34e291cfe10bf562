// The relay's stager (daemon/relay/mesh_stager.h) without a GPU: jobs run
// side by side on its threads, buffers are whole MiB and reused up to the
// kept bound, a buffer outliving the stager is freed safely, and queued jobs
// are dropped (never run) when it goes.
#include "daemon/relay/mesh_stager.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace podlink {
namespace {

TEST(MeshStager, JobsRunSideBySide) {
  MeshStager s(4, 8 << 20);
  std::atomic<int> inside{0}, most{0}, done{0};
  absl::Notification all;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(s.Post([&] {
      int now = ++inside;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      --inside;
      if (++done == 8) all.Notify();
    }));
  }
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(most.load(), 2) << "a copy waiting for the GPU must not hold up the others";
  EXPECT_LE(most.load(), 4);
}

TEST(MeshStager, BuffersAreWholeMiBAndReused) {
  MeshStager s(1, 4 << 20);
  char* first = nullptr;
  {
    std::shared_ptr<char[]> b = s.Buffer(3 << 20);  // rounds up to 3 MiB
    ASSERT_NE(b, nullptr);
    first = b.get();
    b[(3 << 20) - 1] = 1;  // the whole size is there
  }
  std::shared_ptr<char[]> again = s.Buffer((3 << 20) - 100);
  EXPECT_EQ(again.get(), first) << "a freed buffer of the same size is used again";
  std::shared_ptr<char[]> other = s.Buffer(1);
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other.get(), first);
  // More than the kept bound goes back to the allocator (no unbounded pool).
  std::vector<std::shared_ptr<char[]>> many;
  for (int i = 0; i < 8; ++i) many.push_back(s.Buffer(1 << 20));
  many.clear();  // 4 MiB kept at most; the rest freed (ASan would see a leak otherwise)
}

TEST(MeshStager, ABufferMayOutliveItsStager) {
  std::shared_ptr<char[]> kept;
  {
    MeshStager s(1, 4 << 20);
    kept = s.Buffer(1 << 20);
    ASSERT_NE(kept, nullptr);
  }
  kept[0] = 7;
  kept.reset();  // returns to a pool the stager no longer owns: freed with it
}

TEST(MeshStager, QueuedJobsAreDroppedWhenItStops) {
  std::atomic<int> ran{0};
  absl::Notification started, release;
  std::thread let_go;
  {
    MeshStager s(1, 0);
    ASSERT_TRUE(s.Post([&] {
      started.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(10));
      ++ran;
    }));
    ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(s.Post([&] { ++ran; }));
    EXPECT_EQ(s.queued(), 5u);
    let_go = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      release.Notify();
    });
  }  // waits for the running job, drops the five
  let_go.join();
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace podlink
