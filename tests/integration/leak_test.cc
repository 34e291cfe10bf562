// Thousands of export/import/exit cycles leave podlinkd's descriptor count
// and memory flat.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
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

// A test process killed by a signal (ctest's timeout) takes its podlinkd with it: none is left running, holding
// its port and cgroups, for the tests after it.
TEST(Leaks, ADaemonDiesWithTheTestProcessThatStartedIt) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t test = ::fork();
  ASSERT_GE(test, 0);
  if (test == 0) {  // the "test process": starts a daemon, says its pid, waits to be killed
    ::close(fds[0]);
    Daemon d("{}");
    pid_t daemon = d.pid();
    (void)!::write(fds[1], &daemon, sizeof(daemon));
    for (;;) ::pause();
  }
  ::close(fds[1]);
  pid_t daemon = -1;
  ASSERT_EQ(::read(fds[0], &daemon, sizeof(daemon)), static_cast<ssize_t>(sizeof(daemon)));
  ::close(fds[0]);
  ASSERT_GT(daemon, 0);
  ::kill(test, SIGKILL);
  ASSERT_EQ(::waitpid(test, nullptr, 0), test);
  // Gone, or a zombie no one reaps (its parent is gone; the reaper here may not be a real init).
  auto gone = [daemon] {
    std::ifstream stat("/proc/" + std::to_string(daemon) + "/stat");
    std::string pid, comm, state;
    return !(stat >> pid >> comm >> state) || state == "Z" || state == "X";
  };
  bool dead = false;
  for (int i = 0; i < 500 && !(dead = gone()); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!dead) ::kill(daemon, SIGKILL);  // not left behind by this test either
  EXPECT_TRUE(dead) << "podlinkd " << daemon << " outlived the test process that started it";
}

}  // namespace
}  // namespace podlink::testing
