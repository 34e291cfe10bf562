// Thousands of export/import/exit cycles leave podlinkd's descriptor count
// and memory flat.
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

int SettledFds(const Daemon& d, int expect) {
  int n = d.OpenFds();
  for (int i = 0; i < 200 && n != expect; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = d.OpenFds();
  }
  return n;
}

// Whether this build (the daemon's too) has AddressSanitizer: GCC says so with __SANITIZE_ADDRESS__, clang 14
// only through __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define PODLINK_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PODLINK_TEST_ASAN 1
#endif
#endif

// Under ASan RSS says nothing (below) and LeakSanitizer checks the heap at the
// daemon's exit, so fewer cycles show a descriptor leaked per cycle as well.
#ifndef PODLINK_TEST_ASAN
constexpr int kWarm = 300, kCycles = 3000;
#else
constexpr int kWarm = 100, kCycles = 500;
#endif

TEST(Leaks, ThousandsOfCyclesLeaveTheDaemonFlat) {
  Daemon d("{}");
  PodCgroup cg(RandomPodUid(), "besteffort");
  // Warm up allocator pools and gRPC's thread pool.
  {
    Pod warm(d, &cg, {"cycle", "--count", std::to_string(kWarm), "--size", "65536"});
    ASSERT_EQ(warm.Expect("cycled", 120000)["count"], kWarm);
    warm.Wait();
  }
  int fds0 = SettledFds(d, -1);
  long rss0 = d.RssKb();
  // kCycles cycles: each opens two sessions, exports, imports, maps, and the
  // exporter disappears without releasing.
  {
    Pod p(d, &cg, {"cycle", "--count", std::to_string(kCycles), "--size", "65536"});
    ASSERT_EQ(p.Expect("cycled", 300000)["count"], kCycles);
    EXPECT_EQ(p.Wait(), 0);
  }
  // 100 real processes that export and are SIGKILLed.
  for (int i = 0; i < 100; ++i) {
    Pod p(d, &cg, {"export", "--size", "65536", "--commands"});
    ASSERT_EQ(p.Expect("exported")["event"], "exported");
    p.Kill(SIGKILL);
    p.Wait();
  }
  int fds1 = SettledFds(d, fds0);
  long rss1 = d.RssKb();
  std::cout << "podlinkd fds " << fds0 << " -> " << fds1 << ", rss " << rss0 << " KiB -> " << rss1 << " KiB\n";
  EXPECT_EQ(fds1, fds0);
  // A leak of one 4 KiB object per cycle would add > 12 MiB.
#ifndef PODLINK_TEST_ASAN
  EXPECT_LT(rss1 - rss0, 4096) << "RSS grew by " << (rss1 - rss0) << " KiB";
#else
  // ASan's quarantine holds freed memory back: RSS says nothing there, and
  // LeakSanitizer checks the daemon's heap at its exit instead.
#endif
}

}  // namespace
}  // namespace podlink::testing
